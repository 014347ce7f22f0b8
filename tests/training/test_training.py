"""The shared training loop: loss goes down, resume equals an uninterrupted run, config checks,
the held-out curve and early stopping."""
import dataclasses
import json
import time

import pytest
import torch

from common.errors import UserError
from common.training.loop import Stopping, TrainConfig, load_trained, read_trained, train

DATA = [(torch.randn(4, generator=torch.Generator().manual_seed(i)), i % 3) for i in range(40)]


def loss_fn(m, batch):
    x = torch.stack([b[0] for b in batch])
    y = torch.tensor([b[1] for b in batch])
    return torch.nn.functional.cross_entropy(m(x), y)


def fresh():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def interrupt_after_7_steps(cfg: TrainConfig, ckpt) -> None:
    """Start a training of a fresh module and kill it (KeyboardInterrupt) in its 8th step."""
    calls = {"n": 0}

    def stopping(m, b):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return loss_fn(m, b)

    with pytest.raises(KeyboardInterrupt):
        train(fresh(), DATA, stopping, cfg, ckpt)


def test_loss_decreases_and_resume_is_exact(tmp_path):
    cfg = TrainConfig(lr=0.05, epochs=4, batch_size=8, checkpoint_every=3)
    full = fresh()
    log = train(full, DATA, loss_fn, cfg, tmp_path / "a.pt")
    assert log[-1]["loss"] < log[0]["loss"] and len(log) == 20

    interrupt_after_7_steps(cfg, tmp_path / "b.pt")  # then resume from the step-6 checkpoint
    resumed = fresh()
    log_b = train(resumed, DATA, loss_fn, cfg, tmp_path / "b.pt", log_path=tmp_path / "b.jsonl")
    assert [r["step"] for r in log_b] == list(range(1, 21))
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert (tmp_path / "b.jsonl").read_text().count("\n") == 20


def test_a_run_checkpoint_saved_on_a_gpu_resumes_on_the_cpu(tmp_path, monkeypatch):
    """A run interrupted on a lent GPU and continued here: its tensors carry a CUDA location, which
    torch.load refuses on a CPU-only machine unless the loop maps them to the module's device."""
    from common.training.loop import run_path
    cfg = TrainConfig(lr=0.05, epochs=4, batch_size=8, checkpoint_every=3)
    full = fresh()
    train(full, DATA, loss_fn, cfg, tmp_path / "a.pt")
    interrupt_after_7_steps(cfg, tmp_path / "b.pt")
    work = run_path(tmp_path / "b.pt")
    state = torch.load(work, weights_only=False)
    with monkeypatch.context() as m:  # write it as a CUDA run would: every storage tagged cuda:0
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, work)
    if not torch.cuda.is_available():  # the file is what a GPU run leaves: a plain load refuses it here
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(work, weights_only=False)
    resumed = fresh()
    train(resumed, DATA, loss_fn, cfg, tmp_path / "b.pt")
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_checkpoint_identity_is_checked(tmp_path):
    cfg = TrainConfig(lr=0.05, epochs=1, batch_size=8)
    train(fresh(), DATA, loss_fn, cfg, tmp_path / "c.pt", meta={"layer": 3})
    with pytest.raises(UserError, match="another config"):
        train(fresh(), DATA, loss_fn, TrainConfig(lr=0.01, epochs=1, batch_size=8), tmp_path / "c.pt",
              meta={"layer": 3})
    with pytest.raises(UserError, match="trained for"):
        load_trained(fresh(), tmp_path / "c.pt", meta={"layer": 4})
    load_trained(fresh(), tmp_path / "c.pt", meta={"layer": 3})
    # a workflow rerun deletes the published checkpoint: a changed recipe then starts afresh,
    # the same recipe finds its finished state and publishes it again without training
    (tmp_path / "c.pt").unlink()
    changed = torch.nn.Linear(4, 3)
    train(changed, DATA, loss_fn, TrainConfig(lr=0.01, epochs=1, batch_size=8), tmp_path / "c.pt", meta={"layer": 3})
    assert read_trained(tmp_path / "c.pt")["identity"]["config"]["lr"] == 0.01
    (tmp_path / "c.pt").unlink()
    calls = {"n": 0}

    def counting(m, b):
        calls["n"] += 1
        return loss_fn(m, b)
    again = torch.nn.Linear(4, 3)
    train(again, DATA, counting, TrainConfig(lr=0.01, epochs=1, batch_size=8), tmp_path / "c.pt", meta={"layer": 3})
    assert calls["n"] == 0 and torch.equal(again.weight, changed.weight) and read_trained(tmp_path / "c.pt")["done"]
    with pytest.raises(UserError, match="does not exist"):
        load_trained(fresh(), tmp_path / "nope.pt")


def test_a_changed_recipe_replaces_a_checkpoint_whose_declared_artifact_is_gone(tmp_path):
    """A trainer whose rule declares an artifact exported from the checkpoint (a model folder), not
    the checkpoint: a rerun deletes the artifact and leaves the published checkpoint, which a changed
    recipe must replace rather than refuse; with the artifact still there it is refused."""
    ckpt, artifact = tmp_path / "train.pt", tmp_path / "model" / "config.json"
    train(fresh(), DATA, loss_fn, TrainConfig(lr=0.05, epochs=1, batch_size=8), ckpt, artifact=artifact)
    artifact.parent.mkdir()
    artifact.write_text("{}")
    changed = TrainConfig(lr=0.01, epochs=1, batch_size=8)
    with pytest.raises(UserError, match="another config"):
        train(fresh(), DATA, loss_fn, changed, ckpt, artifact=artifact)
    with pytest.raises(UserError, match="another config"):  # without an artifact: the old rule
        train(fresh(), DATA, loss_fn, changed, ckpt)
    artifact.unlink()
    train(fresh(), DATA, loss_fn, changed, ckpt, artifact=artifact)
    state = read_trained(ckpt)
    assert state["identity"]["config"]["lr"] == 0.01 and state["done"] and state["step"] == 5
    with pytest.raises(UserError, match="batch_size=0"):
        TrainConfig(batch_size=0)


# -- held-out curve and early stopping -----------------------------------------------------
def synthetic(values):
    """An ``evaluate`` callback returning ``values`` in turn (a scripted held-out curve)."""
    it = iter(values)
    return lambda m: {"heldout_loss": 0.0, "heldout_top1": next(it)}


def test_flattened_rule():
    stop = Stopping(eval_every=1, patience=3, min_delta=0.01)
    rows = lambda vs: [{"heldout_top1": v} for v in vs]  # noqa: E731
    assert not stop.flattened(rows([0.1, 0.2, 0.2]))  # too short to judge
    assert stop.flattened(rows([0.1, 0.3, 0.302, 0.305, 0.309]))  # +0.009 over 3 evaluations
    assert not stop.flattened(rows([0.1, 0.3, 0.302, 0.305, 0.311]))
    assert not stop.flattened(rows([0.1, 0.3, 0.2, 0.2, 0.31]))
    assert stop.flattened(rows([[0.1, 0.0], [0.3, 0.9], [0.3, 0.0], [0.3, 0.0], [0.3, 0.0]]))  # head 1 watched
    with pytest.raises(UserError, match="eval_every=0"):
        Stopping(eval_every=0)


def test_stops_on_a_flat_curve_not_on_a_rising_one(tmp_path):
    cfg = TrainConfig(lr=0.05, epochs=10, batch_size=8, checkpoint_every=3)  # 50 steps at most
    stop = Stopping(eval_every=5, patience=2, min_delta=0.01)
    flat = [0.1, 0.2, 0.25, 0.255, 0.258] + [0.26] * 20
    train(fresh(), DATA, loss_fn, cfg, tmp_path / "flat.pt", evaluate=synthetic(flat), stop=stop,
          curve_path=tmp_path / "flat.jsonl")
    state = read_trained(tmp_path / "flat.pt")
    assert state["stopped"] == "flat" and state["step"] == 20  # evaluations at 0, 5, 10, 15, 20
    curve = [json.loads(l) for l in (tmp_path / "flat.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [0, 5, 10, 15, 20] and curve == state["curve"]
    assert curve[0]["train_loss"] is None and curve[1]["examples_seen"] == 40
    # resumed under the same rule: still flat, nothing trains; under more patience the curve is
    # not flat, so the run continues from step 20 with its curve
    train(fresh(), DATA, loss_fn, cfg, tmp_path / "flat.pt", evaluate=synthetic([]), stop=stop)
    assert read_trained(tmp_path / "flat.pt")["step"] == 20
    patient = Stopping(eval_every=5, patience=4, min_delta=0.01)
    train(fresh(), DATA, loss_fn, cfg, tmp_path / "flat.pt", evaluate=synthetic([0.3 + 0.05 * i for i in range(10)]), stop=patient)
    more = read_trained(tmp_path / "flat.pt")
    assert more["curve"][:5] == state["curve"] and [r["step"] for r in more["curve"][5:]] == [25, 30, 35, 40, 45, 50]
    assert more["stopped"] == "epochs" and more["step"] == 50
    rising = [0.1 + 0.05 * i for i in range(20)]
    train(fresh(), DATA, loss_fn, cfg, tmp_path / "rising.pt", evaluate=synthetic(rising), stop=stop)
    state = read_trained(tmp_path / "rising.pt")
    assert state["stopped"] == "epochs" and state["step"] == 50 and len(state["curve"]) == 11
    capped = dataclasses.replace(cfg, max_steps=30)  # the step cap, not the epochs, ends a rising run
    train(fresh(), DATA, loss_fn, capped, tmp_path / "capped.pt", evaluate=synthetic(rising), stop=stop)
    state = read_trained(tmp_path / "capped.pt")
    assert state["stopped"] == "max steps" and state["step"] == 30


def test_a_finished_run_rerun_by_the_workflow_writes_its_curve_again(tmp_path):
    """Snakemake deletes a training rule's outputs (the published checkpoint, the curve) when it
    reruns it; the run state is kept and already finished, so nothing is evaluated again, and
    the curve must still land where the rule expects it (it comes from the state)."""
    cfg = TrainConfig(lr=0.05, epochs=10, batch_size=8, checkpoint_every=3)
    stop = Stopping(eval_every=5, patience=2, min_delta=0.01)
    flat = [0.1, 0.2, 0.25, 0.255, 0.258] + [0.26] * 20
    ckpt, curve_path = tmp_path / "h.pt", tmp_path / "h_curve.jsonl"
    train(fresh(), DATA, loss_fn, cfg, ckpt, evaluate=synthetic(flat), stop=stop, curve_path=curve_path)
    first = curve_path.read_text()
    ckpt.unlink()
    curve_path.unlink()
    train(fresh(), DATA, loss_fn, cfg, ckpt, evaluate=synthetic([]), stop=stop, curve_path=curve_path)
    assert ckpt.is_file() and curve_path.read_text() == first


def recording(values, seen: dict):
    """``synthetic(values)``, also keeping the module's weight at every evaluation (by step order)."""
    scripted = synthetic(values)

    def evaluate(m):
        seen[len(seen)] = m.weight.detach().clone()
        return scripted(m)
    return evaluate


def test_the_best_evaluation_is_published_and_a_continued_run_resumes_from_the_last(tmp_path):
    from common.training.loop import chosen_row, run_summary
    cfg = TrainConfig(lr=0.05, epochs=10, batch_size=8, checkpoint_every=3)  # 50 steps at most
    stop = Stopping(eval_every=5, patience=2, min_delta=0.01)
    peaked = [0.1, 0.3, 0.5, 0.4, 0.45]  # evaluations at steps 0, 5, 10, 15, 20: best at 10, flat at 20
    seen = {}
    m = fresh()
    log = train(m, DATA, loss_fn, cfg, tmp_path / "p.pt", evaluate=recording(peaked, seen), stop=stop)
    state = read_trained(tmp_path / "p.pt")
    assert state["stopped"] == "flat" and state["step"] == 20 and state["chosen_step"] == 10
    assert torch.equal(state["module"]["weight"], seen[2]) and torch.equal(state["last_module"]["weight"], seen[4])
    assert torch.equal(m.weight, seen[2])  # the caller's module holds what was published
    assert chosen_row(state)["heldout_top1"] == 0.5
    stats = run_summary(tmp_path / "p.pt", log, stop, cfg, time.perf_counter())
    assert stats["final"]["heldout_top1"] == 0.5 and stats["chosen_step"] == 10 and stats["steps"] == 20
    loaded = fresh()
    load_trained(loaded, tmp_path / "p.pt")
    assert torch.equal(loaded.weight, seen[2])

    last = fresh()  # restore_best off: the last step's weights, as before
    train(last, DATA, loss_fn, cfg, tmp_path / "l.pt", evaluate=synthetic(peaked),
          stop=dataclasses.replace(stop, restore_best=False))
    plain = read_trained(tmp_path / "l.pt")
    assert plain["chosen_step"] == 20 and torch.equal(plain["module"]["weight"], seen[4]) and "last_module" not in plain

    # more patience: the curve is not flat under it, so the run continues from its last weights
    # (not the published best) and ends as a run that had that patience from the start
    rising = [0.6 + 0.05 * i for i in range(6)]
    more = Stopping(eval_every=5, patience=4, min_delta=0.01)
    train(fresh(), DATA, loss_fn, cfg, tmp_path / "p.pt", evaluate=synthetic(rising), stop=more)
    straight = fresh()
    train(straight, DATA, loss_fn, cfg, tmp_path / "s.pt", evaluate=synthetic(peaked + rising), stop=more)
    a, b = read_trained(tmp_path / "p.pt"), read_trained(tmp_path / "s.pt")
    assert a["step"] == b["step"] == 50 and a["chosen_step"] == b["chosen_step"] == 50
    torch.testing.assert_close(a["module"]["weight"], b["module"]["weight"], rtol=0, atol=0)


def test_wall_budget_stops_with_a_last_evaluation(tmp_path):
    cfg = TrainConfig(lr=0.05, epochs=10, batch_size=8)

    def slow(m, b):
        time.sleep(0.05)
        return loss_fn(m, b)

    stop = Stopping(eval_every=100, patience=2, wall_budget_s=0.6)
    train(fresh(), DATA, slow, cfg, tmp_path / "w.pt", evaluate=synthetic([0.1 * i for i in range(60)]), stop=stop)
    state = read_trained(tmp_path / "w.pt")
    assert state["stopped"] == "wall budget" and 1 <= state["step"] < 50  # stopped before the 50 steps
    assert state["curve"][-1]["step"] == state["step"] and state["wall_s"] >= 0.6
    # the same budget again: nothing to do; a larger one continues the run and its curve
    first = state["step"]
    train(fresh(), DATA, slow, cfg, tmp_path / "w.pt", evaluate=synthetic([0.1 * i for i in range(60)]), stop=stop)
    assert read_trained(tmp_path / "w.pt")["step"] == first
    more = Stopping(eval_every=100, patience=2, wall_budget_s=state["wall_s"] + 0.6)
    started = time.perf_counter()
    log = train(fresh(), DATA, slow, cfg, tmp_path / "w.pt", evaluate=synthetic([0.1 * i for i in range(60)]), stop=more)
    again = read_trained(tmp_path / "w.pt")
    assert again["stopped"] == "wall budget" and first < again["step"] < 50
    assert again["curve"][:len(state["curve"])] == state["curve"] and again["wall_s"] >= state["wall_s"] + 0.6
    # the stats of the resumed run charge both sessions' training, not only the last one's
    from common.training.loop import run_summary
    stats = run_summary(tmp_path / "w.pt", log, more, cfg, started)
    assert stats["train_wall_s"] == again["wall_s"] >= state["wall_s"] + 0.6 and stats["session_wall_s"] > 0


def test_interrupted_run_resumes_to_the_same_parameters_and_curve(tmp_path):
    cfg = TrainConfig(lr=0.05, epochs=6, batch_size=8, checkpoint_every=4)
    stop = Stopping(eval_every=3, patience=2, min_delta=0.0)

    def heldout(m):  # a real held-out metric of the module: accuracy on the data
        x = torch.stack([d[0] for d in DATA])
        y = torch.tensor([d[1] for d in DATA])
        out = m(x)
        return {"heldout_loss": round(float(torch.nn.functional.cross_entropy(out, y)), 6),
                "heldout_top1": round(float((out.argmax(-1) == y).float().mean()), 6)}

    full = fresh()
    train(full, DATA, loss_fn, cfg, tmp_path / "a.pt", evaluate=heldout, stop=stop)
    part = fresh()
    calls = {"n": 0}

    def stopping(m, b):
        calls["n"] += 1
        if calls["n"] == 11:  # between the step-8 checkpoint and the step-12 one
            raise KeyboardInterrupt
        return loss_fn(m, b)

    with pytest.raises(KeyboardInterrupt):
        train(part, DATA, stopping, cfg, tmp_path / "b.pt", evaluate=heldout, stop=stop)
    with pytest.raises(UserError, match="unfinished"):
        read_trained(tmp_path / "b.pt")
    resumed = fresh()
    train(resumed, DATA, loss_fn, cfg, tmp_path / "b.pt", evaluate=heldout, stop=stop,
          curve_path=tmp_path / "b.jsonl")
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    a, b = read_trained(tmp_path / "a.pt"), read_trained(tmp_path / "b.pt")
    drop = lambda c: [{k: v for k, v in r.items() if k != "wall_s"} for r in c]  # noqa: E731
    assert drop(a["curve"]) == drop(b["curve"]) and a["stopped"] == b["stopped"] and a["step"] == b["step"]
    assert len((tmp_path / "b.jsonl").read_text().splitlines()) == len(b["curve"])
    assert b["curve"][-1]["wall_s"] >= b["curve"][-2]["wall_s"]


def _refuse_loading(monkeypatch, model=None):
    """Model loading returns ``model`` (or fails the test); building training data always fails."""
    import common.training.seqtrain
    import common.training.cli

    def load(name, **kw):
        if model is None:
            raise AssertionError("the model was loaded before the options were checked")
        return model, None

    monkeypatch.setattr(common.training.cli, "load_model", load)  # what component_main calls
    monkeypatch.setattr(common.training.seqtrain, "from_args", lambda *a: (_ for _ in ()).throw(
        AssertionError("the training data was built before the options were checked")))


@pytest.mark.parametrize("trainer, flags, says", [
    ("prompt_decoding.train", ["--m", "0"], "--m"),
    ("prompt_decoding.train", ["--n", "0"], "--n"),
    ("prompt_decoding.train", ["--cuts", "0"], "--cuts"),
    ("firp.train", ["--layers", "3,x"], "--layers"),
    ("firp.train", ["--anchors", "0"], "--anchors"),
    ("firp.train", ["--device", "nonsense"], "invalid device"),
])
def test_bad_trainer_options_fail_before_anything_is_loaded(monkeypatch, tmp_path, trainer, flags, says):
    import importlib
    _refuse_loading(monkeypatch)
    argv = ["--model", "m", "--out", str(tmp_path), "--corpus", str(tmp_path / "c.pt"),
            "--heldout-corpus", str(tmp_path / "h.pt"), *flags]
    with pytest.raises(UserError, match=says):
        importlib.import_module(trainer)._main(argv)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("trainer, flags, says", [
    # the data source's own flags (common.training.seqtrain / teacher / the EAGLE-3 corpus), checked by
    # component_main before the model loads, as the component's flags are
    ("firp.train", ["--corpus", "c.pt", "--heldout-corpus", "h.pt", "--prompts", "0"], "--prompts"),
    ("prompt_decoding.train", ["--corpus-dir", "nowhere", "--corpus-tokens", "0"], "--corpus-tokens"),
    ("firp.train", ["--corpus", "c.pt"], "--corpus-dir .* or both --corpus and --heldout-corpus"),
    ("common.components.eagle_head", ["--teacher", "t.pt"], "--heldout-corpus .* or --corpus-dir"),
    ("common.components.medusa_heads", ["--teacher", "t.pt", "--heldout-corpus", "h.pt", "--topk", "0"], "--topk"),
    ("common.components.eagle_head", ["--teacher", "t.pt", "--corpus-dir", "nowhere", "--corpus-tokens", "0"],
     "--corpus-tokens"),
    ("common.components.eagle3_head", ["--corpus-dir", "nowhere", "--corpus-tokens", "0"], "--corpus-tokens"),
])
def test_bad_data_flags_fail_before_the_model_loads(monkeypatch, tmp_path, trainer, flags, says):
    import importlib
    _refuse_loading(monkeypatch)
    with pytest.raises(UserError, match=says):
        importlib.import_module(trainer)._main(["--model", "m", "--out", str(tmp_path / "out"), *flags])
    assert not any(tmp_path.iterdir())


def test_firp_layers_beyond_the_model_fail_before_the_corpus_is_built(monkeypatch, tmp_path):
    from common.assets.models import tiny_llama
    from firp.train import _main
    tiny = tiny_llama(seed=0)  # its own copy: the trainer freezes the model it loads
    _refuse_loading(monkeypatch, tiny)
    argv = ["--model", "m", "--out", str(tmp_path), "--corpus", str(tmp_path / "c.pt"),
            "--heldout-corpus", str(tmp_path / "h.pt"), "--layers", f"1,{tiny.config.num_hidden_layers}"]
    with pytest.raises(UserError, match="layer"):
        _main(argv)


def test_corpus_cache_key_drops_default_settings():
    from common.training.corpus import answer_set_key as cache_key
    base = {"n_prompts": 32, "max_new_tokens": 128}
    assert cache_key(**base) == base
    assert cache_key(**base, skip=0, max_prompt_tokens=None, dataset="sharegpt", batch_size=8) == base
    assert cache_key(**base, max_prompt_tokens=256) == base  # answer_set's default
    assert cache_key(**base, skip=32, max_prompt_tokens=96) == {**base, "skip": 32, "max_prompt_tokens": 96}


def test_stats_name_the_code_a_training_started_with(monkeypatch, tmp_path):
    """A commit made while a training runs (hours, beside other work) is not the code that
    trained: the stats name the version read when the run started."""
    import common.training.cli
    from common.assets.models import tiny_llama
    versions = iter(["started-at", "committed-meanwhile"])
    monkeypatch.setattr(common.training.cli, "code_version", lambda: next(versions))
    monkeypatch.setattr(common.training.cli, "load_model", lambda *a, **k: (tiny_llama(seed=0), None))

    def add_data(ap):
        ap.add_argument("--data", default=None)

    def train_fn(a, model, tok, data, cfg, stop):
        return {"trained": True}
    common.training.cli.component_main("t", lambda ap: None, train_fn, (add_data, lambda a, m, t: None),
                                    ["--model", "m", "--out", str(tmp_path), "--stats-out", str(tmp_path / "s.json")])
    assert json.loads((tmp_path / "s.json").read_text())["code_version"] == "started-at"


def test_trainer_stats_name_the_digest_of_the_weights_decoders_load(monkeypatch, tmp_path):
    """weights_digest is the digest a benchmark keeps for the folder it loads (weights_path): the whole model's
    model/ subfolder where there is one (its training state beside it does not count), else --out."""
    import common.training.cli
    from common.records import content_digest
    monkeypatch.setattr(common.training.cli, "load_model", lambda *a, **k: (torch.nn.Linear(2, 2), None))
    monkeypatch.setattr(common.training.cli, "check_start", lambda *a: None)
    digests = {}
    for whole in (False, True):
        out = tmp_path / f"out{int(whole)}"

        def train_fn(a, model, tok, data, cfg, stop, out=out, whole=whole):
            (out / "model" if whole else out).mkdir(parents=True)
            torch.save({"module": {"w": torch.arange(3.0 + whole)}}, (out / "model" if whole else out) / "w.pt")
            if whole:
                torch.save({"module": {"w": torch.zeros(5)}}, out / "train.pt")
            return {}
        common.training.cli.component_main("t", lambda ap: None, train_fn, (lambda ap: None, lambda a, m, t: None),
                                        ["--model", "m", "--out", str(out), "--stats-out", str(tmp_path / f"s{int(whole)}.json")])
        stats = json.loads((tmp_path / f"s{int(whole)}.json").read_text())
        digests[whole] = stats["weights_digest"]
        assert digests[whole] == content_digest(out / "model" if whole else out)
        assert stats["weights_path"] == str(out / "model" if whole else out)  # the path records name it by
    assert digests[True] != content_digest(tmp_path / "out1")  # the folder with train.pt is another digest
