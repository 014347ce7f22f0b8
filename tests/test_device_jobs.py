"""tools/device/jobs.py: a dry run's printout becomes the GPU call's script (the rule's own
command on CUDA, its files back to $OUT); a plan whose jobs read each other's outputs is refused."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "device"))
import jobs  # noqa: E402

PY = "/repo/.venv/bin/python"
PLAN = f"""Building DAG of jobs...
rule firp_train:
    input: results/corpus/embedded/stats.json
    output: .cache/components/embedded/firp_maps/k1l14/maps.pt, results/firp/raw/train_k1l14_stats.json
    log: .cache/logs/embedded/firp_train_k1l14.log
    jobid: 1
    wildcards: firpv=k1l14
Shell command: HF_HUB_OFFLINE=1 {PY} -m firp.train --model m --device cpu --threads 2 > .cache/logs/embedded/firp_train_k1l14.log 2>&1

rule firp_train:
    input: results/corpus/embedded/stats.json
    output: .cache/components/embedded/firp_maps/k1l19/maps.pt, results/firp/raw/train_k1l19_stats.json
    log: .cache/logs/embedded/firp_train_k1l19.log
Shell command: HF_HUB_OFFLINE=1 {PY} -m firp.train --model m --layers 19 --device cpu --threads 2
Job stats:
"""


def test_a_plan_becomes_the_calls_script():
    plan = jobs.parse_plan(PLAN)
    assert [j["rule"] for j in plan] == ["firp_train", "firp_train"]
    assert plan[0]["outputs"][1] == "results/firp/raw/train_k1l14_stats.json"
    assert plan[1]["log"] == ".cache/logs/embedded/firp_train_k1l19.log"
    text = jobs.script(plan, "# header")
    assert text.count("python3 -m firp.train") == 2 and "--device cpu" not in text and PY not in text
    assert ". tools/device/model.sh" in text and text.rstrip().endswith('ls -laR "$OUT"')
    assert "results/firp/raw/train_k1l19_stats.json" in text.split("for p in ")[1]


def test_jobs_that_read_each_others_outputs_are_refused():
    plan = jobs.parse_plan(PLAN)
    plan[1]["inputs"] = ["results/firp/raw/train_k1l14_stats.json"]
    with pytest.raises(ValueError, match="another job of the plan writes"):
        jobs.script(plan, "#")
    plan = jobs.parse_plan(PLAN.replace("--device cpu --threads 2 >", "--threads 2 >"))
    with pytest.raises(ValueError, match="without --device cpu"):
        jobs.script(plan, "#")
