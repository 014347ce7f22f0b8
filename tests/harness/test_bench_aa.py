"""The A/A pair (vanilla twice, interleaved per prompt) and the noise every speedup carries."""
import math

import pytest

from common.harness import bench
from common.errors import UserError
from common.records import read_jsonl
from common.harness.report import AA_LABEL, NO_AA, aa_spread, noise_line, speedup_interval, summarize, within_noise


def _recs(rates: dict[str, list[float]]) -> list[dict]:
    """Records of decoders at given tokens/s per prompt (10 new tokens each)."""
    return [{"question_id": q, "decoder": d, "tokens": [1, 2], "new_tokens": 10, "steps": 10,
             "wall_time": 10 / r, "peak_mem_bytes": 0}
            for d, rs in rates.items() for q, r in enumerate(rs)]


def test_aa_adds_vanilla_last_and_needs_vanilla(tmp_path):
    args = bench.parse_args(["--model", "m", "--decoders", "vanilla,prompt_lookup", "--dataset", "mt-bench",
                             "--aa", "--out", str(tmp_path / "o.jsonl")])
    names, _ = bench.validate(args)
    assert list(names) == ["vanilla", "prompt_lookup", AA_LABEL] and names[AA_LABEL] == "vanilla"
    args = bench.parse_args(["--model", "m", "--decoders", "prompt_lookup", "--dataset", "mt-bench", "--aa",
                             "--out", str(tmp_path / "o.jsonl")])
    with pytest.raises(UserError, match="--aa pairs vanilla with itself"):
        bench.validate(args)


def test_a_group_can_list_the_pair_itself(tmp_path):
    args = bench.parse_args(["--model", "m", "--decoders", f"vanilla,{AA_LABEL}", "--dataset", "mt-bench",
                             "--out", str(tmp_path / "o.jsonl")])
    assert bench.validate(args)[0] == {"vanilla": "vanilla", AA_LABEL: "vanilla"}


def test_aa_run_interleaves_the_pair_per_prompt(tmp_path, embedded, monkeypatch):
    monkeypatch.setattr(bench, "load_model", lambda *a, **k: embedded)
    out = tmp_path / "o.jsonl"
    bench.main(["--model", "smollm2-135m-instruct", "--decoders", "vanilla,prompt_lookup", "--dataset", "mt-bench",
                "--n", "2", "--max-new-tokens", "4", "--aa", "--out", str(out)])
    recs = read_jsonl(out)
    assert [r["decoder"] for r in recs] == ["vanilla", "prompt_lookup", AA_LABEL] * 2
    for a, b in zip(recs[::3], recs[2::3]):
        assert a["question_id"] == b["question_id"] and a["tokens"] == b["tokens"]
    assert aa_spread(recs) is not None


def test_spread_intervals_and_noise_line():
    recs = _recs({"vanilla": [10, 10, 10, 10], "fast": [20, 20, 20, 20], AA_LABEL: [11, 11, 11, 11]})
    assert aa_spread(recs) == pytest.approx(0.1)
    lo, hi = speedup_interval(recs, "fast")
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)  # no spread across prompts
    s = summarize(recs).set_index("decoder")
    assert s.loc["fast", "speedup_lo"] <= s.loc["fast", "speedup"] <= s.loc["fast", "speedup_hi"]
    line = noise_line({"g": recs})
    assert line.startswith("g: A/A spread 10.0%") and "over 4 prompts" in line
    no_pair = [r for r in recs if r["decoder"] != AA_LABEL]
    assert aa_spread(no_pair) is None and NO_AA in noise_line({"g": no_pair})


def test_interval_widens_with_prompt_to_prompt_spread():
    recs = _recs({"vanilla": [10, 10, 10, 10, 10, 10], "x": [5, 30, 8, 25, 12, 20]})
    lo, hi = speedup_interval(recs, "x")
    s = summarize(recs).set_index("decoder").loc["x", "speedup"]
    assert lo < s < hi and hi - lo > 0.3
    assert speedup_interval(recs, "x") == (lo, hi)  # seeded: a re-render gives the same interval
    assert all(math.isnan(v) for v in speedup_interval(recs, "absent"))


def test_within_noise():
    assert within_noise(1.00, 1.02, 0.03) and not within_noise(1.00, 1.10, 0.03)
    assert not within_noise(1.00, 1.00, None)  # no pair: the noise is unknown, never "within"
