"""Mechanics on a tiny random LLaMA: tree masks, tree-verified logits, cache edits, layer split."""
import pytest
import torch
from transformers import DynamicCache

from common.engine.cache import accept_path, crop_to, keep_positions, seq_length
from common.errors import UserError
from common.engine.forward import attention_mask_4d, check_layer, embed, logits_from_hidden, run_layers
from common.engine.target import make_target
from common.engine.tree import build_tree, chain_paths, load_tree, save_tree

PATHS = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (0, 1, 1)]
TOKENS = {(): 5, (0,): 11, (1,): 12, (2,): 13, (0, 0): 21, (0, 1): 22, (1, 0): 23,
          (0, 0, 0): 31, (0, 1, 0): 32, (0, 1, 1): 33}


def full_logits(model, ids):
    return model(input_ids=torch.tensor([ids])).logits[0]


def prefill(model, ids):
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache


def test_mask_is_exactly_the_ancestor_relation():
    t = build_tree(PATHS)
    nodes = [()] + list(t.paths)
    for i, a in enumerate(nodes):
        for j, b in enumerate(nodes):
            assert bool(t.ancestor_mask[i, j]) == (a[: len(b)] == b), (a, b)
    assert t.depth.tolist() == [len(p) for p in nodes]
    assert t.parents[0] == -1 and all(nodes[int(t.parents[i])] == nodes[i][:-1] for i in range(1, t.size))
    leaves = {nodes[r[r >= 0][-1]] for r in t.retrieve_indices}
    assert leaves == {(2,), (1, 0), (0, 0, 0), (0, 1, 0), (0, 1, 1)}
    for row in t.retrieve_indices:  # each row is a root-to-leaf chain
        chain = [nodes[i] for i in row.tolist() if i >= 0]
        assert all(chain[k] == chain[-1][:k] for k in range(len(chain)))


def test_4d_mask_covers_past_and_blocks_non_ancestors():
    t = build_tree(PATHS)
    m = attention_mask_4d(t.ancestor_mask, past_len=7)
    assert m.shape == (1, 1, t.size, 7 + t.size)
    assert (m[0, 0, :, :7] == 0).all()
    assert ((m[0, 0, :, 7:] == 0) == t.ancestor_mask).all()


def test_bad_trees_raise():
    with pytest.raises(UserError, match="no parent"):
        build_tree([(0,), (1, 1)])
    with pytest.raises(UserError, match="at most"):
        build_tree(chain_paths(10), max_nodes=5)
    with pytest.raises(UserError):
        build_tree([()])


def test_tree_file_roundtrip(tmp_path):
    save_tree(tmp_path / "t.json", PATHS, accept_rate=0.5)
    assert load_tree(tmp_path / "t.json").paths == build_tree(PATHS).paths
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="malformed"):
        load_tree(tmp_path / "bad.json")


def test_tree_logits_equal_sequential_per_path(tiny):
    prompt = [1, 7, 8, 9, 10]
    t = build_tree(PATHS)
    nodes = [()] + list(t.paths)
    tgt = make_target(tiny)
    tgt.start(torch.tensor([prompt[:-1]]))  # the root token (5) is fed with the tree
    logits, _ = tgt.verify(torch.tensor([TOKENS[n] for n in nodes]), t)
    for i, n in enumerate(nodes):
        seq = prompt[:-1] + [TOKENS[n[:k]] for k in range(len(n) + 1)]
        ref = full_logits(tiny, seq)[-1]
        torch.testing.assert_close(logits[i], ref, atol=1e-4, rtol=1e-4)


def test_accept_path_equals_recomputation(tiny):
    prompt = [1, 7, 8, 9]
    t = build_tree(PATHS)
    nodes = [()] + list(t.paths)
    tgt = make_target(tiny)
    tgt.start(torch.tensor([prompt]))
    cache = tgt.cache
    tgt.verify(torch.tensor([TOKENS[n] for n in nodes]), t)
    path = [0, nodes.index((0,)), nodes.index((0, 1)), nodes.index((0, 1, 1))]
    accept_path(cache, len(prompt), path)
    assert seq_length(cache) == len(prompt) + 4
    accepted = [TOKENS[nodes[i]] for i in path]
    nxt = torch.tensor([[40, 41]])
    got = tiny(input_ids=nxt, past_key_values=cache, use_cache=True).logits[0]
    ref = full_logits(tiny, prompt + accepted + [40, 41])[-2:]
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_crop_and_keep_positions_equal_recomputation(tiny):
    seq = [1, 4, 5, 6, 7, 8, 9, 10]
    cache = prefill(tiny, seq)
    crop_to(cache, 5)
    got = tiny(input_ids=torch.tensor([[50]]), past_key_values=cache, use_cache=True).logits[0, -1]
    torch.testing.assert_close(got, full_logits(tiny, seq[:5] + [50])[-1], atol=1e-4, rtol=1e-4)
    cache = prefill(tiny, seq)
    keep_positions(cache, torch.tensor([0, 1, 2, 3]))
    got = tiny(input_ids=torch.tensor([[50]]), past_key_values=cache, use_cache=True).logits[0, -1]
    torch.testing.assert_close(got, full_logits(tiny, seq[:4] + [50])[-1], atol=1e-4, rtol=1e-4)


def test_layer_split_equals_full_forward(tiny):
    """Layers [0, k) then [k, d) with a cache, prefill then decode: same logits as model()."""
    seq = [1, 4, 5, 6, 7, 8]
    cache = DynamicCache(config=tiny.config)
    ref_cache = DynamicCache(config=tiny.config)
    for chunk, start in ((seq[:4], 0), (seq[4:5], 4), (seq[5:], 5)):
        ids = torch.tensor([chunk])
        pos = torch.arange(start, start + len(chunk))[None]
        h = run_layers(tiny, embed(tiny, ids), cache, 0, 2, pos)
        h = run_layers(tiny, h, cache, 2, 4, pos)
        ref = tiny(input_ids=ids, past_key_values=ref_cache, use_cache=True).logits
        torch.testing.assert_close(logits_from_hidden(tiny, h), ref, atol=1e-5, rtol=1e-5)


def test_check_layer(tiny):
    check_layer(tiny, 2)
    for bad in (0, 4, 9):
        with pytest.raises(UserError, match="valid: 1..3"):
            check_layer(tiny, bad)


def test_resolve_tree_is_the_one_tree_option_resolver(tmp_path):
    """A size stays a size (the decoder builds its tree), names a stored tree when the decoder
    keeps some, and a file's paths come back unless deeper than the decoder can fill."""
    from common.engine.tree import resolve_tree, save_tree

    paths = [(0,), (1,), (0, 0)]
    save_tree(tmp_path / "tree_3.json", paths)
    assert resolve_tree(16, 2, "two heads") == 16
    stored = tuple(tuple(p) for p in build_tree(paths).paths)  # the tree's node order
    assert sorted(stored) == sorted(paths)
    assert resolve_tree(3, 2, "two heads", stored=tmp_path) == stored
    assert resolve_tree(str(tmp_path / "tree_3.json"), 2, "two heads") == stored
    with pytest.raises(UserError, match=r"deeper than the one head \(1\)"):
        resolve_tree(tmp_path / "tree_3.json", 1, "the one head")
    with pytest.raises(UserError, match="does not exist"):
        resolve_tree(4, 2, "two heads", stored=tmp_path)
