# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # FIRP: what the pseudo hidden states become
# FIRP maps the real state of an anchor position at layer *t_i* to a pseudo state for the
# position *i* places ahead, and lets it run through the layers above beside the real tokens.
# The paper's claim (Figure 4): those layers *refine* the pseudo state, so its cosine similarity
# to the real state of that position grows layer by layer. Measured here with
# `python -m firp.analysis` over every anchor inside the held-out greedy answers (the paper: 100
# sequences x 50 random split points of XSum and GSM8K), for the trained maps and for the
# untrained start (identity maps: the anchor's own state moved ahead), which shows what the
# training adds. States are compared as each layer outputs them; the last layer's after the
# final norm (what the LM head reads, and what the model's forward returns).

# %%

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from common.records import read_jsonl
from common.harness.render import Render, paper_numbers
from firp.tables import cosine_table

R = Render(artifact_id, results_root, package, profile, inputs)  # the declared inputs, staged outputs
inputs = R.inputs
paper = paper_numbers(package)
df = pd.DataFrame([r for p in inputs for r in read_jsonl(p)])
meta = {"model": ", ".join(sorted(df.model.unique())), "profile": profile,
        "data": f"every anchor inside the held-out greedy answers ({int(df.n.iloc[0])} anchors)",
        "maps": ", ".join(f"{m} (layers {l})" for m, l in sorted({(r.maps, str(r.layers)) for r in df.itertuples()})),
        "hardware": ", ".join(sorted(df.hardware.unique())), "code_version": ", ".join(sorted(df.code_version.unique())),
        "sources": ", ".join(str(p) for p in inputs)}
meta

# %% [firp.fig4]
table = cosine_table(df)
fig, ax = plt.subplots(figsize=(7, 4))
for step, g in table.groupby("step"):
    ax.plot(g.layer, g.trained, marker="o", label=f"step {step} trained")
    ax.plot(g.layer, g.identity, ls="--", marker="x", label=f"step {step} identity (untrained)")
ax.set_xlabel("layer (output compared)")
ax.set_ylabel("cosine(pseudo, real)")
ax.legend(fontsize=7)
fig.suptitle(f"{meta['model']}, {meta['profile']}, {meta['hardware']}", fontsize=9)
R.save_figure(fig)
for c in paper["fig4"]["claims"]:
    print("paper:", c, f"({paper['fig4']['cite']})")
rises = [g.trained.iloc[-1] > g.trained.iloc[0] for _, g in table.groupby("step")]
steps_up = [b >= a for _, g in table.groupby("step") for a, b in zip(g.trained, g.trained[1:])]
print(R.trend("trained pseudo states end closer to the real ones than they enter (per step)", rises))
print(R.trend("layer over layer, the similarity does not fall (trained, every step and layer)", steps_up))
gain = table.groupby("step").apply(lambda g: g.trained.iloc[-1] - g.identity.iloc[-1], include_groups=False)
print("ours, not a paper claim: trained minus identity cosine at the last layer, per step:", gain.round(3).to_dict())
R.save_table(table, meta)

# %%
R.publish()  # last step: tables and figure move into place only when all of it worked
