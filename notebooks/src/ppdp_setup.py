# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # Predictive Pipelined Decoding (ppd_pipelined): set-up
# What the experiments ran with, read from their records: Table 1's prompt templates as the
# code rendered them (`prompts_<task>.jsonl`) and Table 4's recipe for the intermediate heads
# (`heads_meta.json`, `heads_train.jsonl`, and the held-out learning curve `heads_curve.jsonl`),
# beside the paper's values
# (`ppd_pipelined/paper_numbers.yaml`). Every table names its model, data, profile and hardware.

# %%
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from common.records import read_jsonl
from ppd_pipelined.tables import Render, heads_recipe_table, paper_numbers, provenance, templates_table

R = Render(artifact_id, results_root, package, profile, inputs)
TASKS = list(R.cfg.tasks)

# %% md [ppdp.table1]
# ## Table 1: the prompt templates, as the code used them
# Table 1 of the paper holds templates, no numbers: the comparison is the template text itself.

# %% [ppdp.table1]
recs, srcs = R.records("prompts_")
table = templates_table(recs, TASKS)
meta = provenance(recs, srcs, TASKS, note="the rendered prompt is then wrapped in the model's chat template "
                                          "(common.assets.prompts.encode_prompt), as in every decoding run")
meta["profile"] = profile
R.setup_only(f"the prompt templates of {len(table)} tasks, as the code used them")
R.save_table(table, meta)

# %% md [ppdp.table4]
# ## Table 4: the intermediate heads' training recipe (from the checkpoint's metadata)
# `used` is read from the metadata the training wrote, `paper` from the paper's Table 4. The figure
# shows the training loss and the held-out learning curve the early stopping watched (top-1 match
# of each layer's head with the model's final layer, the quantity Table 2's "Y" rows report).

# %% [ppdp.table4]
hm = json.loads(open(R.path("heads_meta.json")).read())
log = read_jsonl(R.path("heads_train.jsonl"))
curve = read_jsonl(R.path("heads_curve.jsonl"))
m = hm["meta"]
paper4 = paper_numbers("table4")
paper = paper4["values"]
table, differ = heads_recipe_table(hm, paper)
fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
ax.plot([r["step"] for r in log], [r["loss"] for r in log], ".-", ms=2, lw=0.6)
ax.set_xlabel("step")
ax.set_ylabel("training loss (mean CE over layers)")
ax.set_title(f"PPD intermediate heads, {profile}: training")
steps = [r["step"] for r in curve]
for i, l in enumerate(m["layers"]):
    ax2.plot(steps, [r["heldout_match_by_layer"][i] for r in curve], ".-", label=f"layer {l}")
ax2.plot(steps, [r["heldout_match"] for r in curve], "k--", label="mean (watched)")
ax2.set_xlabel("step")
ax2.set_ylabel("held-out top-1 = final layer's")
ax2.set_title("held-out learning curve")
ax2.legend(fontsize=7)
fig.tight_layout()
R.save_figure(fig)
rec = {"model": hm["model_name"], "profile": hm["profile"], "device": hm["device"], "dtype": hm["dtype"]}
meta = provenance([rec], R.inputs, TASKS)
meta["data"] = f"{m['dataset']} (first exchange: prompt through the chat template, loss on the reply)"
meta["note"] = "'used' is read from the checkpoint's metadata, not typed; 'paper' is the paper's Table 4"
meta["paper"] = paper4["cite"]
meta["comparison"] = (f"{len(paper) - len(differ)}/{len(paper)} of the paper's hyperparameters used as is; "
                      f"scaled for this profile: {', '.join(differ) or 'none'}")
R.setup_only(f"the heads' training recipe; {meta['comparison']}")
R.save_table(table, meta)

# %%
R.publish()
