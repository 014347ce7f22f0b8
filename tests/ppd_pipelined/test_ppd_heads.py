"""Pipelined decoding (ppd_pipelined): intermediate heads: training lowers the loss, and a resumed run equals an uninterrupted one."""
import pytest
import torch

import ppd_pipelined.heads as H
from common.errors import UserError
from common.training.loop import run_path
from ppd_pipelined.config import HeadsConfig

LAYERS = [1, 2]


pytestmark = pytest.mark.usefixtures("one_thread")


def sequences(n, length=24, vocab=96, seed=0):
    """A learnable toy language: each token determines the next ((7 t + 3) mod vocab)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = int(torch.randint(3, vocab, (1,), generator=g))
        ids = [t]
        for _ in range(length - 1):
            t = (7 * t + 3) % vocab
            ids.append(t)
        out.append({"ids": ids, "start": 4, "question_id": str(i)})
    return out


CFG = HeadsConfig(sequences=8, holdout=4, max_len=24, epochs=2, lr=5e-3, batch_size=2, warmup_frac=0.04,
                  checkpoint_every=2, seed=0)


def test_training_reduces_loss_and_starts_at_lm_head(tiny, tmp_path):
    data = (sequences(8), sequences(4, seed=1))
    heads = H.new_heads(tiny, LAYERS)
    for h in heads.heads:  # initialized from (a copy of) the model's LM head
        assert torch.equal(h.weight, tiny.lm_head.weight) and h.weight.data_ptr() != tiny.lm_head.weight.data_ptr()
    s = H.train_heads(tiny, None, LAYERS, CFG, tmp_path, tmp_path / "log.jsonl", sequences=data)
    for l in LAYERS:
        assert s["holdout_after"][str(l)]["loss"] < s["holdout_before"][str(l)]["loss"] - 0.1
    assert s["steps"] == 8 and (tmp_path / "log.jsonl").read_text().count("\n") == 8
    assert not any(p.requires_grad for p in tiny.parameters())  # the model stayed frozen
    loaded = H.load_heads(tiny, tmp_path / "heads.pt")
    assert loaded.layers == LAYERS
    state = torch.load(tmp_path / f"head_l{LAYERS[0]}.pt")  # the decoder's head= format
    assert set(state) == {"weight"} and torch.equal(state["weight"], loaded.head(LAYERS[0]).weight)


def test_resume_equals_uninterrupted(tiny, tmp_path, monkeypatch):
    data = (sequences(8), sequences(4, seed=1))
    H.train_heads(tiny, None, LAYERS, CFG, tmp_path / "full", sequences=data, evaluate_holdout=False)
    full = torch.load(tmp_path / "full" / "heads.pt", weights_only=False)

    real, calls = H.heads_loss, {"n": 0}

    def crash_after_5(*a, **kw):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(H, "heads_loss", crash_after_5)
    with pytest.raises(KeyboardInterrupt):
        H.train_heads(tiny, None, LAYERS, CFG, tmp_path / "resumed", sequences=data, evaluate_holdout=False)
    # the run's state sits beside the final checkpoint, which exists only once training ends
    # (Snakemake deletes a rerun job's outputs; the state it resumes from is not one of them)
    assert not (tmp_path / "resumed" / "heads.pt").exists()
    part = torch.load(run_path(tmp_path / "resumed" / "heads.pt"), weights_only=False)
    assert part["step"] == 4 and not part["done"]  # the last checkpoint before the crash
    monkeypatch.setattr(H, "heads_loss", real)
    H.train_heads(tiny, None, LAYERS, CFG, tmp_path / "resumed", sequences=data, evaluate_holdout=False)
    res = torch.load(tmp_path / "resumed" / "heads.pt", weights_only=False)
    assert res["done"] and res["step"] == full["step"]
    for k, v in full["module"].items():
        assert torch.equal(v, res["module"][k]), k
    assert [r["loss"] for r in res["log"]] == [r["loss"] for r in full["log"]]


def test_bad_layers_and_foreign_checkpoint(tiny, tmp_path):
    with pytest.raises(UserError, match="layer=4 is outside the model's layers; valid: 1..3"):
        H.new_heads(tiny, [4])
    with pytest.raises(UserError, match="does not exist"):
        H.load_heads(tiny, tmp_path / "none.pt")
    data = (sequences(2), sequences(1, seed=1))
    cfg = HeadsConfig(sequences=2, holdout=1, max_len=24, epochs=1, lr=1e-3, batch_size=2)
    H.train_heads(tiny, None, [1], cfg, tmp_path, sequences=data, evaluate_holdout=False)
    from common.assets.models import tiny_llama
    other = tiny_llama(seed=1, layers=6)
    with pytest.raises(UserError, match="was trained for"):
        H.load_heads(other, tmp_path / "heads.pt")


def test_early_stopping_writes_the_held_out_curve(tiny, tmp_path):
    """With eval_every the run keeps a learning curve of the watched match with the final
    layer (one point before training, then every eval_every steps) and says why it stopped."""
    import dataclasses
    import json
    data = (sequences(8), sequences(4, seed=1))
    cfg = dataclasses.replace(CFG, eval_every=2, patience=2, min_delta=0.0)
    s = H.train_heads(tiny, None, LAYERS, cfg, tmp_path, sequences=data, curve_path=tmp_path / "curve.jsonl")
    curve = [json.loads(line) for line in (tmp_path / "curve.jsonl").read_text().splitlines()]
    # the untrained evaluation is the curve's first point, not a second pass; after: the trained heads
    assert s["holdout_before"] == curve[0]["detail"]
    untrained = H.evaluate(tiny, H.new_heads(tiny, LAYERS), data[1])
    for k, v in untrained.items():
        assert s["holdout_before"][k] == (v if k == "tokens" else pytest.approx(v))
    # the published heads are those of the best held-out match (Stopping.restore_best)
    best = max(curve, key=lambda c: (c["heldout_match"], c["step"]))
    assert s["chosen_step"] == best["step"]
    for k, v in best["detail"].items():
        assert s["holdout_after"][k] == (v if k == "tokens" else pytest.approx(v))
    assert curve[0]["step"] == 0 and [c["step"] for c in curve[1:]] == list(range(2, s["steps"] + 1, 2))
    for c in curve:
        assert len(c["heldout_match_by_layer"]) == len(LAYERS) and len(c["heldout_loss"]) == len(LAYERS)
        assert c["heldout_match"] == pytest.approx(sum(c["heldout_match_by_layer"]) / len(LAYERS))
    assert curve[-1]["heldout_loss"][0] < curve[0]["heldout_loss"][0]
    assert s["stopped"] in ("flat", "epochs")
    with pytest.raises(UserError, match="eval_every"):
        dataclasses.replace(CFG, eval_every=0)
