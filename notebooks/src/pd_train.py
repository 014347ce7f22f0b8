# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # Parallel prompt decoding: what the prompt tokens learn
# Prompt tokens are trained embeddings appended after a token: prompt token *j* guesses the
# token *j + 1* places beyond the model's own next token (distance *j*, the paper's "@j"). They
# train with the model frozen (`python -m prompt_decoding.train`) on the model's own greedy
# answers to ShareGPT prompts, by distillation from the model's distributions along that greedy
# text (eq. 1), and are measured on the held-out greedy answers to *other* ShareGPT prompts that
# the Medusa heads are measured on: top-k accuracy = how often the model's own greedy token at
# that distance is among the k best guesses, over every cut inside those answers. The paper
# measures on Alpaca Eval with 20 steps on Vicuna; the numbers it reports
# (`prompt_decoding/paper_numbers.yaml`) stand beside ours. Each training is one variant of the
# profile's `prompt_decoding.variants` (the main one is what decoding uses).

# %%
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from common.records import read_jsonl
from common.render import Render, paper_numbers
from common.report import trend

R = Render(artifact_id, results_root, package, profile, inputs)  # the declared inputs, staged outputs
inputs = R.inputs
paper = paper_numbers(package)
stats = {Path(p).name.removeprefix("train_").removesuffix("_stats.json"): json.loads(Path(p).read_text())
         for p in inputs if "/prompt_decoding/" in p and p.endswith("_stats.json")}
curves = {Path(p).name.removeprefix("train_").removesuffix("_curve.jsonl"): pd.DataFrame(read_jsonl(p))
          for p in inputs if p.endswith("_curve.jsonl")}
medusa = next((json.loads(Path(p).read_text()) for p in inputs if p.endswith("medusa_stats.json")), None)
main = stats["main"]
by_n = dict(sorted(((s["n"], name) for name, s in stats.items() if s["mask"] == main["mask"] and s["distill"]),
                   key=lambda t: t[0]))
meta = {"model": main["model"], "profile": profile,
        "data": (f"trained on greedy answers to {main['train_sequences']} ShareGPT prompts; measured on greedy "
                 f"answers to {main['heldout_sequences']} held-out ShareGPT prompts (every cut)"),
        "hardware": ", ".join(sorted({s["hardware"] for s in stats.values()})),
        "code_version": ", ".join(sorted({s["code_version"] for s in stats.values()})),
        "sources": ", ".join(str(p) for p in inputs)}


def accumulated(acc):
    """``[d][k]`` top-(k+1) accuracy from per-rank accuracies ``[d][r]``."""
    return np.cumsum(np.asarray(acc), axis=1)


meta

# %% md [pd.table2]
# ## Table 2: EPTs per prompt token
# Accuracy at distances 1 and 2, top-1 and top-5, for each number of ensemble prompt tokens (EPTs)
# trained here, beside the paper's. More EPTs give each prompt token more parameters (its
# guess is the average of its EPTs' logits); the paper finds accuracy rising with them, most
# at distance 2.

# %% [pd.table2]
cols = ["acc1_top1", "acc1_top5", "acc2_top1", "acc2_top5"]
rows = []
for n, name in by_n.items():
    a = accumulated(stats[name]["acc"])
    s = stats[name]
    rows.append({"EPTs": n, "variant": name, **dict(zip(cols, [a[0, 0], a[0, 4], a[1, 0], a[1, 4]])),
                 "steps": s["steps"], "stopped": s["stopped"], "train_min": round(s["train_wall_s"] / 60, 1),
                 "params": s["params"]})
ours = pd.DataFrame(rows)
pp = pd.DataFrame([{"EPTs": int(n), **dict(zip(paper["table2"]["columns"], v))} for n, v in paper["table2"]["rows"].items()])
table = ours.merge(pp.rename(columns={c: f"paper_{c}" for c in cols}), on="EPTs", how="left")
print("paper:", paper["table2"]["cite"])


def rising(df):
    df = df.sort_values("EPTs")
    return [b >= a for c in cols for a, b in zip(df[c], df[c][1:])]


print(trend("accuracy does not fall as EPTs grow (each metric, consecutive EPT counts)", rising(ours), rising(pp)))
R.save_table(table, meta)

# %% md [pd.fig6]
# ## Figure 6: accumulated top-k accuracy by distance
# (a) the main prompt tokens against the Medusa heads trained for the same model (Medusa head
# *j* also guesses distance *j*, from the last hidden state), both measured on the same held-out
# greedy answers; (b) the most EPTs against 1 EPT (the trainings the profile's
# `prompt_decoding.ablation.fig6` names). (c) two model sizes: only one
# real model exists offline (SmolLM2-135M), so panel (c) is drawn in the paper profile only.
# The paper shows these as curves without tabulated numbers; its claims are checked below.

# %% [pd.fig6]
A = accumulated(main["acc"])
m = A.shape[0]
most = by_n[max(by_n)]
rows = []
for d in range(m):
    for k in (1, 3, 5, 10):
        row = {"distance": d + 1, "top_k": k, "prompt_tokens": A[d, k - 1]}
        if medusa is not None and d < len(medusa["accuracy"]):
            row["medusa_head"] = accumulated(medusa["accuracy"])[d, k - 1]
        if most != "main":
            row[f"prompt_tokens_{stats[most]['n']}ept"] = accumulated(stats[most]["acc"])[d, k - 1]
        rows.append(row)
table = pd.DataFrame(rows)
for c in paper["fig6"]["claims"]:
    print("paper:", c)
if "medusa_head" in table:
    far = table[table.distance >= 2]
    print(trend("prompt tokens >= Medusa heads at distance >= 2 (top-1/3/5/10)", far.prompt_tokens >= far.medusa_head))
if most != "main":
    col = f"prompt_tokens_{stats[most]['n']}ept"
    print(trend(f"{stats[most]['n']} EPTs >= 1 EPT at every distance (top-1/3/5/10)", table[col] >= table.prompt_tokens))

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for d in range(m):
    ks = np.arange(1, A.shape[1] + 1)
    axes[0].plot(ks, A[d], marker="o", label=f"prompt tokens @{d + 1}")
    if medusa is not None and d < len(medusa["accuracy"]):
        axes[0].plot(ks, accumulated(medusa["accuracy"])[d], ls="--", marker="x", label=f"Medusa head @{d + 1}")
    if most != "main":
        axes[1].plot(ks, A[d], marker="o", label=f"1 EPT @{d + 1}")
        axes[1].plot(ks, accumulated(stats[most]["acc"])[d], ls="--", marker="x",
                     label=f"{stats[most]['n']} EPTs @{d + 1}")
axes[0].set_title("(a) prompt tokens vs Medusa heads")
axes[1].set_title("(b) many EPTs vs 1 EPT")
for a in axes:
    a.set_xlabel("k")
    a.set_ylabel("accumulated top-k accuracy")
    a.legend(fontsize=7)
fig.suptitle(f"{meta['model']}, {meta['profile']}, {meta['hardware']}", fontsize=9)
R.save_figure(fig)
R.save_table(table, meta)

# %% md [pd.fig9]
# ## Figure 9: training loss, 1 EPT vs many
# The training loss (eq. 1, mean over the steps between two held-out evaluations) and the
# held-out distance-1 top-1 of each EPT count along training. Training stops when the held-out
# top-1 flattens or the wall budget is spent (the paper trains a fixed 12 epochs).

# %% [pd.fig9]
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
rows = []
for n, name in by_n.items():
    c = curves[name]
    ep = c.examples_seen / stats[name]["train_sequences"]
    axes[0].plot(ep[1:], c.train_loss[1:], marker=".", label=f"{n} EPT{'s' if n > 1 else ''}")
    axes[1].plot(ep, c.heldout_top1.map(lambda v: v[0]), marker=".", label=f"{n} EPT{'s' if n > 1 else ''}")
    rows.append({"EPTs": n, "first_loss": c.train_loss.iloc[1] if len(c) > 1 else None,
                 "last_loss": c.train_loss.iloc[-1], "min_loss": c.train_loss[1:].min(), "epochs": float(ep.iloc[-1]),
                 "top1_start": c.heldout_top1.iloc[0][0], "top1_end": c.heldout_top1.iloc[-1][0],
                 "stopped": stats[name]["stopped"]})
axes[0].set_ylabel("training loss (eq. 1)")
axes[1].set_ylabel("held-out top-1 @1")
for a in axes:
    a.set_xlabel("epochs")
    a.legend(fontsize=7)
fig.suptitle(f"{meta['model']}, {meta['profile']}, {meta['hardware']}", fontsize=9)
R.save_figure(fig)
table = pd.DataFrame(rows)
for c in paper["fig9"]["claims"]:
    print("paper:", c)
one, many = table.iloc[0], table.iloc[-1]
if len(table) > 1:
    print(trend("many EPTs start with a lower loss than 1 EPT", [many.first_loss < one.first_loss]))
print(trend("the loss falls during training (each EPT count)", table.last_loss < table.first_loss))
R.save_table(table, meta)

# %%
R.publish()  # last step: tables and figure move into place only when all of it worked
