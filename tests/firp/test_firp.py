"""FIRP's decoder on a tiny random LLaMA: pseudo states get exactly what a direct computation
gives them (their layer, position and context), random maps decode vanilla's tokens while
accepting guesses, and bad maps or layers are refused."""
import pytest
import torch

from common.engine.cache import crop_to
from common.decoders import get_decoder
from decoding_checks import assert_component_checks, assert_exact_and_accepting, assert_training_learns
from common.errors import UserError
from common.engine.fast import new_cache
from common.engine.forward import final_norm, num_layers, run_layers
from common.engine.target import make_target
from common.training.loop import save_trained
from common.engine.tree import build_tree
from firp.decoding import default_layers, maps_meta, new_maps, pseudo_injections
from firp.maps import FirpMaps

PATHS = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def _noisy_maps(model, layers, seed=0):
    maps = new_maps(model, layers)
    with torch.no_grad():
        for lin in maps.maps:
            lin.weight.add_(torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(seed)) * 0.5)
            lin.bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed + 1))
    return maps


@pytest.mark.parametrize("mask_earlier", [False, True])
@torch.inference_mode()
def test_pseudo_states_equal_a_direct_computation(chaotic_llama, mask_earlier):
    """Node c's step-i pseudo state: W_i h_c(t_i) + b_i from c's real state at layer t_i, run
    through layers t_i.. at position pos(c) + 1 + i against prefix ++ path(c) (and, unless
    masked, c's earlier pseudo states): the same logits inside the tree forward."""
    model = chaotic_llama
    d = num_layers(model)
    maps = _noisy_maps(model, [1, 2, 3])
    tree = build_tree(PATHS)
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(3, 96, (1, 8), generator=g)
    nodes = torch.randint(3, 96, (tree.size,), generator=g)
    target = make_target(model)
    target.start(prefix)
    _, v = target.verify(nodes, tree, pseudo_injections(tree, maps, target.length, mask_earlier))
    got = model.lm_head(v.extra_hidden).view(maps.steps, tree.size, -1)
    for c in range(tree.size):
        path = [c]
        while int(tree.parents[path[-1]]) >= 0:
            path.append(int(tree.parents[path[-1]]))
        ids = torch.cat([prefix[0], nodes[list(reversed(path))]])[None]
        L = ids.shape[1]
        cache = new_cache(model)
        real = model(input_ids=ids, past_key_values=cache, use_cache=True, output_hidden_states=True).hidden_states
        for i, layer in enumerate(maps.layers):
            h = maps(i, real[layer][:, -1:])
            out = run_layers(model, h, cache, layer, d, torch.tensor([[L + i]]))
            if mask_earlier:
                crop_to(cache, L)  # the next step must not see this one
            want = model.lm_head(final_norm(model, out))[0, 0]
            assert torch.allclose(got[i, c], want, atol=1e-4), (c, i)


def test_random_maps_decode_vanillas_tokens_and_accept_some(chaotic_llama, tmp_path, one_thread):
    model = chaotic_llama
    layers = default_layers(model, 3)
    save_trained(_noisy_maps(model, layers), tmp_path / "m" / "maps.pt", maps_meta(model, layers))
    assert_exact_and_accepting(model, "firp", maps=str(tmp_path / "m"), tree=16)


def test_bad_maps_and_layers_are_refused(chaotic_llama, tiny, tmp_path):
    with pytest.raises(UserError, match="must increase"):
        FirpMaps(8, [3, 2])
    with pytest.raises(UserError, match="K >= 1"):
        FirpMaps(8, [])
    with pytest.raises(UserError):
        FirpMaps(8, [1, 9], depth=4)
    assert_component_checks(chaotic_llama, "firp", "maps", "maps.pt", new_maps(tiny, [1, 2]),
                            maps_meta(tiny, [1, 2]), tmp_path)
    with pytest.raises(UserError, match="out of range"):
        get_decoder("firp", chaotic_llama, maps=str(tmp_path / "none"), tree=0)


@pytest.mark.parametrize("mask_earlier", [False, True])
def test_training_logits_equal_the_decoding_forwards(chaotic_llama, mask_earlier):
    """Every anchor of a sequence in one training pass gets the pseudo-state logits decoding
    computes for a root-only tree at that anchor."""
    from common.training.seqtrain import teacher_forward
    from firp.train import anchor_logits

    model = chaotic_llama
    maps = _noisy_maps(model, [1, 2, 3], seed=3)
    ids = torch.randint(3, 96, (18,), generator=torch.Generator().manual_seed(5))
    anchors = torch.tensor([4, 8, 13])
    cache, hidden, _ = teacher_forward(model, ids, hidden_states=True)
    with torch.no_grad():
        got = anchor_logits(model, maps, cache, hidden, anchors, ids.numel(), mask_earlier)
    assert cache.get_seq_length() == ids.numel()
    root = build_tree([])
    for b, q in enumerate(anchors.tolist()):
        target = make_target(model)
        target.start(ids[None, :q])
        with torch.no_grad():
            _, v = target.verify(ids[q:q + 1], root, pseudo_injections(root, maps, target.length, mask_earlier))
        assert torch.allclose(got[b], model.lm_head(v.extra_hidden), atol=1e-4), q


def test_training_reduces_the_loss_and_only_moves_the_maps(chaotic_llama):
    from firp.train import sequence_loss, step_accuracy

    model = chaotic_llama
    maps = new_maps(model, [1, 2, 3])
    seqs = [torch.randint(3, 96, (22,), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    anchors = torch.arange(3, 18)
    assert_training_learns(model, maps, lambda: sum(sequence_loss(model, maps, s, anchors) for s in seqs) / 2,
                           steps=25, lr=3e-3)
    acc = step_accuracy(model, maps, seqs, [3, 3], topk=4)
    assert len(acc) == 3 and all(len(r) == 4 for r in acc)


def test_trainer_writes_a_resumable_checkpoint_with_its_accuracy_table(chaotic_llama, tmp_path):
    """The entry point's training function: a finished checkpoint holding the held-out step
    accuracies the tree search reads, a curve, stats with the parameter count; the decoder
    serves it exactly and takes ``mask_earlier`` from how the maps were trained."""
    from decoding_checks import greedy_sequences
    from common.config import TrainConfig
    from common.training.loop import Stopping
    from firp.train import train_maps

    model = chaotic_llama
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        data = {"train": greedy_sequences(model, 4), "heldout": greedy_sequences(model, 2, seed=50)}
        cfg = TrainConfig(lr=1e-3, epochs=5, batch_size=2, max_steps=4)
        stats = train_maps(model, data, tmp_path / "maps", cfg, Stopping(eval_every=2), [1, 2, 3], anchors=4,
                           mask_earlier=True, mode="joint")  # the separate mode: tests/firp/test_firp_train_modes.py
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
    H = model.config.hidden_size
    assert stats["steps"] == 4 and stats["params"] == 3 * (H * H + H)
    assert len(stats["acc"]) == 3 and (tmp_path / "maps" / "curve.jsonl").is_file()
    dec = get_decoder("firp", model, maps=str(tmp_path / "maps"), tree=8)
    assert dec.mask_earlier is True
    assert get_decoder("firp", model, maps=str(tmp_path / "maps"), tree=8, mask_earlier=False).mask_earlier is False
    assert_exact_and_accepting(model, "firp", prompts=3, maps=str(tmp_path / "maps"), tree=8)


def test_cosine_analysis_covers_every_layer_above_each_step(chaotic_llama):
    """One row per step and per layer from its prediction layer to the last, cosines in range."""
    from firp.analysis import cosine_by_layer

    model = chaotic_llama
    seqs = [(torch.randint(3, 96, (14,), generator=torch.Generator().manual_seed(2)), 4)]
    rows = cosine_by_layer(model, new_maps(model, [1, 2]), seqs)
    assert {r["layer"] for r in rows if r["step"] == 1} == {1, 2, 3}
    assert {r["layer"] for r in rows if r["step"] == 2} == {2, 3}
    assert all(-1.0 <= r["cosine"] <= 1.0 + 1e-6 for r in rows)
