"""Lookahead decoding (common.decoders.lookahead): the window's attention is Jacobi decoding of
each column's own sequence, the pool keeps n-grams as the authors' LRU does, the trie merges
guesses, bad settings end in one error line. Exactness against vanilla is the shared
lossless test's (tests/decoders/test_core_engine.py, through ``test_configs``)."""
from types import SimpleNamespace

import pytest
import torch

from common.decoders import get_decoder
from common.decoders.lookahead import LookaheadProposer, token_trie, window_allow
from common.decoders.tree_loop import ProposerState
from common.errors import UserError
from common.engine.target import make_target

PROMPT = [1, 77, 3, 3, 3, 12, 60, 61, 9, 14]


def test_window_allow_is_each_cells_own_sequence():
    allow, offsets = window_allow(3, 4)
    # cell (2, 1): row 0 columns 0..1, then rows 1..2 of column 1
    i = 2 * 4 + 1
    assert allow[i].nonzero().flatten().tolist() == [0, 1, 4 + 1, 8 + 1]
    assert offsets.view(3, 4).tolist() == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]
    # each cell's visible cells sit at distinct consecutive offsets ending at its own
    for j in range(12):
        seen = sorted(offsets[allow[j]].tolist())
        assert seen == list(range(int(offsets[j]) + 1))


def test_window_states_equal_plain_forwards(chaotic_llama, one_thread):
    """Every window cell's final state inside the verification forward equals a plain causal
    forward over the sequence it sees: context, row 0 up to its column, its column below row 0.
    So the injected window is Jacobi decoding, and leaves nothing in the cache."""
    model = chaotic_llama
    prop = LookaheadProposer(model, PROMPT, window=4, ngram=4, guesses=3, seed=0, pool_from_prompt=False)
    prop.rows = [[11, 12, 13], [21, 22, 23, 24], [31, 32, 33, 34]]  # a full window (N - 1 = 3 rows)
    tgt = make_target(model)
    with torch.inference_mode():
        tgt.start(torch.tensor([PROMPT[:-1]]))
        root = PROMPT[-1]
        state = ProposerState(torch.tensor([PROMPT[:-1]]), [root], None, 20, 0.0, None)
        proposal = prop.propose(state)
        before = tgt.length
        _, verified = tgt.verify(torch.tensor([root]), proposal.tree, proposal.injections)
        assert verified.extra_hidden.shape[0] == 3 * 4 - 1
        row0 = [root] + prop.rows[0]
        for r in range(3):
            for c in range(4):
                if r == c == 0:
                    continue
                seq = PROMPT[:-1] + row0[:c + 1] + [prop.rows[k][c] for k in range(1, r + 1)]
                ref = model(torch.tensor([seq])).logits[0, -1]
                got = model.lm_head(verified.extra_hidden[r * 4 + c - 1])
                torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
        tgt.accept(before, torch.tensor([0]))
        assert tgt.length == before + 1  # the window's positions left the cache


def test_pool_update_and_slide(chaotic_llama):
    prop = LookaheadProposer(chaotic_llama, PROMPT, window=3, ngram=3, guesses=2, seed=0, pool_from_prompt=False)
    assert [len(r) for r in prop.rows] == [3]            # W + N - 3: warm-up width
    prop.rows = [[11, 12, 13]]
    prop.root = 10
    # warm-up step: rows drop a column, the last row's predictions become a new row
    # final states whose greedy tokens are known: the tied head's own rows (checked)
    h = chaotic_llama.lm_head.weight.detach()[[40, 41, 42, 43]]
    assert chaotic_llama.lm_head(h).argmax(-1).tolist() == [40, 41, 42, 43]
    res = SimpleNamespace(verified=SimpleNamespace(hidden=h[:1], extra_hidden=h[1:]), accepted=0)
    prop.update(res)
    assert prop.rows == [[12, 13], [41, 42, 43]] and prop.pool == {}
    # full window (N - 1 = 2 rows): one n-gram per column keyed by row 0, then the slide
    prop.root = 20
    h2 = chaotic_llama.lm_head.weight.detach()[[50, 51, 52]]
    res.verified = SimpleNamespace(hidden=h[:1], extra_hidden=torch.cat([h[:2], h2]))
    prop.update(res)
    assert prop.pool == {20: [(41, 50)], 12: [(42, 51)], 13: [(43, 52)]}
    assert prop.rows == [[42, 43], [50, 51, 52]]
    # the LRU: a repeated n-gram moves to the newest end, the oldest leaves when full
    prop._add(20, (1, 2))
    prop._add(20, (41, 50))
    assert prop.pool[20] == [(1, 2), (41, 50)]
    prop._add(20, (3, 4))
    assert prop.pool[20] == [(41, 50), (3, 4)]


def test_token_trie_merges_prefixes():
    tree, toks = token_trie([(5, 6, 7), (5, 6, 8), (9, 1)], max_depth=2)
    assert tree.size == 1 + 4              # 5, 9, 5-6, 9-1 (depth cut at 2)
    assert sorted(zip(tree.depth[1:].tolist(), toks)) == [(1, 5), (1, 9), (2, 1), (2, 6)]
    empty, none = token_trie([])
    assert empty.size == 1 and none == []


def test_guesses_verified_and_counted(chaotic_llama, one_thread):
    out = get_decoder("lookahead", chaotic_llama, window=4, ngram=3, guesses=4,
                      pool_from_prompt=True).generate(torch.tensor([PROMPT]), 24)
    assert out.stats["lookahead_guesses"] > 0
    assert len(out.stats["injected"]) == out.stats["steps"]
    # the one warm-up step (N - 2) carries row 0 alone (W + N - 3 cells after the root); every
    # later step the full window, W * (N - 1) - 1 cells
    assert out.stats["injected"][1] == 4 + 3 - 3
    assert set(out.stats["injected"][2:]) == {4 * 2 - 1}


def test_bad_settings_one_error_line(chaotic_llama):
    with pytest.raises(UserError, match="beyond the model's context of 512; valid: window \\+ ngram <="):
        get_decoder("lookahead", chaotic_llama, window=256, ngram=16).generate(torch.tensor([PROMPT * 30]), 4)
    with pytest.raises(UserError, match="option ngram=1 is invalid; valid: an integer in \\[2, 16\\]"):
        get_decoder("lookahead", chaotic_llama, ngram=1)
    # above temperature 0 lookahead samples through the exact rule for deterministic candidates
    assert get_decoder("lookahead", chaotic_llama, temperature=0.7).rule.name == "target_sampling"
