"""The cost-curve tool: records per q, ratios to q=1, bad input as one error line; the limit
columns of cross.table computed from the curve."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.harness.cost_curve import cost_curve


def test_cost_curve_records(tiny, one_thread):
    rows = cost_curve(tiny, [4, 2], context=20, rounds=4, warmup=1)
    assert [r["q"] for r in rows] == [1, 2, 4]  # q=1 added, sorted
    assert rows[0]["ratio"] == 1.0
    for r in rows:
        assert r["ms"] > 0 and r["ms_q1"] <= r["ms"] <= r["ms_q3"] and r["context"] == 20


@pytest.mark.parametrize("args,msg", [
    (["--q", "0,2"], "--q '0,2' is invalid; valid: comma-separated integers >= 1"),
    (["--q", "a"], "--q 'a' is invalid"),
    (["--rounds", "2"], "valid: context >= 1, rounds >= 4"),
])
def test_cost_bad_input(tmp_path, args, msg):
    out = tmp_path / "c.jsonl"
    p = subprocess.run([sys.executable, "-m", "common.harness.cost_curve", "--model", "smollm2-135m-instruct",
                        "--out", str(out), *args], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: {p.stderr.strip()[7:]}"] and msg in p.stderr
    assert not out.exists()


def _rec(decoder, qid, new, steps, wall, proposed=None, path="fast", device="cpu: A"):
    return {"question_id": qid, "decoder": decoder, "tokens": [1] * new, "new_tokens": new, "steps": steps,
            "wall_time": wall, "peak_mem_bytes": 1, "forward_path": path, "device": device,
            "extra": {} if proposed is None else {"proposed": proposed}}


CURVE = [{"q": 1, "ms": 40.0, "forward_path": "fast"}, {"q": 4, "ms": 40.0, "forward_path": "fast"},
         {"q": 16, "ms": 64.0, "forward_path": "fast"}, {"q": 1, "ms": 60.0, "forward_path": "stock"}]
CURVE = [{**r, "device": "cpu: A"} for r in CURVE]


def test_limit_columns_by_hand():
    from common.cost import cost_of
    from common.harness.report import limits

    ratio = cost_of(CURVE)
    assert ratio(1) == 1.0 and ratio(4) == 1.0 and ratio(10) == pytest.approx(1.3) and ratio(28) == pytest.approx(2.2)
    recs = [_rec("vanilla", "a", 12, 12, 1.2), _rec("vanilla", "b", 8, 8, 0.8),
            # 4 steps: the prefill, then trees of 15 nodes (q = 16: cost 1.6) and 3 nodes (q = 4: cost 1.0)
            _rec("tree", "a", 12, 4, 0.6, proposed=[0, 15, 15, 3]), _rec("tree", "b", 8, 4, 0.4, proposed=[0, 15, 3, 3]),
            _rec("lookup", "a", 12, 6, 0.6), _rec("lookup", "b", 8, 4, 0.4)]
    t = limits(recs, CURVE).set_index("decoder")
    cost = (1.6 + 1.6 + 1.0 + 1.6 + 1.0 + 1.0) / 6
    assert t.loc["tree", "step_cost"] == pytest.approx(cost)
    tau = 20 / 8
    assert t.loc["tree", "limit"] == pytest.approx(tau / cost)
    assert t.loc["tree", "pct_of_limit"] == pytest.approx(100 * 2.0 / (tau / cost))  # speedup 2 (20 tok/s vs 10)
    assert t.loc["vanilla", "limit"] == 1.0
    assert t.loc["lookup"].isna().all()  # no per-step proposals recorded: no limit claimed


def test_limits_refuse_mixed_forward_paths_and_a_curve_without_q1():
    from common.cost import cost_of
    from common.harness.report import limits

    recs = [_rec("vanilla", "a", 4, 4, 1.0), _rec("tree", "a", 4, 2, 0.5, proposed=[0, 3], path="stock")]
    with pytest.raises(ValueError, match="forward paths"):
        limits(recs, CURVE)
    with pytest.raises(ValueError, match="q=1"):
        cost_of([{"q": 4, "ms": 1.0, "forward_path": "fast"}])


def test_a_curve_of_other_hardware_claims_no_limit():
    """T(q) is the machine's own: records of another device get blank limit columns, and a
    hardware-aware choice that asks for that device's curve is refused."""
    from common.cost import cost_of
    from common.harness.report import limits

    recs = [_rec("vanilla", "a", 12, 12, 1.2, device="cpu: B"),
            _rec("tree", "a", 12, 4, 0.6, proposed=[0, 15, 15, 3], device="cpu: B")]
    t = limits(recs, CURVE).set_index("decoder")
    assert t[["step_cost", "limit", "pct_of_limit"]].isna().all().all() and set(t.index) == {"vanilla", "tree"}
    assert limits([{**r, "device": "cpu: A"} for r in recs], CURVE).limit.notna().all()
    with pytest.raises(ValueError, match="measured on .*cpu: A.*not on 'cpu: B'"):
        cost_of(CURVE, device="cpu: B")
    assert cost_of(CURVE, device="cpu: A")(4) == 1.0


def test_a_run_must_hold_exactly_its_configured_decoders():
    """check_decoders: a record missing a configured label (added to the config after the run) or
    holding one the config no longer lists is an error, never a silently shorter table."""
    import pytest

    from common.harness.report import check_decoders
    recs = [{"decoder": "vanilla"}, {"decoder": "eagle@dyn16"}]
    check_decoders(recs, ["vanilla", "eagle@dyn16"], "bench_eagle.jsonl", "cross.groups.eagle")
    with pytest.raises(ValueError, match="lists vanilla, eagle@dyn16, eagle@v8k"):
        check_decoders(recs, ["vanilla", "eagle@dyn16", "eagle@v8k"], "bench_eagle.jsonl", "cross.groups.eagle")
    with pytest.raises(ValueError, match="has decoders vanilla, eagle@dyn16"):
        check_decoders(recs, ["vanilla"], "bench_eagle.jsonl", "cross.groups.eagle")


def test_a_run_must_hold_its_configured_settings():
    """check_decoders with the config's options: a label that ran with other options than the
    config sets now (a setting re-chosen after the run) is an error naming both; options naming a
    trained component (a folder in the record, "{name}" in the config), labels the options do not
    name and records older than decoder_config are not judged."""
    from common.harness.report import check_decoders, stale_settings

    options = {"bild@noloss": {"small": "{bild_small_aligned}", "fallback_threshold": 0.4, "rollback_threshold": 2.0}}
    ran = lambda fb, rb: {"decoder": "bild@noloss", "decoder_config": {  # noqa: E731
        "small": ".cache/components/embedded/bild_small_aligned/model", "fallback_threshold": fb, "rollback_threshold": rb}}
    van = {"decoder": "vanilla", "decoder_config": {}}
    check_decoders([van, ran(0.4, 2)], ["vanilla", "bild@noloss"], "study_x.jsonl", "study.bench", options)
    with pytest.raises(ValueError, match=r"ran bild@noloss with .*'fallback_threshold': 0.2.* where config study.bench "
                                         r"now sets .*'fallback_threshold': 0.4"):
        check_decoders([van, ran(0.2, 4.0)], ["vanilla", "bild@noloss"], "study_x.jsonl", "study.bench", options)
    assert stale_settings([van, ran(0.2, 4.0)], options) == {
        "bild@noloss": ({"fallback_threshold": 0.2, "rollback_threshold": 4.0},
                        {"fallback_threshold": 0.4, "rollback_threshold": 2.0})}
    assert stale_settings([{"decoder": "bild@noloss"}, {**van, "decoder": "other", "decoder_config": {"x": 1}}], options) == {}
    dropped = {"decoder": "bild@noloss", "decoder_config": {"fallback_threshold": 0.4}}  # an option since added
    assert set(stale_settings([dropped], options)) == {"bild@noloss"}
    # the run's sampling (a sampled section's flags) is the run's to say, unless the label's options set it
    sampled = ran(0.4, 2.0)
    sampled["decoder_config"].update(temperature=1.0, seed=0, acceptance="typical")
    assert stale_settings([sampled], options) == {}
    pinned = {"bild@noloss": {**options["bild@noloss"], "temperature": 0.5}}
    assert set(stale_settings([sampled], pinned)) == {"bild@noloss"}


def test_step_times_by_hand():
    """Milliseconds per step: the target's forwards, the proposer's own work (draft forwards and
    REST's per-step retrieval times) and the rest; blank where the records time no target forward."""
    from common.harness.report import step_times
    recs = [{"decoder": "vanilla", "steps": 10, "wall_time": 1.0, "extra": {}},
            {"decoder": "rest", "steps": 4, "wall_time": 1.0,
             "extra": {"target_forward_s": 0.6, "retrieval_s": [0.05, 0.05, 0.05, 0.05]}},
            {"decoder": "rest", "steps": 6, "wall_time": 1.0, "extra": {"target_forward_s": 0.8, "retrieval_s": [0.0] * 6}},
            {"decoder": "eagle", "steps": 5, "wall_time": 0.5, "extra": {"target_forward_s": 0.3, "draft_forward_s": 0.1}}]
    t = step_times(recs).set_index("decoder")
    assert t.loc["vanilla", "step_ms"] == pytest.approx(100.0) and t.loc["vanilla", ["target_ms", "propose_ms"]].isna().all()
    assert t.loc["rest", "step_ms"] == pytest.approx(200.0)          # 2 s over 10 steps
    assert t.loc["rest", "target_ms"] == pytest.approx(140.0)        # 1.4 s
    assert t.loc["rest", "propose_ms"] == pytest.approx(20.0)        # 0.2 s of retrieval
    assert t.loc["rest", "other_ms"] == pytest.approx(40.0)
    assert (t.loc["eagle", ["target_ms", "propose_ms", "other_ms"]].tolist()
            == pytest.approx([60.0, 20.0, 20.0]))


def test_one_curve_per_host_each_record_read_against_its_own(tmp_path):
    """Several hosts' curves in one list: every limit and cost reads only its own device's
    points (host B's flat curve would give the tree another step cost), a device-less lookup is
    refused, and the rule's latest file wins over a kept copy of the same host."""
    from common.cost import cost_curve_paths, cost_of, read_cost_curves
    from common.harness.report import limits

    curve_b = [{"q": 1, "ms": 10.0, "forward_path": "fast", "device": "cpu: B"},
               {"q": 16, "ms": 10.0, "forward_path": "fast", "device": "cpu: B"}]
    both = CURVE + curve_b
    assert cost_of(both, device="cpu: A")(16) == pytest.approx(1.6) and cost_of(both, device="cpu: B")(16) == 1.0
    with pytest.raises(ValueError, match="several devices"):
        cost_of(both)
    recs_b = [_rec("vanilla", "a", 12, 12, 1.2, device="cpu: B"),
              _rec("tree", "a", 12, 3, 0.6, proposed=[0, 15, 15], device="cpu: B")]
    assert limits(recs_b, both).set_index("decoder").loc["tree", "step_cost"] == pytest.approx(1.0)
    assert limits([{**r, "device": "cpu: A"} for r in recs_b], both).set_index("decoder").loc[
        "tree", "step_cost"] == pytest.approx(1.6)

    raw = tmp_path / "cross" / "raw"
    (raw / "cost_curves").mkdir(parents=True)
    write = lambda p, rs: p.write_text("".join(json.dumps(r) + "\n" for r in rs))  # noqa: E731
    write(raw / "cost_curve.jsonl", curve_b)
    stale_b = [{**r, "ms": 99.0 * r["q"]} for r in curve_b]  # an older measurement of host B, kept
    write(raw / "cost_curves" / "b.jsonl", stale_b)
    write(raw / "cost_curves" / "a.jsonl", CURVE)
    inputs = [raw / "cost_curves" / "b.jsonl", tmp_path / "x" / "bench_y.jsonl", raw / "cost_curves" / "a.jsonl",
              raw / "cost_curve.jsonl"]
    paths = cost_curve_paths(inputs)
    assert paths == [raw / "cost_curve.jsonl", raw / "cost_curves" / "a.jsonl", raw / "cost_curves" / "b.jsonl"]
    merged = read_cost_curves(inputs)
    assert sorted(r["ms"] for r in merged if r["device"] == "cpu: B") == [10.0, 10.0]  # the rule's file wins
    assert len([r for r in merged if r["device"] == "cpu: A"]) == len(CURVE)


def test_keep_tool_and_the_artifacts_reading_kept_curves(tmp_path):
    """tools/cost_curves.py keep copies each host's curve under cross/raw/cost_curves/, and an
    artifact that reads the cost curve declares every kept one (so a rerun on another host
    leaves the old host's records their curve); keeping without a curve is one error line."""
    import dataclasses

    from common.config import load_profile
    from common.workflow.artifacts import artifact_inputs

    root = tmp_path / "results"
    tool = [sys.executable, str(Path(__file__).resolve().parents[2] / "tools" / "cost_curves.py")]
    bad = subprocess.run([*tool, "keep", "--results-root", str(root)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1
    assert "run rule cost_curve first" in bad.stderr and not (root / "cross" / "raw" / "cost_curves").exists()

    raw = root / "cross" / "raw"
    raw.mkdir(parents=True)
    dev = "cpu: Intel(R) Xeon(R) Processor (family 6 model 167) (2 threads), torch 2.13.0+cpu"
    (raw / "cost_curve.jsonl").write_text("".join(json.dumps({**r, "device": dev}) + "\n" for r in CURVE))
    ok = subprocess.run([*tool, "keep", "--results-root", str(root)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    kept = raw / "cost_curves" / "cpu-intel-r-xeon-r-processor-family-6-model-167-2-threads-torch-2.13.0-cpu.jsonl"
    assert [json.loads(line) for line in kept.read_text().splitlines()] == [{**r, "device": dev} for r in CURVE]
    listed = subprocess.run([*tool, "list", "--results-root", str(root)], capture_output=True, text=True).stdout
    assert listed.count(dev) == 2  # the rule's file and the kept copy

    prof = dataclasses.replace(load_profile(None, "embedded"), results_root=str(root))
    for aid in ("cross.table", "pd.table1", "study.positions", "cost.fig"):
        assert str(kept) in artifact_inputs(prof, aid)
    kept.unlink()
    assert not any("cost_curves" in p for p in artifact_inputs(prof, "cross.table"))  # none kept: none declared
