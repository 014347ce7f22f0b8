"""Command-line entry points end with one clear error line; the DAG plans and runs."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.config import load_config, load_profile
from common.workflow.artifacts import load_artifacts

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, **kw)


@pytest.mark.parametrize("args,msg", [
    (["--model", "no-such-model", "--decoders", "vanilla", "--dataset", "mt-bench"], "unknown model 'no-such-model'"),
    (["--model", "smollm2-135m-instruct", "--decoders", "vanilla", "--dataset", "nope"], "unknown dataset 'nope'"),
    (["--model", "smollm2-135m-instruct", "--decoders", "vanilla", "--dataset", "squad"], "needs the Hugging Face hub"),
    (["--model", "smollm2-135m-instruct", "--decoders", "vanilla", "--dataset", "mt-bench",
      "--max-new-tokens", "0"], "max_new_tokens=0 is out of range"),
    (["--model", "lmsys/vicuna-7b-v1.3", "--decoders", "vanilla", "--dataset", "mt-bench", "--n", "1"],
     "not available offline"),
])
def test_bench_bad_input_one_line(tmp_path, args, msg):
    out = tmp_path / "o.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = run([sys.executable, "-m", "common.harness.bench", *args, "--out", str(out)], env=env)
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and msg in lines[0], r.stderr
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.model
def test_bench_unknown_decoder_after_model_load(tmp_path, embedded):
    out = tmp_path / "o.jsonl"
    r = run([sys.executable, "-m", "common.harness.bench", "--model", "smollm2-135m-instruct", "--decoders",
             "vanilla,nope", "--dataset", "mt-bench", "--n", "1", "--out", str(out)])
    assert r.returncode == 2 and "unknown decoder 'nope'; valid:" in r.stderr
    assert not out.exists()


def failed_rule_logs(out: str, tail: int = 3000) -> str:
    """The tails of the log files of the rules a snakemake run reports as failed ("Error in rule"
    ... "log: <path> (check log file(s) ...)"): the failure's cause lives there, not in snakemake's
    own output, and CI keeps no other copy."""
    import re

    text = []
    for block in out.split("Error in rule ")[1:]:
        m = re.search(r"^\s*log: (\S+)", block, re.M)
        if m and (ROOT / m.group(1)).is_file():
            text.append(f"--- {m.group(1)} (last {tail} characters) ---\n" + (ROOT / m.group(1)).read_text()[-tail:])
    return "\n".join(text)


def error_lines(r):
    return [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("error:")]


@pytest.mark.parametrize("profile", ["smoke", "embedded", "paper", "paper-tiny"])
def test_dag_plans_every_profile(profile):
    # -F: plan every job, whatever outputs an earlier local run left (CI starts from none)
    r = run([*SNAKEMAKE, "-n", "-F", "--nolock", "all", "--config", f"profile={profile}", "rerun=true"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cross_table" in r.stdout + r.stderr and "bench_cross" in r.stdout + r.stderr


@pytest.mark.parametrize("target", ["all", "cross_table", "ppdp_table3"])
def test_render_plans_no_experiment(target):
    """Without rerun=true a target re-renders from the committed raw records: no model, no training, no benchmark."""
    r = run([*SNAKEMAKE, "-n", "-F", "--nolock", target])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert target in out
    for heavy in ("prepare_model", "selfdistill_corpus", "train_medusa", "bench_cross", "ppdp_bench", "ppdp_matchrate"):
        assert heavy not in out, heavy
    pending = [aid for aid, spec in load_artifacts().items() if spec.get("pending")]
    if target == "all" and pending:  # left out of the plan, and named
        assert "note: pending artifacts" in out and all(aid in out for aid in pending)
        assert not any(f"rule {aid.replace('.', '_').replace('-', '_')}:" in out for aid in pending)


def test_a_fresh_clone_does_not_replan_the_committed_corpus(embedded):
    """A fresh clone converts the model after its checkout, so the model file is newer than the
    committed corpus; with rerun=true the corpus is up to date all the same (rule corpus_shards takes
    the model as ancient: hours of generation are not replanned over a file time)."""
    from common.assets.models import checkpoint_dir
    stats = ROOT / "results" / "corpus" / "embedded" / "stats.json"
    model = checkpoint_dir("smollm2-135m-instruct") / "model.safetensors"
    before = stats.stat()
    older = model.stat().st_mtime - 3600
    os.utime(stats, (older, older))
    try:
        r = run([*SNAKEMAKE, "-n", "--nolock", str(stats.relative_to(ROOT)), "--config", "rerun=true",
                 "--rerun-triggers", "mtime"])
    finally:
        os.utime(stats, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rule corpus_shards:" not in r.stdout + r.stderr and "Nothing to be done" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_fresh_clone_converting_the_model_does_not_replan_the_committed_corpus(tmp_path):
    """In a fresh clone the model is not converted yet: the plan that trains from the corpus
    converts it first, and the committed corpus stays as it is (it was replanned, "updated by
    another job", before rule corpus_shards stopped naming the model once the corpus exists)."""
    env = {**os.environ, "REPRO_CACHE_DIR": str(tmp_path / "cache")}  # no converted model there
    r = subprocess.run([*SNAKEMAKE, "-n", "--nolock", ".cache/components/embedded/teacher.pt", "--config", "rerun=true",
                        "--rerun-triggers", "mtime"], cwd=ROOT, capture_output=True, text=True, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "rule prepare_model:" in out and "rule teacher_cache:" in out, out
    assert "rule corpus_shards:" not in out, out


def test_render_without_raw_records_is_one_error_line():
    r = run([*SNAKEMAKE, "-n", "--nolock", "all", "--config", "profile=paper"])
    assert r.returncode == 2 and len(error_lines(r)) == 1, r.stdout + r.stderr
    assert "raw records missing" in error_lines(r)[0] and "rerun=true" in error_lines(r)[0]


def test_one_artifact_renders_while_another_artifacts_records_are_missing(tmp_path):
    """Without rerun only the targets' raw records must be on disk: cross.table plans from its own
    (copied into a fresh results root), while a target whose records are missing there ends in
    one short error line naming the first few and their count."""
    from common.workflow.artifacts import artifact_inputs

    profile = load_profile()
    root = tmp_path / "results"
    for f in artifact_inputs(profile, "cross.table"):
        dst = root / Path(f).relative_to(profile.results_root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst)
    extra = tmp_path / "root.yaml"
    extra.write_text(f"profiles:\n  {profile.name}:\n    results_root: {root}\n")
    r = run([*SNAKEMAKE, "-n", "--nolock", "cross_table", "--configfile", str(extra)])
    assert r.returncode == 0 and not error_lines(r), r.stdout + r.stderr
    assert "rule cross_table:" in r.stdout + r.stderr
    others = artifact_inputs(profile, "ppdp.table3")
    assert not set(others) & set(artifact_inputs(profile, "cross.table"))
    r = run([*SNAKEMAKE, "-n", "--nolock", "ppdp_table3", "--configfile", str(extra)])
    assert r.returncode == 2 and len(error_lines(r)) == 1, r.stdout + r.stderr
    line = error_lines(r)[0]
    assert "raw records missing" in line and "ppdp.table3" in line and f"of {len(others)})" in line, line
    assert len(line.replace(f"{root}/", "")) < 300, line  # the first few names, not all (the tmp root aside)


def test_dag_unknown_profile():
    r = run([*SNAKEMAKE, "-n", "--nolock", "all", "--config", "profile=gpu"])
    assert r.returncode == 2 and error_lines(r) == ["error: unknown profile 'gpu'; valid: embedded, paper, paper-tiny, smoke"]


@pytest.mark.parametrize("extra,msg", [
    ("decoder_config:\n  medusa@t99: {tree: 16}\n", "no group of any profile runs 'medusa@t99'"),
    ("profiles:\n  embedded:\n    cross:\n      groups:\n        x: [vanilla, medusa@t99]\n",
     "label 'medusa@t99' has no decoder_config entry"),
    ("profiles:\n  embedded:\n    cross:\n      groups:\n        x: [vanilla, medusae]\n", "unknown decoder 'medusae'"),
    ("profiles:\n  smoke:\n    resources:\n      overrides: {bench_cross: {mem_mb: -1}}\n",
     "profiles/smoke/resources/overrides/bench_cross/mem_mb: -1 is less than the minimum of 1"),
    ("profiles:\n  smoke:\n    resources:\n      overrides: {bench_crosss: {mem_mb: 1}}\n",
     "profiles/smoke/resources/overrides: 'bench_crosss' is in no resource class"),
    ("profiles:\n  paper:\n    resources:\n      render: {gpu: 1}\n", "'gpu' was unexpected"),
])
def test_bad_config_fails_the_plan_in_one_line(tmp_path, extra, msg):
    """A decoder_config key no group runs, a group label nothing configures, an unknown decoder,
    or bad resources for a rule: the dry run ends with one error line."""
    cfg = tmp_path / "extra.yaml"
    cfg.write_text(extra)
    r = run([*SNAKEMAKE, "-n", "--nolock", "all", "--configfile", str(cfg)])
    assert r.returncode == 2 and len(error_lines(r)) == 1 and msg in error_lines(r)[0], r.stdout + r.stderr


def test_dag_lint():
    r = run([*SNAKEMAKE, "--lint", "--nolock", "--config", "profile=smoke", "rerun=true"])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.dag
@pytest.mark.model
def test_smoke_dag_end_to_end(embedded):
    """The smoke profile runs the whole DAG: bench -> notebook -> table, from scratch."""
    smoke = ROOT / ".cache" / "smoke" / "results"
    shutil.rmtree(smoke, ignore_errors=True)
    r = run([*SNAKEMAKE, "-j2", "all", "--config", "profile=smoke", "rerun=true"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + failed_rule_logs(r.stdout + r.stderr)
    md = (smoke / "cross" / "tables" / "cross.table.md").read_text()
    assert "smollm2-135m-instruct" in md and "profile**: smoke" in md
    for dec in ("vanilla", "hf_generate", "prompt_lookup"):
        assert f"| {dec}" in md
    assert (smoke / "cross" / "notebooks" / "cross.table.ipynb").is_file()
    import pandas as pd

    table = pd.read_csv(smoke / "cross" / "tables" / "cross.table.csv")
    # every decoder of the smoke groups and of the joined paper runs is lossless (bild at
    # rollback_threshold 0) but BiLD's lossy row: each equals vanilla on both prompts
    # every group the smoke profile configures, and every joined paper run, reaches the table
    smoke_cfg = load_config()["profiles"]["smoke"]["cross"]  # resolved: smoke extends embedded
    assert set(table.group) == set(smoke_cfg["groups"]) | set(smoke_cfg.get("joins", {}))
    assert {"eagle", "lookahead", "rest"} <= set(table.group)
    lossy = table.decoder == "bild@noloss"
    assert lossy.sum() == 1  # joined with its own vanilla; how many equal vanilla is its result, not a check
    assert (table[~lossy].identical_to_vanilla == "2/2").all(), table[["decoder", "identical_to_vanilla"]]
    assert (smoke / "cross" / "figures" / "cross.fig.png").is_file()
    # records name the code that made them (PPD's heads and match rates included)
    raw = smoke / "ppd_pipelined" / "raw"
    assert json.loads((raw / "heads_meta.json").read_text())["code_version"]
    assert all(json.loads(l)["code_version"] for l in (raw / "matchrate_squad.jsonl").read_text().splitlines())
    # heavy rules record wall time and peak memory beside their logs
    bench = ROOT / ".cache" / "logs" / "smoke" / "benchmarks" / "bench_cross_baselines.tsv"
    assert bench.is_file() and "max_rss" in bench.read_text()
