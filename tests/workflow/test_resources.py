"""Every rule that runs a command declares its scheduler resources (threads, mem_mb, runtime;
GPUs where it runs on one; a node of its own for timing rules), in every profile, and plans
through the SLURM executor profile; the paper profile's commands exist and name the papers'
models and datasets."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import load_profile, read_config, resource_class_of
from common.workflow.resources import RuleResources, rule_resources
from common.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PROFILES = ["smoke", "embedded", "paper", "paper-tiny"]
# Profiles whose timings are results: their timing rules never share a node. smoke and paper-tiny
# run the mechanics in CI; their jobs share the cores, one thread each (their configs say why).
TIMED = ["embedded", "paper"]


def run(cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def jobs(text):
    """(rule, resources dict, shell command or '') of every job a dry run with -p printed."""
    out = []
    for block in re.split(r"\n\[[^\]\n]+\]\n", text)[1:]:
        m = re.match(r"(?:local)?rule (\S+):", block)
        if not m:
            continue
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        pairs = [kv.split("=", 1) for kv in res.group(1).split(", ")] if res else []
        cmd = re.search(r"^Shell command: (.*)$", block, re.M)
        cmd = cmd.group(1) if cmd and cmd.group(1) != "None" else ""  # rules all, prepare: no command
        out.append((m.group(1), dict(p for p in pairs if len(p) == 2), cmd))
    return out


@pytest.fixture(scope="module", params=PROFILES)
def slurm_plan(request):
    """The whole DAG of one profile, planned through profiles/slurm (no cluster needed to plan)."""
    r = run([*SNAKEMAKE, "-n", "-F", "--nolock", "-p", "--profile", "profiles/slurm", "all",
             "--config", f"profile={request.param}", "rerun=true"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return request.param, jobs(r.stdout + r.stderr)


def test_every_rule_declares_resources(slurm_plan):
    """cpus_per_task, mem_mb and runtime come only from the profile's `resources` (the local
    executor adds none of them), so a rule without them fails here."""
    profile, planned = slurm_plan
    runs = [(rule, res, cmd) for rule, res, cmd in planned if cmd]
    assert len(runs) > 10 and {"bench_cross", "cross_table"} <= {r for r, _, _ in runs}
    for rule, res, cmd in runs:
        missing = {"cpus_per_task", "mem_mb", "runtime"} - set(res)
        assert not missing, f"{profile}: rule {rule} declares no {sorted(missing)}"
        # a command on a GPU asks for one; a command on the CPU asks for none
        if "--device cuda" in cmd:
            assert int(res.get("gpu", 0)) >= 1, f"{profile}: rule {rule} runs on a GPU but asks for none"
        if "--device cpu" in cmd:
            assert "gpu" not in res, f"{profile}: rule {rule} runs on the CPU but asks for a GPU"
        # timing rules never share a node (locally they take every core: rules/common.smk)
        if re.search(r"-m common\.(bench|cost) ", cmd) and profile in TIMED:
            assert res.get("slurm_extra") == "--exclusive", f"{profile}: timing rule {rule} is not exclusive"
        # a job that shares the cores asks for every thread its command runs (two jobs each
        # running more threads than they asked for slow each other several times over)
        threads = re.search(r"--threads (\d+)", cmd)
        if threads and res.get("slurm_extra") != "--exclusive":
            assert int(res["cpus_per_task"]) >= int(threads.group(1)), f"{profile}: rule {rule} runs more threads than it asks for"


def test_commands_exist_and_name_registered_models(slurm_plan):
    """Each command's module exists; every --model and --dataset is a registered name."""
    from common.assets.data import EMBEDDED, PAPER_DATASETS
    from common.assets.models import MODELS
    from common.training.corpus import DATASETS as CORPUS_DATASETS

    profile, planned = slurm_plan
    for rule, _, cmd in planned:
        for module in re.findall(r" -m ([\w.]+)", cmd):
            assert importlib.util.find_spec(module) is not None, f"{rule}: no module {module}"
        for model in re.findall(r"--model (\S+)", cmd):
            # a registry name, a hub id (org/name: BiLD's released fine-tuned pairs), which
            # load_model takes as well, or a model another rule trains (BiLD's exit-head models)
            assert model in MODELS or re.fullmatch(r"[\w.-]+/[\w.-]+", model) or \
                model.startswith(f".cache/components/{profile}/"), f"{rule}: model {model}"
        for dataset in re.findall(r"--dataset (\S+)", cmd):
            # the corpus builder's --dataset picks its prompts (ShareGPT first turns or every turn)
            valid = CORPUS_DATASETS if " -m common.training.corpus " in cmd else (*EMBEDDED, *PAPER_DATASETS)
            assert dataset in valid, f"{rule}: dataset {dataset}"
    if profile == "paper":
        text = " ".join(cmd for _, _, cmd in planned)
        for name in ("vicuna-7b", "vicuna-13b", "llama2-13b-chat", "squad", "cnn_dm", "wmt14-en-fr"):
            assert name in text, name
        assert "smollm2" not in text


def test_config_has_an_entry_for_every_rule_key():
    """Every key the rules pass to rule_resources() is in one resource class, and every profile
    reserves something for every class."""
    keys = set()
    for f in (ROOT / "rules").glob("*.smk"):
        keys |= set(re.findall(r'rule_resources\("(\w+)"\)', f.read_text()))
    assert {"bench_cross", "render", "ppdp_bench"} <= keys
    config = read_config()
    classes = resource_class_of(config)
    assert keys <= set(classes), sorted(keys - set(classes))
    for name, p in config["profiles"].items():
        assert set(classes.values()) <= set(p["resources"]), name


def test_class_entry_and_override():
    """A rule gets its class's entry with the profile's override for that rule on top."""
    config = read_config()
    config["resource_classes"] = {"timing": ["bench_cross", "cost_curve"], "render": ["render"]}
    config["profiles"]["smoke"]["resources"] = {
        "timing": {"threads": 2, "mem_mb": 3000, "runtime": 15, "exclusive": True},
        "render": {"threads": 1, "mem_mb": 2000, "runtime": 10},
        "overrides": {"cost_curve": {"mem_mb": 5000}}}
    for p in ("embedded", "paper"):
        config["profiles"][p]["resources"] = dict(config["profiles"]["smoke"]["resources"], overrides={})
    smoke = load_profile(config, "smoke")
    assert rule_resources(smoke, "bench_cross") == RuleResources(threads=2, mem_mb=3000, runtime=15, exclusive=True)
    assert rule_resources(smoke, "cost_curve") == RuleResources(threads=2, mem_mb=5000, runtime=15, exclusive=True)
    with pytest.raises(UserError, match="rule 'pd_bench' is in no class"):
        rule_resources(smoke, "pd_bench")


def test_missing_entry_is_one_user_error():
    config = read_config()
    del config["profiles"]["smoke"]["resources"]["timing"]
    with pytest.raises(UserError, match="profiles/smoke/resources: no entry for class 'timing' of rule 'bench_cross'"):
        rule_resources(load_profile(config, "smoke"), "bench_cross")
    del config["profiles"]["smoke"]["resources"]["render"]["mem_mb"]
    with pytest.raises(UserError, match="resources/render: 'mem_mb' is a required property"):
        load_profile(config, "smoke")
    config = read_config()
    config["resource_classes"]["render"].append("bench_cross")
    with pytest.raises(UserError, match="rule 'bench_cross' is in both 'render' and 'timing'|"
                                        "rule 'bench_cross' is in both 'timing' and 'render'"):
        load_profile(config, "smoke")


# Bad resources failing the plan in one line: tests/workflow/test_cli_dag.py (test_bad_config_fails_the_plan_in_one_line).


def test_slurm_test_script_parses():
    """tools/test_slurm.sh needs root and minutes (README: Running on a cluster); here only its syntax."""
    r = run(["bash", "-n", "tools/test_slurm.sh"])
    assert r.returncode == 0, r.stderr
