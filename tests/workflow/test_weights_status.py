"""Which benchmark records decoded weights their components no longer hold:
common.harness.report.weights_status (the comparison) and tools/weights_status.py (the references: the
cache, the trainings' stats, the kept copy, the newest record), and tools/study_status.py's use of it."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import weights_status as tool  # noqa: E402

from common.records import content_digest  # noqa: E402
from common.harness.report import decoded_components, weights_status  # noqa: E402


def _rec(decoder, path, digest, opt="heads"):
    return {"question_id": "1", "decoder": decoder, "decoder_config": {opt: path, "tree": 16}, "components": {opt: digest}}


def test_decoded_components_by_path_from_options_and_local_models():
    recs = [_rec("medusa@t16", "c/medusa", "aa"), _rec("medusa@t63", "c/medusa", "aa"), {"decoder": "vanilla"},
            {"decoder": "bild@x", "model": "c/exit", "model_digest": "ee", "decoder_config": {}}]
    assert decoded_components(recs) == {"c/medusa": {"medusa@t16.heads": {"aa"}, "medusa@t63.heads": {"aa"}},
                                        "c/exit": {"bild@x.model": {"ee"}}}


def test_the_reference_is_the_local_copy_else_the_newest_record():
    runs = {"old": [_rec("medusa@t16", "c/medusa", "aa"), _rec("spec", "c/draft", "d1", "draft")],
            "new": [_rec("medusa@t63", "c/medusa", "bb"), _rec("spec", "c/draft", "d2", "draft")],
            "alone": [_rec("bild", "c/small", "ss", "small")]}
    t = weights_status(runs, {"old": 1.0, "new": 2.0, "alone": 3.0}, now={"c/medusa": ("aa", "cache")})
    state = {(r.run, r.path): r.state for r in t.itertuples()}
    # the cache holds the old run's heads: the newer run decoded others, though it is newer
    assert state["old", "c/medusa"] == "current" and state["new", "c/medusa"] == "stale"
    # no copy here: the run committed last decoded what the path holds now
    assert state["new", "c/draft"] == "current" and state["old", "c/draft"] == "stale"
    assert t.set_index(["run", "path"]).loc[("old", "c/draft"), "reference"] == "d2 (newest record (new))"
    # one run names the path and nothing else says what it holds: not judged
    assert state["alone", "c/small"] == "unchecked"
    # a run that was resumed across a retraining decoded two weights: stale against either
    mixed = {"a": [_rec("m", "c/m", "x"), _rec("m", "c/m", "y")]}
    assert weights_status(mixed, {}, now={"c/m": ("x", "cache")}).state.tolist() == ["stale"]


def test_a_file_added_to_the_folder_since_is_not_a_retraining():
    runs = {"r": [_rec("medusa@t16", "c/medusa", "before")], "s": [_rec("medusa@t16", "c/medusa", "other")]}
    t = weights_status(runs, {}, now={"c/medusa": ("after", "cache")},
                       earlier={"c/medusa": {"before": "vocab.json was added to the folder since"}})
    rows = t.set_index("run")
    assert rows.loc["r", "state"] == "current" and "vocab.json was added" in rows.loc["r", "note"]
    assert rows.loc["s", "state"] == "stale" and rows.loc["s", "note"] == ""


def test_content_digest_without_a_file_is_the_folder_before_it(tmp_path):
    d = tmp_path / "heads"
    d.mkdir()
    torch.save({"module": {"w": torch.arange(4.0)}}, d / "heads.pt")
    before = content_digest(d)
    (d / "draft_vocab.json").write_text("[1, 2]")
    assert content_digest(d) != before
    assert content_digest(d, without=("draft_vocab.json",)) == before
    assert tool.earlier_digests(d) == {before: "draft_vocab.json was added to the folder since",
                                       content_digest(d, without=("heads.pt",)): "heads.pt was added to the folder since"}


def test_a_datastore_rebuilt_since_its_meta_dropped_the_build_time_is_the_same(tmp_path, monkeypatch):
    """Older builders wrote build_s into datastore.json (and the same JSON as the rule's stats):
    a record of such a build names the rebuilt folder's arrays under another digest."""
    from common.components.rest_datastore import build_datastore

    new = tmp_path / "ds"
    stats = build_datastore([[1, 2, 3], [2, 3, 4]], new, 8, "t", "t", "test")
    old = tmp_path / "old"
    shutil.copytree(new, old)
    (old / "datastore.json").write_text(json.dumps(stats, indent=1))   # the old builder's meta
    other = dict(stats, build_s=stats["build_s"] + 1, sequences=3)     # another datastore's stats
    monkeypatch.setattr(tool, "committed_versions", lambda pattern, root=tool.ROOT: [
        json.dumps(other, indent=1).encode(), b"not json", json.dumps(stats, indent=1).encode()])
    found = tool.datastore_meta_digests(new)
    assert content_digest(old) != content_digest(new)
    assert list(found) == [content_digest(old)] and "build time" in found[content_digest(old)]
    assert tool.datastore_meta_digests(tmp_path / "nothing") == {}


def _write(path: Path, recs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _profile_tree(tmp_path, monkeypatch):
    """A smoke-profile results tree under tmp_path, whose cache path names a component folder."""
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    raw = tmp_path / ".cache" / "smoke" / "results" / "cross" / "raw"
    comp = ".cache/components/smoke/medusa"
    return raw, comp


def test_the_tool_finds_the_kept_copy_and_the_cache(tmp_path, monkeypatch):
    raw, comp = _profile_tree(tmp_path, monkeypatch)
    kept = tmp_path / "results" / "cross" / "checkpoints" / "smoke" / "medusa"
    kept.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(3)}}, kept / "heads.pt")
    ours = content_digest(kept)
    _write(raw / "bench_medusa.jsonl", [_rec("medusa@t16", comp, ours)])
    _write(raw / "bench_old.jsonl", [_rec("medusa@t16", comp, "0123456789abcdef")])
    _write(raw / "draft_curve.jsonl", [{"step": 1, "loss": 2.0}])   # names no component: not a run
    t = tool.status("smoke", root=tmp_path).set_index("run")
    assert sorted(t.index) == [".cache/smoke/results/cross/raw/bench_medusa.jsonl", ".cache/smoke/results/cross/raw/bench_old.jsonl"]
    assert t.loc[".cache/smoke/results/cross/raw/bench_medusa.jsonl", "state"] == "current"
    assert t.loc[".cache/smoke/results/cross/raw/bench_old.jsonl", "state"] == "stale"
    assert t.loc[".cache/smoke/results/cross/raw/bench_old.jsonl", "reference"] == f"{ours} (kept results/cross/checkpoints/smoke/medusa)"
    # the cache's copy comes first: retrained there, every record above is stale against it
    (tmp_path / comp).mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(3)}}, tmp_path / comp / "heads.pt")
    t = tool.status("smoke", root=tmp_path)
    assert set(t.state) == {"stale"} and all(r.endswith("(cache)") for r in t.reference)


def test_a_trainings_stats_come_before_the_kept_copy(tmp_path, monkeypatch):
    """A fresh clone has no cache; a component retrained since its copy was kept names its new
    weights in its stats (weights_path, weights_digest): records of the kept weights are stale."""
    raw, comp = _profile_tree(tmp_path, monkeypatch)
    kept = tmp_path / "results" / "cross" / "checkpoints" / "smoke" / "medusa"
    kept.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(3)}}, kept / "heads.pt")
    _write(raw / "bench_medusa.jsonl", [_rec("medusa@t16", comp, content_digest(kept))])
    _write(raw / "bench_new.jsonl", [_rec("medusa@t16", comp, "feedfacefeedface")])
    stats = raw / "medusa_stats.json"
    stats.write_text(json.dumps({"weights_path": comp + "/", "weights_digest": "feedfacefeedface"}))
    t = tool.status("smoke", root=tmp_path).set_index("run")
    run = ".cache/smoke/results/cross/raw/bench_"
    assert t.loc[run + "medusa.jsonl", "state"] == "stale" and t.loc[run + "new.jsonl", "state"] == "current"
    assert t.loc[run + "medusa.jsonl", "reference"] == (
        "feedfacefeedface (stats .cache/smoke/results/cross/raw/medusa_stats.json)")
    stats.write_text(json.dumps({"steps": 3}))   # stats written before trainings named their weights
    t = tool.status("smoke", root=tmp_path).set_index("run")
    assert t.loc[run + "medusa.jsonl", "state"] == "current"   # the kept copy again


def test_a_whole_model_kept_as_a_delta_is_the_model_it_was_kept_from(tmp_path, monkeypatch):
    """tools/keep_components.py keeps a draft's model/ folder as a delta against the base model; its
    digest is the original folder's, read off the manifest (the delta's bytes are not the model's)."""
    from common.components.draft_model import truncated_copy
    from common.assets.models import checkpoint_dir, tiny_llama
    from common.weights_delta import split

    raw, _ = _profile_tree(tmp_path, monkeypatch)
    comp = ".cache/components/smoke/draft/model"
    base = tiny_llama(seed=1, layers=3, vocab=128, hidden=32)
    base.save_pretrained(checkpoint_dir("tiny-base"))
    model = tmp_path / "orig"
    truncated_copy(base, 1).save_pretrained(model)
    digest = content_digest(model)
    kept = tmp_path / "results" / "cross" / "checkpoints" / "smoke" / "draft" / "model"
    kept.mkdir(parents=True)
    (kept / "config.json").write_bytes((model / "config.json").read_bytes())
    (kept / "generation_config.json").write_bytes((model / "generation_config.json").read_bytes())
    split(model / "model.safetensors", checkpoint_dir("tiny-base") / "model.safetensors",
          kept / "model.safetensors.delta", "tiny-base", extra={"folder_digest": digest})
    _write(raw / "bench_speculative.jsonl", [_rec("speculative", comp, digest, "draft")])
    _write(raw / "bench_older.jsonl", [_rec("speculative", comp, "0123456789abcdef", "draft")])
    t = tool.status("smoke", root=tmp_path).set_index("run")
    assert t.loc[".cache/smoke/results/cross/raw/bench_speculative.jsonl", "state"] == "current"
    assert t.loc[".cache/smoke/results/cross/raw/bench_older.jsonl", "state"] == "stale"


def test_study_status_reruns_a_dataset_that_decoded_older_weights(tmp_path, monkeypatch):
    import study_status

    raw, comp = _profile_tree(tmp_path, monkeypatch)
    (tmp_path / comp).mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(3)}}, tmp_path / comp / "heads.pt")
    rec = {**_rec("medusa@t16", comp, "0123456789abcdef"), "question_id": "81", "wall_time": 1.0,
           "device": "cpu: test (2 threads)", "code_version": "abc"}
    _write(raw / "study_mt-bench.jsonl", [rec, {**rec, "decoder": "vanilla", "decoder_config": {}, "components": {}}])
    table, _ = study_status.status("smoke", root=tmp_path)
    row = table.set_index("dataset").loc["mt-bench"]
    assert row.state == "stale: weights of medusa@t16.heads" and row.min_left_est > 0
    assert "-f .cache/smoke/results/cross/raw/study_mt-bench.jsonl" in study_status.next_commands(table, "smoke", ".cache/smoke/results")[0]
    assert study_status.missing_components("smoke", root=tmp_path) == []
    (tmp_path / comp / "heads.pt").unlink()
    (tmp_path / comp).rmdir()   # the cache lost it, and nothing kept it: retrain it first
    assert study_status.missing_components("smoke", root=tmp_path) == [comp]


def test_unknown_profile_is_one_error_line():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "weights_status.py"), "--profile", "nope"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode != 0 and p.stderr.strip().startswith("error:") and len(p.stderr.strip().splitlines()) == 1


def test_committed_versions_reads_every_version_of_a_file(tmp_path):
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,
                                    check=True, capture_output=True)
    git("init", "-q")
    stats = tmp_path / "results" / "cross" / "raw" / "rest_datastore_stats.json"
    stats.parent.mkdir(parents=True)
    for text in ("one", "two", "one"):
        stats.write_text(text)
        (tmp_path / "other.txt").write_text(text + "x")
        git("add", "-A")
        git("commit", "-qm", text, "--allow-empty")
    assert tool.committed_versions("results/*/raw/*datastore*_stats.json", tmp_path) == [b"one", b"two"]
    assert tool.committed_versions("results/*/raw/*datastore*_stats.json", tmp_path.parent) == []  # not a checkout
