"""The arguments Snakemake's PPD rules pass, read from the embedded profile, for a run on the lent GPU.

    python tools/device/ppd_args.py heads BUDGET   # heads config JSON (wall budget -> BUDGET s), excluded sets,
                                                   # layers, model, match-rate classifiers
    python tools/device/ppd_args.py tasks          # one line per task: name, prompts, max new tokens, max prompt tokens
"""
import json
import sys

import yaml

from common.config import load_profile, with_profile_files
from ppd_pipelined.config import from_profile
from ppd_pipelined.workflow import RuleParams

cfg = from_profile(load_profile(with_profile_files(yaml.safe_load(open("config/config.yaml"))), "embedded"))
rules = RuleParams(cfg)
if sys.argv[1:2] == ["heads"] and len(sys.argv) == 3:
    heads = json.loads(rules.heads_config)
    heads["wall_budget_s"] = float(sys.argv[2])
    print(json.dumps(heads, separators=(",", ":")), rules.eval_datasets, rules.layers, cfg.model, rules.classifiers)
elif sys.argv[1:] == ["tasks"]:
    for name, task in cfg.tasks.items():
        print(name, task.n, task.max_new_tokens, cfg.max_prompt_tokens)
else:
    sys.exit("error: usage: ppd_args.py heads BUDGET_S | ppd_args.py tasks")
