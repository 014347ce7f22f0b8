"""tools/before_after.py: the retraining's before/after tables come from two commits' records."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("before_after_tool", Path(__file__).resolve().parents[2] / "tools" / "before_after.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def write(repo: Path, rel: str, rows: list[dict]) -> None:
    p = repo / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))


def bench(decoder: str, qid: str, new: int, steps: int, wall: float) -> dict:
    return {"question_id": qid, "decoder": decoder, "tokens": [1] * new, "new_tokens": new, "steps": steps,
            "wall_time": wall, "peak_mem_bytes": 1, "device": "cpu: test"}


def commit(repo: Path, msg: str) -> None:
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", msg],
                   check=True)


def test_before_after_reads_each_side_from_its_commit(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    write(repo, "results/x/raw/heads_curve.jsonl", [{"step": 10, "examples_seen": 40, "heldout_top1": [0.2, 0.1]}])
    write(repo, "results/x/raw/bench_g.jsonl", [bench("vanilla", "1", 10, 10, 1.0), bench("m", "1", 10, 5, 0.8)])
    write(repo, "results/x/raw/untouched.jsonl", [bench("vanilla", "1", 10, 10, 1.0)])
    commit(repo, "before")
    write(repo, "results/x/raw/heads_curve.jsonl", [{"step": 10, "examples_seen": 40, "heldout_top1": [0.2, 0.1]},
                                                    {"step": 90, "examples_seen": 360, "heldout_top1": [0.45, 0.2]},
                                                    {"step": 120, "examples_seen": 480, "heldout_top1": [0.4, 0.2]}])
    # early stopping kept the weights of step 90: that evaluation is the component's, not the last
    (repo / "results/x/raw/heads_stats.json").write_text(json.dumps({"stopped": "flat", "chosen_step": 90}))
    write(repo, "results/x/raw/bench_g.jsonl", [bench("vanilla", "1", 10, 10, 1.0), bench("m", "1", 10, 4, 0.5)])
    commit(repo, "after")

    out = tmp_path / "note.md"
    tool.main(["HEAD~1", "HEAD", "--repo", str(repo), "--out", str(out)])
    text = out.read_text()
    comp = tool.components("HEAD~1", "HEAD", tool.changed("HEAD~1", "HEAD"))
    row = comp.set_index("component").loc["x/raw/heads"]
    assert (row.top1_before, row.top1_after, row.examples_after, row.stopped_after) == (0.2, 0.45, 480, "flat")
    b = tool.benchmarks("HEAD~1", "HEAD", tool.changed("HEAD~1", "HEAD")).set_index("decoder")
    assert b.loc["m", "tau_before"] == 2.0 and b.loc["m", "tau_after"] == 2.5
    assert b.loc["m", "speedup_before"] == pytest.approx(1.25) and b.loc["m", "speedup_after"] == pytest.approx(2.0)
    assert "untouched" not in text and "x/raw/heads" in text and b.loc["m", "device_before"] == "cpu: test"


def test_a_revision_that_is_not_a_commit_is_one_error_line(tmp_path, capsys):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    with pytest.raises(SystemExit) as e:
        tool.main(["nope", "HEAD", "--repo", str(repo)])
    assert str(e.value).startswith("error: 'nope' is not a commit")
