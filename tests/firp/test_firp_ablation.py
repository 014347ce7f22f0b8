"""FIRP's analytical experiments (Figures 3, 5-7) on a tiny random LLaMA: the masked option
really hides step 1 from step 2 (in training and in decoding), layer choices are checked, the
early-exit heads read the layer they name, every method is scored on the same split points,
the decoder stays exact, the config's sweeps have the shapes their figures need, and the
notebook renders every figure from made-up records."""
import copy
import sys
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from common.engine.forward import final_norm
from common.engine.target import make_target
from common.training.loop import save_trained
from common.engine.tree import build_tree
from decoding_checks import assert_exact_and_accepting
from firp.decoding import maps_meta, new_maps, pseudo_injections
from firp.maps import FirpMaps

ROOT = Path(__file__).resolve().parents[2]


def _noisy_maps(model, layers, seed=0):
    maps = new_maps(model, layers)
    with torch.no_grad():
        for lin in maps.maps:
            lin.weight.add_(torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(seed)) * 0.5)
    return maps


def _perturb_step1(maps):
    other = copy.deepcopy(maps)
    with torch.no_grad():
        other.maps[0].weight.mul_(-2.0)
        other.maps[0].bias.add_(1.0)
    return other


def _training_logits(model, maps, ids, anchors, mask_earlier):
    from common.training.seqtrain import teacher_forward
    from firp.train import anchor_logits

    cache, hidden, _ = teacher_forward(model, ids, hidden_states=True)
    with torch.no_grad():
        return anchor_logits(model, maps, cache, hidden, anchors, ids.numel(), mask_earlier)   # [B, K, V]


def _decoding_logits(model, maps, ids, mask_earlier):
    tree = build_tree([(0,), (1,), (0, 0)])
    target = make_target(model)
    target.start(ids[None, :8])
    with torch.no_grad():
        _, v = target.verify(ids[8:8 + tree.size], tree, pseudo_injections(tree, maps, target.length, mask_earlier))
        return model.lm_head(v.extra_hidden).view(maps.steps, tree.size, -1).transpose(0, 1)  # [N, K, V]


@pytest.mark.parametrize("path", ["training", "decoding"])
def test_masked_step2_does_not_see_step1(chaotic_llama, path):
    """Perturbing step 1's map changes step 1's pseudo states; step 2's (and 3's) stay exactly
    as they were when masked, and change when not."""
    model = chaotic_llama
    maps = _noisy_maps(model, [1, 2, 3])
    ids = torch.randint(3, 96, (16,), generator=torch.Generator().manual_seed(4))
    anchors = torch.tensor([3, 7, 11])

    def logits(m, mask):
        return (_training_logits(model, m, ids, anchors, mask) if path == "training"
                else _decoding_logits(model, m, ids, mask))
    for mask in (True, False):
        a, b = logits(maps, mask), logits(_perturb_step1(maps), mask)
        assert not torch.allclose(a[:, 0], b[:, 0], atol=1e-3)                   # step 1 itself moved
        later = torch.allclose(a[:, 1:], b[:, 1:], atol=1e-5)
        assert later == mask, f"mask_earlier={mask}: later steps {'unchanged' if later else 'changed'}"


def test_layer_choices_are_refused_naming_the_valid_range(chaotic_llama, tiny):
    from firp.train import check_steps

    with pytest.raises(UserError, match=r"valid: 1\.\.3 \(model has 4\)"):
        new_maps(chaotic_llama, [1, 4])
    with pytest.raises(UserError, match=r"valid: 1\.\.3"):
        new_maps(chaotic_llama, [0])
    with pytest.raises(UserError, match="must increase"):
        FirpMaps(8, [2, 2])
    with pytest.raises(UserError, match=r"names 2 layer\(s\) but --steps-k is 3"):
        check_steps([1, 2], 3)
    with pytest.raises(UserError, match="K >= 2"):
        check_steps([2], None, mask_earlier=True)
    assert check_steps(None, None) == 3 and check_steps([1, 3], None, True) == 2 and check_steps(None, 1) == 1


def test_config_sweeps_have_the_shapes_their_figures_need():
    """Per profile: every FIRP variant names one layer per step; fig5's train one step, fig6's two
    with step 1 fixed, fig7's one masked and one not at the same layers; an unknown name fails."""
    from common.config import check_variant_refs, load_config

    profiles = load_config()["profiles"]
    for name, prof in profiles.items():
        sec = prof["firp"]
        cfg = {v: {**sec["train"], **over} for v, over in sec["variants"].items()}
        for v, c in cfg.items():
            assert c["layers"] is None or len(c["layers"]) == c["steps_k"], (name, v)
            assert c["layers"] is None or c["layers"] == sorted(set(c["layers"])), (name, v)
        ab = sec["ablation"]
        assert all(cfg[v]["steps_k"] == 1 for v in ab["fig5"]), name
        assert all(cfg[v]["steps_k"] == 2 and not cfg[v].get("mask_earlier") for v in ab["fig6"]), name
        assert len({cfg[v]["layers"][0] for v in ab["fig6"]}) == 1, name
        assert len({tuple(cfg[v]["layers"]) for v in ab["fig7"]}) == 1, name
        assert sorted(bool(cfg[v].get("mask_earlier")) for v in ab["fig7"]) == [False, True], name
    bad = copy.deepcopy(profiles["embedded"])
    bad["firp"]["ablation"]["fig7"] = ["k2l19", "k2l19x"]
    with pytest.raises(UserError, match="no variant k2l19x"):
        check_variant_refs("embedded", bad)


@pytest.fixture(scope="module")
def teacher(chaotic_llama):
    from common.training.teacher import teacher_pass
    from decoding_checks import greedy_sequences

    def seqs(n, seed):
        return [{"ids": ids.tolist(), "start": s} for ids, s in greedy_sequences(chaotic_llama, n, seed=seed)]
    return {"key": {"test": 1}, "train": teacher_pass(chaotic_llama, seqs(6, 0), 4, 3),
            "heldout": teacher_pass(chaotic_llama, seqs(2, 50), 4, 2)}


def test_layer_states_too_large_for_the_machine_are_refused_before_the_pass(chaotic_llama, teacher, monkeypatch):
    """A states cache larger than the memory available is one UserError naming its size and how
    to shrink it, before any forward runs (the OS would otherwise kill the run late in its pass)."""
    from common import hardware
    from common.errors import UserError
    from common.components.medusa_heads import layer_inputs

    data = teacher["heldout"]
    monkeypatch.setattr(hardware, "available_memory", lambda: hardware.MEMORY_MARGIN + 1000)
    monkeypatch.setattr("common.components.medusa_heads.layer_states", lambda *a, **k: pytest.fail("the pass ran"))
    with pytest.raises(UserError, match=r"layer states \(2 layers x [\d,]+ positions x \d+ x 2 bytes\).*per_sequence"):
        layer_inputs(chaotic_llama, data, [1, 3])
    monkeypatch.undo()
    monkeypatch.setattr(hardware, "available_memory", lambda: None)   # unknown: not checked
    assert layer_inputs(chaotic_llama, data, [1]).shape[0] == 1


def test_early_exit_states_are_the_layer_they_name(chaotic_llama, teacher):
    """layer_inputs(l) is the final norm of the state entering layer l: equal to the model's own
    hidden_states[l] normed, unmoved by a change to layer l or above, moved by one below."""
    from common.components.medusa_heads import HeadData, layer_inputs

    model, data = chaotic_llama, teacher["heldout"]
    got = layer_inputs(model, data, [1, 3])
    for s in range(len(data)):
        a, b = data.span(s)
        with torch.no_grad():
            hs = model(input_ids=data.ids[a:b].long()[None], output_hidden_states=True).hidden_states
        for j, layer in enumerate((1, 3)):
            torch.testing.assert_close(got[j, a:b].float(), final_norm(model, hs[layer][0]), atol=2e-2, rtol=1e-2)
    for changed, moves in ((3, False), (2, True)):
        other = copy.deepcopy(model)
        with torch.no_grad():
            other.model.layers[changed].mlp.down_proj.weight.mul_(3.0)
        assert torch.equal(layer_inputs(other, data, [3]), got[1:]) != moves, changed
    heads_data = HeadData(data, data.answer_positions(), 2, "text", got)
    idx = torch.arange(3)
    torch.testing.assert_close(heads_data.head_states(1, idx), got[1, heads_data.positions[idx]])


def test_early_exit_predictor_reads_the_layer_it_names(chaotic_llama):
    """In the Figure 3 scoring, head k's logits depend on the layers below layers[k] only."""
    from common.components.medusa_heads import new_heads
    from common.training.seqtrain import teacher_forward
    from firp.accuracy import head_predictor

    model = chaotic_llama
    heads = new_heads(model, 2, True)
    ids = torch.randint(3, 96, (14,), generator=torch.Generator().manual_seed(9))
    anchors = torch.tensor([4, 8])

    def logits(m):
        _, hidden, _ = teacher_forward(m, ids, hidden_states=True)
        with torch.no_grad():
            return head_predictor(m, heads, [1, 3])(None, hidden, anchors, ids.numel())
    base = logits(model)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[2].mlp.down_proj.weight.mul_(3.0)   # above head 0's layer 1, below head 1's layer 3
    moved = logits(other)
    assert torch.equal(moved[:, 0], base[:, 0]) and not torch.allclose(moved[:, 1], base[:, 1], atol=1e-4)


def test_early_exit_training_and_the_medusa_decoder_refusing_it(chaotic_llama, teacher, tmp_path):
    from common.config import TrainConfig
    from common.decoders import get_decoder
    from common.components.medusa_heads import train_heads
    from common.training.loop import Stopping
    from decoding_checks import frozen

    model = chaotic_llama
    cfg = TrainConfig(lr=3e-3, epochs=2, batch_size=16, max_steps=6)
    with frozen(model):
        stats = train_heads(model, teacher, tmp_path / "ee", 2, cfg, True, Stopping(eval_every=3), "greedy",
                            layers=[1, 3])
        with pytest.raises(UserError, match=r"early-exit layer=4 .*valid: 1\.\.3"):
            train_heads(model, teacher, tmp_path / "bad", 2, cfg, True, Stopping(eval_every=3), layers=[1, 4])
        with pytest.raises(UserError, match="one layer per head"):
            train_heads(model, teacher, tmp_path / "bad", 2, cfg, True, Stopping(eval_every=3), layers=[1])
    H = model.config.hidden_size
    assert stats["input_layers"] == [1, 3] and stats["meta"]["input_layers"] == [1, 3]
    assert stats["params"] == 2 * (H * H + H) and len(stats["accuracy"]) == 2
    with pytest.raises(UserError, match="early-exit heads"):
        get_decoder("medusa", model, heads=str(tmp_path / "ee"), tree=16)


def test_every_method_is_scored_on_the_same_points_against_the_greedy_tokens(chaotic_llama):
    """An oracle reading the model's own logits at q + 1 + i is always right at rank 0 (the
    labels are the greedy tokens at distance i + 2); the maps' accuracy in the same pass equals
    step_accuracy's; points: start - 1 .. L - 1 - K of each answer."""
    from firp.accuracy import firp_predictor
    from firp.train import split_accuracy, step_accuracy

    model = chaotic_llama
    maps = _noisy_maps(model, [1, 2])
    seqs = [torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(n)) for n in (12, 15)]
    starts = [5, 6]

    def oracle(cache, hidden, anchors, L):
        logits = model.lm_head(hidden[-1])                                             # [L, V]
        return torch.stack([logits[anchors + 1 + i] for i in range(2)], dim=1)
    acc, n = split_accuracy(model, seqs, starts, 2, {"oracle": oracle, "firp": firp_predictor(model, maps)}, topk=3)
    assert n == (12 - 2 - 4) + (15 - 2 - 5)
    assert [a[0] for a in acc["oracle"]] == [1.0, 1.0] and all(a[1] == 0.0 for a in acc["oracle"])
    assert acc["firp"] == step_accuracy(model, maps, seqs, starts, topk=3)


@pytest.mark.parametrize("layers,mask", [([1, 3], True), ([1, 3], False), ([2], False)])
def test_decoder_stays_exact_with_swept_and_masked_maps(chaotic_llama, tmp_path, one_thread, layers, mask):
    """The sweeps' maps (K = 1, K = 2 at chosen layers, masked as trained) decode vanilla's tokens."""
    from common.decoders import get_decoder

    model = chaotic_llama
    save_trained(_noisy_maps(model, layers, seed=len(layers)), tmp_path / "m" / "maps.pt",
                 {**maps_meta(model, layers), "mask_earlier": mask})
    assert get_decoder("firp", model, maps=str(tmp_path / "m"), tree=8).mask_earlier is mask
    assert_exact_and_accepting(model, "firp", prompts=4, maps=str(tmp_path / "m"), tree=8)


def _fake(paths):
    from common.records import write_json, write_jsonl

    prov = {"model": "smollm2-135m-instruct", "hardware": "cpu: test", "code_version": "test"}
    for p in map(Path, paths):
        p.parent.mkdir(parents=True, exist_ok=True)
        name = p.name
        if name == "topk.jsonl":
            write_jsonl(p, [{"method": m, "step": i + 1, "distance": i + 2, "layer": layer[i],
                             "acc": [base / (i + 1) / (r + 1) for r in range(10)], "top1": base / (i + 1),
                             "n": 100, "heldout_sequences": 2, "params": 10, "steps": 5, "stopped": "flat",
                             "share_lm_head": m in ("early_exit", "medusa"), **prov}
                            for m, base, layer in (("firp", 0.4, [14, 19, 23]), ("early_exit", 0.2, [14, 19, 23]),
                                                   ("medusa", 0.25, [30, 30, 30]), ("medusa_own", 0.3, [30, 30, 30]))
                            for i in range(3)])
        elif name.startswith("train_"):
            v = name.removeprefix("train_").removesuffix("_stats.json")
            k, rest = int(v[1]), v[3:]
            masked = rest.endswith("m")
            layers = [int(rest.rstrip("m"))] if k == 1 else [14, int(rest.rstrip("m"))]
            top1 = 0.4 - 0.005 * layers[-1] - (0.05 if masked else 0.0)
            write_json(p, {"layers": layers, "steps_k": k, "mask_earlier": masked, "train_sequences": 4,
                           "heldout_sequences": 2, "steps": 640, "stopped": "epochs", "train_wall_s": 600.0,
                           "model_layers": 30, "acc": [[top1 / (r + 1) for r in range(10)] for _ in range(k)], **prov})
        elif name.endswith("_stats.json"):  # early exit, Medusa
            write_json(p, {"heldout_top1": [0.2, 0.1, 0.05, 0.04], **prov})
        else:
            raise AssertionError(f"unexpected input {p}")


@pytest.mark.parametrize("aid", ["firp.fig3", "firp.fig5", "firp.fig6", "firp.fig7"])
def test_notebook_renders_every_figure_from_made_up_records(tmp_path, aid, monkeypatch, capsys):
    """The notebook source run in-process, cell by cell as tools/make_notebook.py splits it, on
    made-up records of the embedded profile's declared inputs: a table, a figure, the claims."""
    import dataclasses

    from common.config import load_profile
    from common.workflow.artifacts import artifact_inputs, load_artifacts

    sys.path.insert(0, str(ROOT / "tools"))
    import make_notebook

    spec = load_artifacts()[aid]
    prof = dataclasses.replace(load_profile(None, "embedded"), results_root=str(tmp_path))
    inputs = artifact_inputs(prof, aid)
    _fake(inputs)
    monkeypatch.chdir(ROOT)
    env = {"artifact_id": aid, "results_root": str(tmp_path), "package": "firp", "profile": "embedded",
           "inputs": inputs, "__name__": "notebook"}
    for kind, ids, body in make_notebook.cells_of((ROOT / "notebooks" / "src" / f"{spec['notebook']}.py").read_text()):
        if kind == "code" and (ids is None or aid in ids):
            exec(compile(body, f"{aid} cell", "exec"), env)
    base = tmp_path / "firp"
    assert (base / "tables" / f"{aid}.csv").is_file() and (base / "figures" / f"{aid}.png").is_file()
    out = capsys.readouterr().out
    assert "paper:" in out and "ours" in out and "smollm2-135m-instruct" in (base / "tables" / f"{aid}.md").read_text()
