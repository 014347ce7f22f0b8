# Reproduction workflow: prepare assets -> run experiments (raw JSONL) -> notebooks -> tables/figures.
#
#   snakemake -j4 all                              # embedded profile (default, offline CPU)
#   snakemake -j4 all --config profile=smoke       # minutes; what CI runs
#   snakemake -j4 cross_table                      # one artifact (rule name = id with '.' -> '_')
#   snakemake -n all --config profile=paper        # plan the paper-scale run (GPU + hub)
import sys

from common.config import load_artifacts, load_profile
from common.errors import UserError

configfile: "config/config.yaml"

try:
    P = load_profile(config, config.get("profile"))
except UserError as e:
    sys.exit(f"error: {e}")

ROOT = P.results_root
PY = sys.executable  # rules run with the interpreter that runs snakemake (the project venv)
LOGS = f".cache/logs/{P.name}"
ARTIFACTS = load_artifacts()
# Every rule sees the profile's hub setting; the embedded and smoke profiles never reach it.
ENV = f"HF_HUB_OFFLINE={int(P.offline)} HF_DATASETS_OFFLINE={int(P.offline)}"

include: "rules/common.smk"
include: "rules/prepare.smk"
include: "rules/components.smk"
include: "rules/cross.smk"
include: "rules/ppd_pipelined.smk"
include: "rules/artifacts.smk"


rule all:
    input: all_targets()
