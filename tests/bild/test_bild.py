"""Big Little Decoder on tiny random models: the exact limits (alpha_RB = 0, alpha_FB = 1),
the rollback rule, the ablation switches, statistics and bad input."""
import pytest
import torch

from bild.decoding import Rollback
from common.decoders import get_decoder
from common.errors import UserError
from common.assets.models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[1, 5, 6, 7, 5, 6], [1, 40, 41, 42, 43], [1, 77, 3, 3, 3, 12, 60, 61]]


def _run(large, small, ids, n=30, **opts):
    return get_decoder("bild", large, small=small, **opts).generate(ids, n)


@pytest.mark.parametrize("opts", [{"rollback_threshold": 0.0}, {"fallback_threshold": 1.0, "rollback_threshold": 50.0},
                                  {"rollback_threshold": 0.0, "fallback": False, "max_small_tokens": 3}])
def test_exact_limits_equal_large_greedy(llama_pair, t5_pair, opts):
    for large, small, prompts in ((*llama_pair, PROMPTS), (*t5_pair, [[5, 6, 7, 8, 9, 10], [40, 41, 42]])):
        for prompt in prompts:
            ids = torch.tensor([prompt])
            ref = get_decoder("vanilla", large).generate(ids, 30).tokens
            out = _run(large, small, ids, **opts)
            assert out.tokens == ref, (type(large).__name__, prompt, opts)
            st = out.stats
            assert len(st["source"]) == len(out.tokens) and st["source"][0] == "large"
            assert st["large_forwards"] == st["steps"] and st["small_forwards"] >= 0


def test_fallback_one_never_keeps_a_small_token(llama_pair):
    out = _run(*llama_pair, torch.tensor([PROMPTS[0]]), fallback_threshold=1.0, rollback_threshold=50.0)
    assert len(out.tokens) == 30 and set(out.stats["source"]) == {"large"}
    # every step falls back, except the prefill and the last (one token left: nothing to draft)
    assert out.stats["fallbacks"] == out.stats["steps"] - 2


def test_without_rollback_small_tokens_stay(llama_pair):
    """A 1-layer random small model disagrees with the large one: without rollback its tokens
    are kept and the output leaves the large model's greedy path; with rollback at 0 it never does."""
    ids = torch.tensor([PROMPTS[1]])
    ref = get_decoder("vanilla", llama_pair[0]).generate(ids, 30).tokens
    loose = _run(*llama_pair, ids, rollback=False, fallback_threshold=0.0, max_small_tokens=4)
    assert loose.stats["rollbacks"] == 0 and loose.stats["source"].count("small") > 10
    assert loose.tokens != ref
    strict = _run(*llama_pair, ids, rollback_threshold=0.0, fallback_threshold=0.0, max_small_tokens=4)
    assert strict.tokens == ref and strict.stats["rollbacks"] > 0


def test_rollback_rule_first_bad_position():
    V = 5
    logits = torch.full((4, V), -10.0)
    logits[0, 1] = logits[1, 2] = logits[2, 4] = logits[3, 0] = 10.0   # large argmax after each node
    logits[1, 3] = 9.0                                                 # token 3 is a close second after node 1
    tokens = torch.tensor([0, 1, 3, 4])                               # root, then small tokens 1, 3, 4
    retrieve = torch.tensor([[0, 1, 2, 3]])
    rule = lambda thr: Rollback(0.0, threshold=thr)                    # noqa: E731
    path, nxt = rule(2.0).evaluate(tokens, logits, retrieve, tokens[1:], None, None)
    assert path.tolist() == [0, 1, 2, 3] and nxt == 0                 # -log p(3) ~ 1.3 < 2: kept
    path, nxt = rule(0.5).evaluate(tokens, logits, retrieve, tokens[1:], None, None)
    assert path.tolist() == [0, 1] and nxt == 2                       # rolled back at the second small token
    path, nxt = rule(0.0).evaluate(tokens, logits, retrieve, tokens[1:], None, None)
    assert path.tolist() == [0, 1] and nxt == 2                       # token 1 is the argmax: never rolled back


def test_bad_input(llama_pair, t5_pair):
    large, small = llama_pair
    cases = [({"fallback_threshold": 1.5}, r"fallback_threshold=1.5 is invalid; valid: a number in \[0.0, 1.0\]"),
             ({"rollback_threshold": -1}, "rollback_threshold=-1 is invalid"),
             ({"max_small_tokens": 0}, "max_small_tokens=0 is invalid"),
             ({"temperature": 0.7}, r"cannot sample \(temperature=0.7; valid: 0\)")]
    for opts, msg in cases:
        with pytest.raises(UserError, match=msg):
            get_decoder("bild", large, small=small, **opts)
    with pytest.raises(UserError, match="needs a draft model"):
        get_decoder("bild", large)
    with pytest.raises(UserError, match="vocabulary size 50 differs"):
        get_decoder("bild", large, small=tiny_llama(seed=2, layers=1, vocab=50))
    with pytest.raises(UserError, match="the draft is a causal model but the target is seq2seq"):
        get_decoder("bild", t5_pair[0], small=small)
