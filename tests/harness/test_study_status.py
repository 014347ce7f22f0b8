"""tools/study_status.py: which of the study's datasets are done, partial (and on which machine),
or not started, and a rough estimate of the machine time left."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import study_status  # noqa: E402


def _rec(qid, decoder, wall, digest, tree=16):
    return {"question_id": qid, "decoder": decoder, "wall_time": wall, "device": "cpu: test (2 threads)",
            "code_version": "abc123", "decoder_config": {"heads": "h", "tree": tree}, "components": {"heads": digest}}


def test_done_partial_and_the_estimate(tmp_path, monkeypatch):
    from common.records import ResumeLog

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    raw = tmp_path / ".cache" / "smoke" / "results" / "cross" / "raw"   # the smoke profile's results root
    raw.mkdir(parents=True)
    (raw / "study_mt-bench.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [_rec("81", "vanilla", 2.0, "d1"), _rec("81", "medusa@t16", 1.0, "d1")]))
    log = ResumeLog.for_output(raw / "study_sharegpt-qa.jsonl", {"hardware": "cpu: other (2 threads)"})
    log.load()  # a started run that has finished no prompt yet

    table, comps = study_status.status("smoke", root=tmp_path)
    rows = table.set_index("dataset")
    assert rows.loc["mt-bench", "state"] == "done" and rows.loc["mt-bench", "finished"] == 1
    assert rows.loc["mt-bench", "hardware"] == "cpu: test (2 threads)" and rows.loc["mt-bench", "s_per_prompt"] == 3.0
    assert rows.loc["sharegpt-qa", "state"] == "partial" and rows.loc["sharegpt-qa", "hardware"] == "cpu: other (2 threads)"
    # left: the partial dataset's one prompt at the finished runs' mean of 3 s per prompt
    assert rows.loc["mt-bench", "min_left_est"] == 0 and abs(rows.loc["sharegpt-qa", "min_left_est"] - 3 / 60) < 1e-9
    assert comps == "medusa@t16.heads d1 (every run); vanilla.heads d1 (every run)"


def test_a_run_of_a_setting_the_config_has_since_changed_is_stale(tmp_path, monkeypatch):
    """A dataset whose record ran a label with other options than the config sets now is
    'stale', and its whole run counts as left (its decoders are rerun interleaved with vanilla)."""
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    raw = tmp_path / ".cache" / "smoke" / "results" / "cross" / "raw"
    raw.mkdir(parents=True)
    (raw / "study_mt-bench.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [_rec("81", "vanilla", 2.0, "d1"), _rec("81", "medusa@t16", 1.0, "d1", tree=63)]))
    rows = study_status.status("smoke", root=tmp_path)[0].set_index("dataset")
    assert rows.loc["mt-bench", "state"] == "stale: medusa@t16"
    cmds = study_status.next_commands(rows.reset_index(), "smoke", ".cache/smoke/results")
    assert cmds[0].startswith("next (mt-bench, stale: medusa@t16): .venv/bin/snakemake -f "
                              ".cache/smoke/results/cross/raw/study_mt-bench.jsonl -j1 ")
    assert cmds[0].endswith("--config profile=smoke rerun=true") and len(cmds) == len(rows)  # the others: not started
    assert " -f " not in cmds[1]
    assert abs(rows.loc["mt-bench", "min_left_est"] - rows.loc["mt-bench", "prompts"] * 3 / 60) < 1e-9


def test_nothing_run_yet(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    table, comps = study_status.status("smoke", root=tmp_path)
    assert set(table.state) == {"not started"} and comps == "no runs yet"
    assert table.min_left_est.isna().all()  # no finished prompt anywhere: no estimate, not a made-up one


def test_unknown_profile_is_one_error_line():
    r = subprocess.run([sys.executable, "tools/study_status.py", "--profile", "gpu"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["error: unknown profile 'gpu'; valid: embedded, paper, paper-tiny, smoke"]
