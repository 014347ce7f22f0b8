"""FIRP's two training modes on a tiny random model: ``separate`` (the paper, section 3.3: K
trainings, one map each, the default) and ``joint`` (one training on the K steps' loss, what the
committed maps were trained with). The separate step's forward is checked against the
transformers model's own forward; a short run of each mode ends in maps the decoder serves."""
import pytest
import torch

from common.decoders import get_decoder
from common.errors import UserError
from common.training.seqtrain import teacher_forward
from firp.decoding import new_maps
from firp.train import step_logits, step_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def _random_maps(model, layers, seed=0):
    """Maps away from the identity, so a wrong input state or mask shows in the logits."""
    maps = new_maps(model, layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in maps.maps:
            lin.weight.add_(0.3 * torch.randn(lin.weight.shape, generator=g))
            lin.bias.add_(0.1 * torch.randn(lin.bias.shape, generator=g))
    return maps


def _direct(model, maps, i, ids, q, see):
    """Step ``i``'s logits by the model's own forward: the real tokens ``0..see`` and one more
    position ``q + 1 + i`` whose state entering layer ``t_i`` is replaced by the map of the
    anchor's real state there (causal attention: nothing before that layer reaches it)."""
    layer = maps.layers[i]
    hidden = model(ids[None], output_hidden_states=True).hidden_states[layer][0]   # [L, H]
    pseudo = maps(i, hidden[q])
    seq = torch.cat([ids[: see + 1], ids[:1]])[None]   # the last token is a placeholder
    pos = torch.cat([torch.arange(see + 1), torch.tensor([q + 1 + i])])[None]

    def swap(mod, args, kwargs):
        h = (args[0] if args else kwargs["hidden_states"]).clone()
        h[0, -1] = pseudo
        return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})
    handle = model.model.layers[layer].register_forward_pre_hook(swap, with_kwargs=True)
    try:
        return model(seq, position_ids=pos).logits[0, -1]
    finally:
        handle.remove()


@pytest.mark.parametrize("mask_earlier", [False, True])
@torch.no_grad()
def test_separate_step_sees_the_real_states_the_paper_names(chaotic_llama, mask_earlier):
    """Step i's pseudo state at q + 1 + i sees the real states up to q + i (the paper's mask);
    masked (Figure 7), up to its anchor q only."""
    model = chaotic_llama
    maps = _random_maps(model, [1, 2, 3])
    ids = torch.randint(3, 96, (16,), generator=torch.Generator().manual_seed(4))
    anchors = torch.tensor([3, 7, 12])
    cache, hidden, _ = teacher_forward(model, ids, hidden_states=True)
    for i in range(maps.steps):
        got = step_logits(model, maps, i, cache, hidden, anchors, ids.numel(), mask_earlier)
        for b, q in enumerate(anchors.tolist()):
            want = _direct(model, maps, i, ids, q, q if mask_earlier else q + i)
            torch.testing.assert_close(got[b], want, rtol=1e-4, atol=1e-4)


def test_separate_loss_trains_only_its_own_map(chaotic_llama):
    model = chaotic_llama
    maps = _random_maps(model, [1, 2, 3])
    ids = torch.randint(3, 96, (16,), generator=torch.Generator().manual_seed(5))
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        step_loss(model, maps, 1, ids, torch.tensor([2, 9])).backward()
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
    grads = [lin.weight.grad for lin in maps.maps]
    assert grads[0] is None and grads[2] is None and float(grads[1].abs().sum()) > 0


def _train(model, tmp_path, mode, **kw):
    from decoding_checks import greedy_sequences
    from common.config import TrainConfig
    from common.training.loop import Stopping
    from firp.train import train_maps

    for p in model.parameters():
        p.requires_grad_(False)
    try:
        data = {"train": greedy_sequences(model, 4), "heldout": greedy_sequences(model, 2, seed=50)}
        cfg = TrainConfig(lr=1e-3, epochs=5, batch_size=2, max_steps=3)
        return train_maps(model, data, tmp_path, cfg, Stopping(eval_every=2), [1, 2], anchors=4, mode=mode, **kw)
    finally:
        for p in model.parameters():
            p.requires_grad_(True)


def _decodes_greedy(model, folder):
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    ref = get_decoder("vanilla", model).generate(ids, 20).tokens
    assert get_decoder("firp", model, maps=str(folder), tree=8).generate(ids, 20).tokens == ref


def test_separate_mode_runs_one_training_per_map(chaotic_llama, tmp_path):
    from common.training.loop import read_trained

    stats = _train(chaotic_llama, tmp_path / "sep", "separate")
    assert stats["mode"] == "separate" and stats["steps"] == 2 * 3     # each map its own 3 steps
    parts = [read_trained(tmp_path / "sep" / "separate" / f"map{i}.pt") for i in (1, 2)]
    assert [p["step"] for p in parts] == [3, 3] and [p["identity"]["meta"]["map"] for p in parts] == [1, 2]
    state = read_trained(tmp_path / "sep" / "maps.pt")
    assert state["identity"]["mode"] == "separate" and len(state["maps"]) == 2
    # each map's published weights are the ones its own training chose
    for i, part in enumerate(parts):
        torch.testing.assert_close(state["module"][f"maps.{i}.weight"], part["module"]["weight"])
    curve = (tmp_path / "sep" / "curve.jsonl").read_text().splitlines()
    assert {'"map": 1', '"map": 2'} <= {line[1:9] for line in curve}
    assert len(stats["acc"]) == 2
    _decodes_greedy(chaotic_llama, tmp_path / "sep")
    # a second run finds every map finished and trains nothing more
    again = _train(chaotic_llama, tmp_path / "sep", "separate")
    assert again["acc"] == stats["acc"]


def test_joint_mode_is_one_training_and_the_modes_do_not_mix(chaotic_llama, tmp_path):
    stats = _train(chaotic_llama, tmp_path / "joint", "joint")
    assert stats["mode"] == "joint" and stats["steps"] == 3 and not (tmp_path / "joint" / "separate").exists()
    _decodes_greedy(chaotic_llama, tmp_path / "joint")
    with pytest.raises(UserError, match="another training .joint mode"):
        _train(chaotic_llama, tmp_path / "joint", "separate")


def test_unknown_mode_fails_before_anything_is_loaded(monkeypatch, tmp_path):
    import common.training.cli
    from firp.train import _main

    monkeypatch.setattr(common.training.cli, "load_model", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("the model was loaded before the options were checked")))
    argv = ["--model", "m", "--out", str(tmp_path / "o"), "--corpus", str(tmp_path / "c.pt"),
            "--heldout-corpus", str(tmp_path / "h.pt"), "--mode", "both"]
    with pytest.raises(UserError, match="--mode 'both' is invalid; valid: separate, joint"):
        _main(argv)
    assert not (tmp_path / "o").exists()
