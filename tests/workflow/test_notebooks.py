"""Notebooks match their sources, hold only their own artifact's cells, read exactly the
declared raw records and never replace a committed table when a render fails."""
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_notebook  # noqa: E402

from common.config import load_profile, read_config  # noqa: E402
from common.workflow.artifacts import artifact_inputs, cross_joined, load_artifacts  # noqa: E402


def test_notebooks_are_rebuilt_from_sources():
    assert make_notebook.stale() == []


def test_stale_notebook_is_detected(tmp_path, monkeypatch):
    """The drift check fails on a hand edit (so the test above can fail)."""
    nb = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", nb)
    (nb / "cross.table.ipynb").write_text((nb / "cross.table.ipynb").read_text().replace("speedup", "speed-up"))
    (tmp_path / "config").symlink_to(ROOT / "config")
    monkeypatch.setattr(make_notebook, "ROOT", tmp_path)
    assert make_notebook.stale() == ["notebooks/cross.table.ipynb"]


@pytest.mark.parametrize("aid", sorted(load_artifacts()))
def test_notebook_holds_only_its_own_artifact(aid):
    nb = nbformat.read(ROOT / "notebooks" / f"{aid}.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "if artifact_id" not in code and "elif artifact_id" not in code
    assert f'artifact_id = "{aid}"' in nb.cells[0].source and "parameters" in nb.cells[0].metadata["tags"]


def _render(aid, root, out):
    """Run artifact ``aid``'s notebook by hand on the records under ``root`` (no inputs passed)."""
    spec = load_artifacts()[aid]
    return subprocess.run([sys.executable, "-m", "common.harness.execute",
                           str(ROOT / "notebooks" / f"{aid}.ipynb"), str(out), "-p", "artifact_id", aid,
                           "-p", "results_root", str(root), "-p", "package", spec["package"],
                           "-p", "profile", "embedded"], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture
def cross_copy(tmp_path):
    """A copy of the committed cross results, and the paper runs cross.joins adds, under a
    temporary results root."""
    shutil.copytree(ROOT / "results" / "cross", tmp_path / "cross")
    for rel in cross_joined(load_profile(None, "embedded")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "results" / rel, tmp_path / rel)
    return tmp_path


def test_stray_raw_file_is_ignored_and_numbers_reproduce(cross_copy):
    raw = cross_copy / "cross" / "raw"
    shutil.copy(raw / "bench_baselines.jsonl", raw / "bench_stray.jsonl")
    r = _render("cross.table", cross_copy, cross_copy / "out.ipynb")
    assert r.returncode == 0, r.stderr[-2000:]
    new = (cross_copy / "cross" / "tables" / "cross.table.csv").read_text()
    assert new == (ROOT / "results" / "cross" / "tables" / "cross.table.csv").read_text()
    assert "stray" not in new


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_bad_input_fails_naming_it_and_keeps_the_table(cross_copy, damage):
    victim = cross_copy / "cross" / "raw" / "bench_medusa.jsonl"
    if damage == "missing":
        victim.unlink()
    else:
        victim.write_text(victim.read_text()[:5000])
    tables = cross_copy / "cross" / "tables"
    before = {p.name: p.read_bytes() for p in tables.iterdir()}
    r = _render("cross.table", cross_copy, cross_copy / "out.ipynb")
    assert r.returncode != 0
    assert "bench_medusa.jsonl" in r.stderr and ("missing" if damage == "missing" else "truncated") in r.stderr
    assert {p.name: p.read_bytes() for p in tables.iterdir()} == before


def test_joined_run_on_other_prompts_is_refused(cross_copy):
    """A paper run joins cross.table only on the cross groups' model and dataset."""
    import json
    rel = load_profile(None, "embedded").raw["cross"]["joins"]["firp"]["record"]
    f = cross_copy / rel
    f.write_text("".join(json.dumps({**json.loads(line), "dataset": "humaneval"}) + "\n"
                         for line in f.read_text().splitlines()))
    before = (cross_copy / "cross" / "tables" / "cross.table.csv").read_bytes()
    r = _render("cross.table", cross_copy, cross_copy / "out.ipynb")
    assert r.returncode != 0 and "cross.joins.firp" in r.stderr and "humaneval" in r.stderr
    assert (cross_copy / "cross" / "tables" / "cross.table.csv").read_bytes() == before


def test_declared_inputs_follow_the_config():
    """A group added to cross.groups adds its record to the declared inputs."""
    cfg = read_config()
    cfg["profiles"]["embedded"]["cross"]["groups"]["extra"] = ["vanilla", "hf_generate"]
    got = artifact_inputs(load_profile(cfg, "embedded"), "cross.table")
    assert "results/cross/raw/bench_extra.jsonl" in got and "results/cross/raw/medusa_stats.json" in got
    cfg["profiles"]["embedded"]["cross"]["joins"] = {"firp": {"record": "firp/raw/bench_x.jsonl",
                                                              "stats": "firp/raw/maps_stats.json", "decoders": ["firp"]}}
    got = artifact_inputs(load_profile(cfg, "embedded"), "cross.table")
    assert "results/firp/raw/bench_x.jsonl" in got and "results/firp/raw/maps_stats.json" in got
    assert "results/firp/raw/bench_mt-bench.jsonl" not in got
    # "{?firp.medusa_own}": the Medusa-1 record is an input only where the profile trains it
    assert "results/firp/raw/medusa_own_stats.json" in artifact_inputs(load_profile(cfg, "embedded"), "firp.fig3")
    del cfg["profiles"]["embedded"]["firp"]["medusa_own"]
    got = artifact_inputs(load_profile(cfg, "embedded"), "firp.fig3")
    assert got and not any("medusa_own" in p for p in got)


def test_small_model_curves_are_inputs_only_where_small_models_train():
    """components.fig reads BiLD's small models' curves where the profile trains them
    (bild.small_layers); null there (the paper profile's released T5/mT5 small models) leaves
    them out, as an absent key would."""
    cfg = read_config()
    got = artifact_inputs(load_profile(cfg, "embedded"), "components.fig")
    assert {"results/bild/raw/small_aligned_curve.jsonl", "results/bild/raw/small_unaligned_stats.json",
            "results/bild/raw/compact_curve.jsonl"} <= set(got)
    cfg["profiles"]["embedded"]["bild"]["small_layers"] = None
    got = artifact_inputs(load_profile(cfg, "embedded"), "components.fig")
    assert got and not any("small_" in p for p in got)
