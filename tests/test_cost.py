"""The cost-curve tool: records per q, ratios to q=1, bad input as one error line."""
import subprocess
import sys

import pytest

from common.cost import cost_curve


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
    p = subprocess.run([sys.executable, "-m", "common.cost", "--model", "smollm2-135m-instruct",
                        "--out", str(out), *args], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: {p.stderr.strip()[7:]}"] and msg in p.stderr
    assert not out.exists()
