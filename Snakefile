# Reproduction workflow: prepare assets -> run experiments (raw JSONL) -> notebooks -> tables/figures.
#
#   snakemake -j4 all                                  # re-render every artifact from the committed raw records
#   snakemake -j1 cross_table                          # one artifact (rule name = id with '.' and '-' -> '_')
#   snakemake -j4 all --config rerun=true              # rerun the experiments too (hours on 2 CPU cores)
#   snakemake -j4 all --config profile=smoke rerun=true  # minutes; what CI runs
#   snakemake -n all --config profile=paper rerun=true   # plan the paper-scale run (GPU + hub)
#   snakemake --profile profiles/slurm all --config profile=paper rerun=true   # on SLURM (README: Running on a cluster)
#
# Logs and Snakemake benchmark files (wall time, peak memory) of every job: .cache/logs/<profile>/.
# What each rule reserves (threads, mem_mb, runtime, GPUs, a node of its own): the profile's `resources`.
import sys

from common.config import load_profile, with_profile_files
from common.errors import UserError
from common.workflow.artifacts import artifact_inputs as _inputs, artifact_outputs as _outputs, load_artifacts

configfile: "config/config.yaml"

# `--config rerun=true` arrives as a string; anything but true/false is left to the schema to reject.
if isinstance(config.get("rerun"), str):
    config["rerun"] = {"true": True, "false": False}.get(config["rerun"].lower(), config["rerun"])
try:
    # the profiles live in config/profiles/<name>.yaml; a `profiles` mapping from --configfile overrides them
    P = load_profile(with_profile_files(config), config.get("profile"))
except UserError as e:
    # Same contract as every entry point (common.errors.cli_main): one line, exit status 2.
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)

ROOT = P.results_root
PY = sys.executable  # rules run with the interpreter that runs snakemake (the project venv)
LOGS = f".cache/logs/{P.name}"
BENCH = f"{LOGS}/benchmarks"
ARTIFACTS = load_artifacts()
RERUN = bool(config.get("rerun", False))
# Every rule sees the profile's hub setting; the embedded and smoke profiles never reach it.
ENV = f"HF_HUB_OFFLINE={int(P.offline)} HF_DATASETS_OFFLINE={int(P.offline)}"
# ... and the profile's local copies of hub repositories, read before the hub (common.assets.models, common.assets.data):
# paper-tiny's tiny stand-ins and dataset fixtures, or a cluster's downloads.
for _var, _key in (("DECODING_REPRO_MODELS", "model_root"), ("DECODING_REPRO_DATA", "data_root")):
    if P.raw.get(_key):
        ENV += f" {_var}={P.raw[_key]}"
# A trainer whose steps allocate and free large tensors (the exit heads' [positions x exits, 49 k]
# logits) spends a third of its CPU time in page faults when glibc hands the memory back to the
# OS after every step; keeping it in the process made a CALM exit step 1.55x faster (2.4 -> 1.5 s,
# measured 2026-11-25). Steps compute the same numbers; only wall time (and so a budget) changes.
KEEP_MEMORY = "MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=1073741824"

include: "rules/common.smk"
if RERUN:
    # Only an explicit rerun lets Snakemake (re)make raw records: otherwise they are inputs,
    # and a fresh clone (where the converted model is newer than every record) never replans
    # hours of training and benchmarks or overwrites the committed records.
    include: "rules/prepare.smk"
    include: "rules/components.smk"
    include: "rules/cross.smk"
    include: "rules/ppd_pipelined.smk"
    include: "rules/bild.smk"
    include: "rules/prompt_decoding.smk"
    include: "rules/firp.smk"
else:
    # the raw records are inputs: each artifact's rule checks its own when the targets need it
    # (rules/common.smk raw_records), so one artifact renders while another's are missing
    note_pending()
include: "rules/artifacts.smk"


rule all:
    input: all_targets(), rules.summary.output  # the summary (rules/artifacts.smk) rebuilt from the tables
