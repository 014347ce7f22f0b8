"""The early-exit notebook source (bild.fig6, bild.fig7) run in-process, cell by cell as
tools/make_notebook.py splits it, on synthetic raw records of the smoke profile: it reads exactly
the declared inputs and writes its table and figure (no model, no papermill)."""
import sys
from pathlib import Path

import pytest

from common.config import load_profile
from common.workflow.artifacts import artifact_inputs, load_artifacts
from common.records import write_json, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_notebook  # noqa: E402


def _rec(decoder, qid, text, wall, tokens, model, extra=None):
    return {"decoder": decoder, "question_id": qid, "text": text, "reference": "the cat sat on the mat",
            "wall_time": wall, "tokens": tokens, "new_tokens": len(tokens), "extra": extra or {},
            "model": model, "profile": "smoke", "device": "cpu", "dataset": "sharegpt-summarize",
            "model_digest": "a" * 16}


def _fake_inputs(paths):
    for p in map(Path, paths):
        p.parent.mkdir(parents=True, exist_ok=True)
        name = p.name
        if name.startswith("exit_sweep_"):
            loss = p.stem.rsplit("_", 1)[1]
            model = f".cache/components/smoke/bild_exit_{loss}/model"
            recs = [_rec("vanilla", "q1", "the cat sat on the mat", 2.0, [1, 2, 3], model),
                    _rec("vanilla", "q2", "the cat sat", 2.0, [1, 2], model)]
            if loss == "bild":
                for lab, text, wall in (("bild@fb0.5_rb1", "the cat sat on the mat", 1.2), ("bild@fb0.8_rb1", "the cat", 0.9)):
                    ex = {"source": ["large", "small", "small"], "fallbacks": 1, "rollbacks": 0}
                    recs += [_rec(lab, "q1", text, wall, [1, 2, 3], model, ex),
                             _rec(lab, "q2", "the cat sat", wall, [1, 2], model, {**ex, "source": ["large", "small"]})]
            else:
                ex = {"exit_layers": [30, 10, 12], "early_exits": 2}
                recs += [_rec("calm@l0.9_t4", "q1", "the dog", 1.1, [1, 2, 3], model, ex),
                         _rec("calm@l0.9_t4", "q2", "the cat", 1.1, [1, 2], model, {**ex, "exit_layers": [30, 9]})]
            write_jsonl(p, recs)
        elif name.endswith("_stats.json"):
            write_json(p, {"layers": 30, "steps": 4, "stopped": "flat", "labels": "text", "trained_params": 1000,
                           "train_positions": 64, "batch_positions": 32, "train_wall_s": 12.0, "config": {"epochs": 2},
                           # BiLD's head is the one its sweep decoded; CALM's was retrained after its sweep
                           "model_digest": ("a" if "bild" in name else "c") * 16,
                           "untrained": {"heldout_loss": 3.0, "heldout_top1": [0.2, 0.5], "heldout_agree": [0.3, 1.0]},
                           "final": {"heldout_loss": 2.5, "heldout_top1": [0.3, 0.5], "heldout_agree": [0.5, 1.0]}})
        elif name.endswith("_curve.jsonl"):
            write_jsonl(p, [{"step": s, "heldout_top1": [0.2 + s / 100, 0.5], "heldout_agree": [0.3 + s / 100, 1.0]}
                            for s in (0, 2, 4)])
        else:
            raise AssertionError(f"unexpected input {p}")


@pytest.mark.parametrize("aid", ["bild.fig6", "bild.fig7"])
def test_notebook_cells_render_on_synthetic_records(tmp_path, aid, monkeypatch, capsys):
    import dataclasses

    spec = load_artifacts()[aid]
    prof = dataclasses.replace(load_profile(None, "smoke"), results_root=str(tmp_path))
    inputs = artifact_inputs(prof, aid)
    _fake_inputs(inputs)
    src = (ROOT / "notebooks" / "src" / f"{spec['notebook']}.py").read_text()
    monkeypatch.chdir(ROOT)
    env = {"artifact_id": aid, "results_root": str(tmp_path), "package": spec["package"], "profile": "smoke",
           "inputs": inputs, "__name__": "notebook"}
    for kind, ids, body in make_notebook.cells_of(src):
        if kind == "code" and (ids is None or aid in ids):
            exec(compile(body, f"{aid} cell", "exec"), env)
    base = tmp_path / "bild"
    assert (base / "tables" / f"{aid}.csv").is_file() and (base / "figures" / f"{aid}.png").is_file()
    out = capsys.readouterr().out
    assert "paper's" in out
    md = (base / "tables" / f"{aid}.md").read_text()
    assert "bild: 4 steps, stopped: flat, benchmarked with these weights" in md
    if aid == "bild.fig7":
        assert f"calm: 4 steps, stopped: flat, benchmarked with other weights ({'a' * 16}; trained {'c' * 16})" in md
