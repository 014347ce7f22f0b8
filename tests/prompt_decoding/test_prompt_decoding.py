"""Prompt decoding's decoder on a tiny random LLaMA: the prompt tokens' positions and mask rows
are what the paper says (checked against a plain causal forward), random prompt embeddings
still decode exactly vanilla's tokens, and bad checkpoints are refused."""
import json

import numpy as np
import pytest
import torch

from decoding_checks import assert_component_checks, assert_exact_and_accepting, assert_training_learns
from common.errors import UserError
from common.engine.forward import embed
from common.engine.target import make_target
from common.training.loop import save_trained
from common.engine.tree import build_tree
from prompt_decoding.decoding import block_rows, new_prompts, node_prompt_injection, prompts_meta
from prompt_decoding.prompt_tokens import ept_allow

PATHS = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def test_ept_masks_follow_appendix_b():
    m, n = 3, 2
    idx = [(j, i) for j in range(m) for i in range(n)]
    for mask, rule in {
        "ensemble": lambda a, b: b[0] <= a[0] and b[1] == a[1],
        "decoder": lambda a, b: b[0] < a[0] or b == a,
        "encoder": lambda a, b: b[0] <= a[0],
    }.items():
        want = torch.tensor([[rule(a, b) for b in idx] for a in idx])
        assert torch.equal(ept_allow(m, n, mask), want), mask
    with pytest.raises(UserError, match="valid: ensemble, decoder, encoder"):
        ept_allow(2, 2, "sideways")


@torch.inference_mode()
def test_prompt_tokens_see_what_a_causal_forward_gives_them(chaotic_llama):
    """With one EPT per prompt token, node c's prompt tokens inside the tree forward must get
    the logits a plain causal forward gives them after prefix ++ path(c) (same positions, same
    context): a wrong position id or mask row changes them."""
    model = chaotic_llama
    prompts = new_prompts(model, m=3, n=1)
    with torch.no_grad():
        prompts.embeddings.mul_(50.0)
    tree = build_tree(PATHS)
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(3, 96, (1, 9), generator=g)
    nodes = torch.randint(3, 96, (tree.size,), generator=g)
    carry = [3, 2, 1, 3, 0, 2, 1]                       # any allotment per node (the dynamic tree's)
    target = make_target(model)
    target.start(prefix)
    inj = node_prompt_injection(tree, prompts, carry, target.length)
    _, v = target.verify(nodes, tree, [inj])
    got = model.lm_head(v.extra_hidden)
    for c in range(tree.size):
        start, count = block_rows(carry, 1, c)
        if not count:
            continue
        path = [c]
        while int(tree.parents[path[-1]]) >= 0:
            path.append(int(tree.parents[path[-1]]))
        ids = torch.cat([prefix[0], nodes[list(reversed(path))]])
        seq = torch.cat([embed(model, ids[None])[0], prompts.embeddings[:count, 0]])
        ref = model(inputs_embeds=seq[None]).logits[0, -count:]
        assert torch.allclose(got[start:start + count], ref, atol=1e-4), c


def test_random_prompts_decode_vanillas_tokens_and_accept_some(chaotic_llama, tmp_path, one_thread):
    """Exact with random embeddings; and the loop really accepts guessed tokens (so the test
    above is not only ever checking one-token steps)."""
    model = chaotic_llama
    prompts = new_prompts(model, m=3, n=2, seed=5)
    save_trained(prompts, tmp_path / "p" / "prompts.pt", prompts_meta(model, 3, 2, "ensemble"))
    assert_exact_and_accepting(model, "prompt_decoding", prompt_tokens=str(tmp_path / "p"), tree=20)


def test_a_checkpoint_for_another_model_is_refused(chaotic_llama, tiny, tmp_path):
    assert_component_checks(chaotic_llama, "prompt_decoding", "prompt_tokens", "prompts.pt",
                            new_prompts(tiny, m=2, n=1), prompts_meta(tiny, 2, 1, "ensemble"), tmp_path)


@pytest.mark.parametrize("m,n,mask", [(3, 1, "ensemble"), (2, 3, "ensemble"), (2, 2, "decoder"), (2, 2, "encoder")])
def test_training_logits_equal_the_decoding_forwards(chaotic_llama, m, n, mask):
    """All cuts of a sequence in one training forward give each cut's prompt tokens the logits
    decoding computes for them inside the verification forward (root = the token at the cut)."""
    from common.training.seqtrain import teacher_forward
    from prompt_decoding.train import cut_logits

    model = chaotic_llama
    prompts = new_prompts(model, m, n, mask, seed=1)
    with torch.no_grad():
        prompts.embeddings.mul_(50.0)
    ids = torch.randint(3, 96, (20,), generator=torch.Generator().manual_seed(4))
    cuts = torch.tensor([5, 9, 14])
    cache, _, _ = teacher_forward(model, ids)
    with torch.no_grad():
        got = cut_logits(model, prompts, cache, cuts, ids.numel())
    assert cache.get_seq_length() == ids.numel()  # the prompt positions were dropped again
    root = build_tree([])
    for b, t in enumerate(cuts.tolist()):
        target = make_target(model)
        target.start(ids[None, :t])                       # the cache holds positions < t
        inj = node_prompt_injection(root, prompts, [m], target.length)
        _, v = target.verify(ids[t:t + 1], root, [inj])
        want = prompts.readout(v.extra_hidden, model.lm_head)
        assert torch.allclose(got[b], want, atol=1e-4), (t, (got[b] - want).abs().max())


def test_training_reduces_the_loss_and_only_moves_prompt_embeddings(chaotic_llama):
    from prompt_decoding.train import guess_accuracy, sequence_loss

    model = chaotic_llama
    prompts = new_prompts(model, 2, 2, "ensemble", seed=2)
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(3, 96, (24,), generator=g) for _ in range(2)]
    cuts = torch.arange(4, 19)
    assert_training_learns(model, prompts, lambda: sum(sequence_loss(model, prompts, s, cuts) for s in seqs) / 2,
                           steps=30, lr=1e-2)
    acc = guess_accuracy(model, prompts, seqs, [4, 4], topk=5)
    assert len(acc) == 2 and all(len(r) == 5 and 0 <= min(r) and max(r) <= 1 for r in acc)
    ce = sequence_loss(model, prompts, seqs[0], cuts[:-1], distill=False)
    assert torch.isfinite(ce)


# -- the dynamic sparse tree ------------------------------------------------------------------
ACC = [[0.6, 0.2, 0.1], [0.4, 0.15, 0.05], [0.3, 0.1, 0.05]]


def test_sparse_tree_quantities_by_hand():
    from prompt_decoding.sparse_tree import end_probs, expected_candidates, steady_state

    paths = [(0,), (1,), (0, 0)]
    assert expected_candidates(paths, ACC) == pytest.approx(0.6 + 0.2 + 0.6 * 0.4)
    ends = end_probs(paths, ACC)
    # root ends if neither child is accepted; (0,) ends unless (0,0) is; leaves end when reached
    assert ends == pytest.approx([1 - 0.8, 0.6 - 0.24, 0.2, 0.24]) and sum(ends) == pytest.approx(1.0)
    P = np.array([[0.5, 0.5], [0.2, 0.8]])
    pi = steady_state(P)
    assert pi == pytest.approx(pi @ P) and pi.sum() == pytest.approx(1.0)
    assert pi == pytest.approx([2 / 7, 5 / 7])


def test_dynamic_tree_construction_and_its_gain_over_static():
    from prompt_decoding.sparse_tree import amortized, best_split, build, hardware_size, static

    m, n_c = 3, 6
    trees = build(ACC, m, n_c, n_p=10)
    assert set(trees) == {1, 2, 3}
    for k, t in trees.items():
        assert len(t.paths) == min(n_c, 3 ** k) and max(map(len, t.paths)) <= k  # 3 ranks per distance
        assert t.prompt_tokens == min(10, m * (len(t.paths) + 1)) and min(t.carry) >= 1 and max(t.carry) <= m
    full = static(ACC, m, n_c)
    assert all(t.carry == (m,) * (len(t.paths) + 1) for t in full.values())
    # with every node carrying m tokens the steady state sits in state m: R = f(T_m)
    from prompt_decoding.sparse_tree import expected_candidates
    assert amortized(full, ACC) == pytest.approx(expected_candidates(full[3].paths, ACC))
    # at equal size, the best split beats giving every node all its prompt tokens
    size = full[3].size
    _, r = best_split(ACC, m, size)
    assert r >= amortized(full, ACC) - 1e-12
    hw = hardware_size(ACC, m, [4, 8, 16, 32], cost=lambda n: 1.0 + 0.05 * n)
    assert hw["size"] in (4, 8, 16, 32) and hw["speedup"] == max(row["speedup"] for row in hw["table"])
    with pytest.raises(UserError, match="n_p=30 is out of range"):
        build(ACC, m, 2, 30)


def test_trainer_writes_a_resumable_checkpoint_with_its_accuracy_table(chaotic_llama, tmp_path):
    """The entry point's training function: a finished checkpoint holding the held-out accuracy
    the trees are built from, a learning curve, stats; a rerun resumes instead of retraining;
    the decoder serves the result exactly."""
    from decoding_checks import WordTokenizer, frozen, greedy_sequences
    from common.config import TrainConfig
    from common.training.loop import Stopping
    from prompt_decoding.train import PromptRecipe, train_prompts

    model = chaotic_llama
    with frozen(model):
        data = {"train": greedy_sequences(model, 4), "heldout": greedy_sequences(model, 2, seed=50)}
        cfg = TrainConfig(lr=1e-2, epochs=5, batch_size=2, warmup_frac=0.0, schedule="cosine", max_steps=6)
        stats = train_prompts(model, WordTokenizer(), data, tmp_path / "pt", cfg, Stopping(eval_every=3),
                              PromptRecipe(m=2, n=2, cuts=4), curve_path=tmp_path / "curve.jsonl")
        again = train_prompts(model, WordTokenizer(), data, tmp_path / "pt", cfg, Stopping(eval_every=3),
                              PromptRecipe(m=2, n=2, cuts=4))
    assert stats["steps"] == 6 and stats["params"] == 2 * 2 * model.config.hidden_size
    assert len(stats["acc"]) == 2 and len(stats["acc"][0]) == 10
    assert [r["step"] for r in map(json.loads, (tmp_path / "curve.jsonl").read_text().splitlines())] == [0, 3, 6]
    assert again["acc"] == stats["acc"] and again["steps"] == 6          # resumed, not retrained
    state = torch.load(tmp_path / "pt" / "prompts.pt", weights_only=False)
    assert state["acc"] == stats["acc"] and state["done"]
    assert_exact_and_accepting(model, "prompt_decoding", prompts=3, prompt_tokens=str(tmp_path / "pt"), tree=10)


def test_random_trees_keep_the_dynamic_trees_budget_and_lose_to_it():
    from prompt_decoding.sparse_tree import amortized, best_split, random_tree

    trees, r = best_split(ACC, 3, 20)
    rand = random_tree(ACC, 3, 20, seed=1)
    for k in trees:
        assert rand[k].size == trees[k].size and min(rand[k].carry) >= 1
        assert all(p[:-1] == () or p[:-1] in rand[k].paths for p in rand[k].paths)   # prefix-closed
    assert amortized(rand, ACC) <= r + 1e-9


@pytest.mark.parametrize("shape", ["dynamic", "static"])
def test_every_state_tree_fits_the_configured_size(tiny, tmp_path, shape):
    """``tree`` is the verified positions a step may use: no state's tree exceeds it (a static
    tree of n_c candidates takes (n_c + 1) * (m + 1) positions)."""
    from common.decoders import get_decoder

    save_trained(new_prompts(tiny, 3, 1), tmp_path / "pt" / "prompts.pt", prompts_meta(tiny, 3, 1, "ensemble"))
    for size in (8, 14, 24, 31):
        dec = get_decoder("prompt_decoding", tiny, prompt_tokens=str(tmp_path / "pt"), tree=size, shape=shape)
        assert max(t.size for t in dec.trees.values()) <= size, (shape, size)
        if shape == "static":
            assert all(set(t.carry) == {3} for t in dec.trees.values())
