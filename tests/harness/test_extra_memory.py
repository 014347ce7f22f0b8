"""A decoder's extra memory is what its calls add above what was live when they began, against
vanilla's in the same records; records that predate per-call growth get none (their
``peak_mem_bytes`` counted every page earlier calls had left to the allocator)."""
from common.harness import bench
from common.records import read_jsonl
from common.harness.report import extra_memory

MIB = 2**20


def _rec(q, decoder, growth=None, peak=1000 * MIB):
    r = {"question_id": q, "decoder": decoder, "tokens": [1], "new_tokens": 1, "steps": 1, "wall_time": 1.0,
         "peak_mem_bytes": peak}
    if growth is not None:
        r["mem_growth_bytes"] = growth
    return r


def test_extra_memory_is_the_largest_call_growth_minus_vanillas():
    recs = [_rec(0, "vanilla", 10 * MIB), _rec(0, "tree", 40 * MIB), _rec(1, "vanilla", 30 * MIB),
            _rec(1, "tree", 50 * MIB)]
    assert extra_memory(recs) == {"vanilla": 0.0, "tree": 20.0}


def test_records_without_growth_get_no_extra_memory():
    # the old records: peaks that earlier calls set, so the differences would read ~0
    old = [_rec(0, "vanilla", peak=5000 * MIB), _rec(0, "lookahead", peak=5000 * MIB)]
    assert extra_memory(old) == {"vanilla": None, "lookahead": None}
    mixed = old + [_rec(1, "vanilla", 1 * MIB), _rec(1, "lookahead", 9 * MIB)]  # a resumed run across the change
    assert extra_memory(mixed) == {"vanilla": None, "lookahead": None}
    assert extra_memory([_rec(0, "tree", 1 * MIB)]) == {"tree": None}  # no vanilla to compare with


def test_bench_records_carry_the_growth_of_each_call(tmp_path, embedded, monkeypatch):
    monkeypatch.setattr(bench, "load_model", lambda *a, **k: embedded)
    out = tmp_path / "o.jsonl"
    bench.main(["--model", "smollm2-135m-instruct", "--decoders", "vanilla,prompt_lookup", "--dataset", "mt-bench",
                "--n", "2", "--max-new-tokens", "4", "--out", str(out)])
    recs = read_jsonl(out)
    assert all(0 <= r["mem_growth_bytes"] <= r["peak_mem_bytes"] for r in recs)
    assert set(extra_memory(recs)) == {"vanilla", "prompt_lookup"} and extra_memory(recs)["vanilla"] == 0.0
