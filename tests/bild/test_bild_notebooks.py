"""BiLD's Figures 2, 8 and 10 and Table 1 (with the reduced-vocabulary rows) render from raw
records shaped as their rules write them (made up here for the smoke profile's one task and two
variants; no model runs)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import load_profile
from common.workflow.artifacts import artifact_inputs, load_artifacts

ROOT = Path(__file__).resolve().parents[2]
IDS = ("bild.fig2", "bild.fig8", "bild.fig10", "bild.table1")
COMPACT = ".cache/components/smoke/bild_compact/model"  # the folder the compact rows load
META = {"model": "m", "dataset": "d", "profile": "smoke", "device": "cpu", "dtype": "float32", "max_new_tokens": 8,
        "code_version": "x"}


def _sweep(variant):
    out = []
    for q, ref in (("q1", "the cat sat on the mat"), ("q2", "a quick brown fox")):
        out.append({"question_id": q, "decoder": "vanilla", "text": ref, "reference": ref, "wall_time": 2.0,
                    "tokens": [1, 2, 3], "new_tokens": 3, "prompt_tokens": 5, "extra": {}, **META})
        extra = {"source": ["large", "small", "small"], "segments": [["large", ref[:3]], ["small", ref[3:]]],
                 "large_calls": [[0, 5], [6, 3]], "small_calls": [[0, 6], [6, 1]], "fallbacks": 0, "rollbacks": 0}
        out.append({"question_id": q, "decoder": "bild@fb0.5_rb2", "text": ref, "reference": ref, "wall_time": 1.0,
                    "tokens": [1, 2, 3], "new_tokens": 3, "prompt_tokens": 5, "extra": extra, **META})
    return out


def _reduced(keep, compact_layers=None):
    """The reduced-vocabulary sweep: vanilla, the full head, the reduced one and the compact model
    (label suffixes)."""
    recs = _sweep("aligned")
    slow = [{**r, "decoder": r["decoder"] + f"_v{keep}", "wall_time": 1.5} for r in recs if r["decoder"] != "vanilla"]
    compact = [] if compact_layers is None else [
        {**r, "decoder": r["decoder"] + f"_l{compact_layers}v{keep}", "wall_time": 0.8,
         "decoder_config": {"small": COMPACT}, "components": {"small": "old0"}} for r in recs if r["decoder"] != "vanilla"]
    return recs + slow + compact


def _oracle(variant):
    out = []
    for q, ref in (("q1", "the cat sat on the mat"), ("q2", "a quick brown fox")):
        for setting, t, text, engaged in (("small", 0.0, "a dog", 0), ("oracle", 0.5, ref, 1), ("large", None, ref, 3)):
            out.append({"question_id": q, "setting": setting, "threshold": t, "text": text, "reference": ref,
                        "tokens": [1, 2, 3], "new_tokens": 3, "engaged": engaged, "changed": min(engaged, 1),
                        "small": f"small_{variant}", **META})
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    raw = root / "bild" / "raw"
    raw.mkdir(parents=True)
    shape = {"kind": "decoder-only", "d_model": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "vocab": 96}
    models = [{"task": "summarize", "role": "large", "layers": "4", "params": 100000, **shape},
              {"task": "summarize", "role": "small", "layers": "1", "params": 30000, **shape}]
    for name, recs in [("models.jsonl", models)] + [
            (f"{kind}_summarize_{v}.jsonl", fn(v)) for v in ("unaligned", "aligned")
            for kind, fn in (("sweep", _sweep), ("oracle", _oracle))]:
        (raw / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    rv = load_profile(None, "smoke").raw["bild"]["reduced_vocab"]
    keep, layers = rv["keep"], rv.get("compact_layers")
    (raw / "reduced_vocab_sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _reduced(keep, layers)))
    if layers is not None:
        (raw / "compact_stats.json").write_text(json.dumps(
            {"layers": layers, "keep": keep, "steps": 40, "stopped": "flat", "final": {"heldout_top1": 0.3},
             "params_not_shared": 1000, "head_params": 500,
             "weights_path": COMPACT, "weights_digest": "new1"}))  # retrained after its sweep
    (raw / "reduced_vocab_stats.json").write_text(json.dumps(
        {"keep": keep, "vocab": 96, "labels": "greedy", "train_coverage": 0.98, "heldout_coverage": 0.9}))
    return root


@pytest.mark.parametrize("aid", IDS)
def test_renders_from_records(root, aid):
    import dataclasses

    prof = dataclasses.replace(load_profile(None, "smoke"), results_root=str(root))
    assert all(Path(p).is_file() for p in artifact_inputs(prof, aid))  # the records the rule declares
    spec = load_artifacts()[aid]
    r = subprocess.run([sys.executable, "-m", "common.harness.execute",
                        str(ROOT / "notebooks" / f"{aid}.ipynb"), str(root / f"{aid}.ipynb"), "-p", "artifact_id", aid,
                        "-p", "results_root", str(root), "-p", "package", spec["package"], "-p", "profile", "smoke"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    table = (root / "bild" / "tables" / f"{aid}.md").read_text()
    if aid == "bild.fig2":
        assert "oracle" in table and (root / "bild" / "figures" / "bild.fig2.png").is_file()
    elif aid == "bild.table1":
        import pandas as pd
        t = pd.read_csv(root / "bild" / "tables" / "bild.table1.csv").set_index(["variant", "cell"])
        keep = load_profile(None, "smoke").raw["bild"]["reduced_vocab"]["keep"]
        assert t.loc[("aligned, full head (reduced sweep's run)", "no_loss"), "speedup"] == pytest.approx(2.0)
        assert t.loc[(f"aligned, {keep}-token head (beyond the paper)", "no_loss"), "speedup"] == pytest.approx(2 / 1.5)
        assert "98.0% of those labels" in table
        assert load_profile(None, "smoke").raw["bild"]["reduced_vocab"].get("compact_layers")  # the compact rows exist
        assert "the sweep decoded these weights: no" in table  # stats new1, records old0
        # the reduced rows scored against their own run's vanilla text too (the same text here)
        assert t.loc[(f"aligned, {keep}-token head (beyond the paper)", "no_loss"), "quality_vs_large"] == pytest.approx(100.0)
    elif aid == "bild.fig8":
        assert "bild@fb0.5_rb2 (no_loss)" in table and "paper: cnndm" in table
    else:
        assert "**the**" in table and "a dog" in table
