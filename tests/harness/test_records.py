"""Two writers given the same output path never corrupt it: the final file is one writer's
complete records (the issue: a shared ``.partial``, NUL bytes, a crash at the rename)."""
import multiprocessing as mp
import stat

import pytest

from common.records import JsonlWriter, read_jsonl


def _records(who: str, n: int) -> list[dict]:
    return [{"writer": who, "i": i, "pad": "x" * 200} for i in range(n)]


def test_interleaved_writers_each_commit_their_own_complete_file(tmp_path):
    out = tmp_path / "bench.jsonl"
    a, b = JsonlWriter(out), JsonlWriter(out)
    assert a.tmp != b.tmp
    for ra, rb in zip(_records("a", 50), _records("b", 30) + [None] * 20):
        a.write(ra)
        if rb:
            b.write(rb)
    a.commit()
    assert read_jsonl(out) == _records("a", 50)
    b.commit()  # the shared-.partial writer crashed here (its file had been renamed away)
    assert read_jsonl(out) == _records("b", 30)
    assert not list(tmp_path.glob("*.partial"))


def test_final_file_has_ordinary_permissions(tmp_path):
    out = tmp_path / "r.jsonl"
    with JsonlWriter(out) as w:
        w.write({"x": 1})
    assert out.stat().st_mode & stat.S_IRGRP  # mkstemp's 0600 would hide results from the group


def test_failed_writer_leaves_nothing(tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError):
        with JsonlWriter(out) as w:
            w.write({"x": 1})
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def _write_in_process(path, who, n, both_open):
    w = JsonlWriter(path)
    both_open.wait()  # both temporary files exist before anyone writes: maximal overlap
    for r in _records(who, n):
        w.write(r)
    w.commit()


def test_concurrent_processes_leave_one_complete_run(tmp_path):
    out = tmp_path / "bench.jsonl"
    ctx = mp.get_context("spawn")
    both_open = ctx.Barrier(2)
    procs = [ctx.Process(target=_write_in_process, args=(out, who, 2000, both_open)) for who in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]  # neither crashed at the rename
    recs = read_jsonl(out)
    assert recs in (_records("a", 2000), _records("b", 2000))
    assert b"\0" not in out.read_bytes()
    assert not list(tmp_path.glob("*.partial"))


def test_resume_log_keeps_units_drops_a_torn_tail_and_refuses_other_settings(tmp_path):
    from common.errors import UserError
    from common.records import ResumeLog

    path = tmp_path / "run.jsonl"
    log = ResumeLog(path, {"n": 4, "decoders": {"vanilla": "vanilla"}})
    assert log.load() == {}
    log.append("81", [{"decoder": "vanilla", "tokens": [1, 2]}])
    log.append("82", [{"decoder": "vanilla", "tokens": [3]}])
    with open(path, "a") as fh:
        fh.write('{"key": "83", "records": [{"deco')  # killed mid-write
    again = ResumeLog(path, {"n": 4, "decoders": {"vanilla": "vanilla"}})
    assert again.load() == {"81": [{"decoder": "vanilla", "tokens": [1, 2]}], "82": [{"decoder": "vanilla", "tokens": [3]}]}
    assert "83" not in path.read_text()  # the torn line is gone, later appends stay parseable
    with pytest.raises(UserError, match=r"other settings \(n: 4 -> 5\)"):
        ResumeLog(path, {"n": 5, "decoders": {"vanilla": "vanilla"}}).load()
    again.remove()
    assert not path.exists()


def test_a_resume_error_names_what_changed_in_a_short_line(tmp_path):
    """The refusal names the first differing settings with long values cut, not both mappings
    (a benchmark's settings run to ~1,000 characters)."""
    from common.errors import UserError
    from common.records import ResumeLog

    path = tmp_path / "run.jsonl"
    big = {f"k{i}": "x" * 200 for i in range(10)}
    ResumeLog(path, big).load()
    with pytest.raises(UserError) as e:
        ResumeLog(path, {**big, "k1": "y", "k2": "z" * 300, "k3": 1, "k4": [2], "new": 5}).load()
    msg = str(e.value)
    assert "k1: " in msg and "-> \"y\"" in msg and "and 2 more" in msg and len(msg) < 400, msg


def test_bench_resume_is_refused_on_other_hardware(tmp_path, monkeypatch):
    """A benchmark's resume log names the machine: a later session on another CPU does not
    continue it (its means would mix two machines' timings), it is told to start afresh."""
    import argparse

    from common.harness import bench
    from common.errors import UserError

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    args = argparse.Namespace(model="m", dataset="mt-bench", prompts=None, n=4, template="chat", max_new_tokens=8,
                              max_prompt_tokens=512, truncate=None, dtype="float32", device="cpu", threads=2,
                              stock=False, profile="embedded", out=str(tmp_path / "bench.jsonl"))
    monkeypatch.setattr(bench, "describe", lambda device: "cpu: AMD EPYC (family 26 model 2) (2 threads)")
    log = bench.resume_log(args, {"vanilla": "vanilla"}, {})
    log.load()
    log.append("81", [{"decoder": "vanilla", "tokens": [1]}])
    assert bench.resume_log(args, {"vanilla": "vanilla"}, {}).load() == {"81": [{"decoder": "vanilla", "tokens": [1]}]}
    monkeypatch.setattr(bench, "describe", lambda device: "cpu: Intel(R) Xeon(R) Processor (family 6 model 167) (2 threads)")
    with pytest.raises(UserError, match="other settings"):
        bench.resume_log(args, {"vanilla": "vanilla"}, {}).load()


def test_content_digest_names_the_weights_not_the_path(tmp_path):
    """Records name a component by path; the digest tells a retrained one from the one before."""
    from common.harness.bench import component_digests
    from common.records import content_digest

    a = tmp_path / "a" / "model"
    a.mkdir(parents=True)
    (a / "config.json").write_text("{}")
    (a / "model.safetensors").write_bytes(b"\x00" * 64)
    b = tmp_path / "b"
    b.mkdir()
    (b / "model").mkdir()
    (b / "model" / "config.json").write_text("{}")
    (b / "model" / "model.safetensors").write_bytes(b"\x00" * 64)
    assert content_digest(a) == content_digest(b / "model")     # same content elsewhere: same digest
    (b / "model" / "model.safetensors").write_bytes(b"\x00" * 63 + b"\x01")
    assert content_digest(a) != content_digest(b / "model")     # retrained weights: another digest
    assert len(content_digest(a / "config.json")) == 16
    got = component_digests({"draft": str(a), "gamma": 4, "mode": "static", "heads": str(tmp_path / "absent")})
    assert got == {"draft": content_digest(a)}                  # only options that name something on disk
    # a benchmarked model that is a local folder (BiLD's exit models) is digested too; a converted model's name is not
    from common.harness.bench import model_digest
    assert model_digest(str(a)) == {"model_digest": content_digest(a)} and model_digest("smollm2-135m-instruct") == {}


def test_decoded_weights_tells_a_benchmark_of_older_weights():
    """A training record against its benchmark's records: the same digest, another (a retraining
    after the benchmark), or none on either side (written before digests existed)."""
    from common.harness.report import decoded_weights

    recs = [{"model_digest": "aa"}, {"model_digest": "aa"}]
    assert decoded_weights({"model_digest": "aa"}, recs) == "benchmarked with these weights"
    assert decoded_weights({"model_digest": "bb"}, recs).startswith("benchmarked with other weights (aa; trained bb)")
    assert decoded_weights({}, recs).startswith("benchmarked weights unknown")
    assert decoded_weights({"model_digest": "aa"}, [*recs, {}]).startswith("benchmarked weights unknown")
    assert decoded_weights({"model_digest": "aa"}, []).startswith("benchmarked weights unknown")


def test_stats_match_joins_a_training_with_the_records_that_loaded_its_path():
    """cross.table's same_weights: the stats' weights_digest against the components digest of the
    records whose options name weights_path (normalised); other components of the records do not count."""
    from common.harness.report import stats_match

    rec = {"decoder": "speculative", "decoder_config": {"draft": "c/draft/model", "gamma": 4},
           "components": {"draft": "aa"}}
    other = {"decoder": "speculative", "decoder_config": {"heads": "c/medusa"}, "components": {"heads": "zz"}}
    stats = {"weights_path": "c/draft/model/", "weights_digest": "aa"}
    assert stats_match(stats, [rec, rec, other]) == "yes"
    assert stats_match({**stats, "weights_digest": "bb"}, [rec]) == "no"   # retrained after the benchmark
    assert stats_match({**stats, "weights_digest": "bb"}, [rec, {**rec, "components": {"draft": "bb"}}]) == "no"
    assert stats_match({"steps": 3}, [rec]) == "unknown"                    # stats before the digests
    assert stats_match(stats, [{**rec, "components": {}}]) == "unknown"     # a record before the digests
    assert stats_match(stats, [other]) == "unknown"                         # no record loaded the path


def test_content_digest_counts_published_weights_so_a_kept_copy_digests_like_the_original(tmp_path):
    """A training's checkpoint folder (optimizer state, restore_best's copies, the run state,
    logs) and the kept copy tools/keep_components.py makes of it hold the same weights: one digest."""
    import torch

    from common.records import content_digest

    module = {"w": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}
    trained, kept = tmp_path / "cache" / "eagle", tmp_path / "kept" / "eagle"
    trained.mkdir(parents=True)
    kept.mkdir(parents=True)
    torch.save({"module": module, "optimizer": {"m": torch.ones(6)}, "best": {"params": module}, "step": 9},
               trained / "head.pt")
    (trained / "head.pt.run").write_bytes(b"run state")
    (trained / "curve.jsonl").write_text('{"step": 9}\n')
    (trained / "stats.json").write_text('{"wall": 1}')
    (trained / "tree_8.json").write_text("[[0]]")
    torch.save({"module": {k: v.clone() for k, v in module.items()}, "step": 9}, kept / "head.pt")
    (kept / "stats.json").write_text('{"wall": 1, "kept": true}')
    (kept / "tree_8.json").write_text("[[0]]")
    assert content_digest(trained) == content_digest(kept)
    (kept / "tree_8.json").write_text("[[0, 1]]")                     # what decoding reads beside the weights
    assert content_digest(trained) != content_digest(kept)
    (kept / "tree_8.json").write_text("[[0]]")
    module["w"][0, 0] = 1e-7                                          # one weight apart
    torch.save({"module": module, "step": 9}, kept / "head.pt")
    assert content_digest(trained) != content_digest(kept)
