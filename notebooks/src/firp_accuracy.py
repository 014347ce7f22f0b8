# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # FIRP: how accurate the draft tokens are
# The paper's analytical experiments on the draft tokens (sections 4.2.1, 4.2.3, 4.3): split a
# greedy answer at a point, give a method the text before it, and count how often its guess
# for step *i* (the token *i + 1* places after the model's own next token; the paper's
# N = i + 1) is the token the model then says greedily, among its top *k*. Measured here on
# every split point of the held-out greedy answers to ShareGPT prompts no training saw (the
# paper: 100 XSum and GSM8K answers x 50 random points x 5 seeds). The paper gives these as
# plots without tabulated numbers, so its claims (`firp/paper_numbers.yaml`) are checked in
# words below each table.

# %%
import itertools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from common.harness import report
from common.harness.render import Render, paper_numbers
from firp.tables import (KS, at_least, check_trainings, layer_table, maps_training, mask_table, method_names,
                         middle_layer, model_cut, second_step_table, seen_by, top, topk_frame, topk_table)

R = Render(artifact_id, results_root, package, profile, inputs)  # the declared inputs, staged outputs
inputs = R.inputs
paper = paper_numbers(package)
topk, _ = R.records("topk")
stats = {Path(p).name.removeprefix("train_").removesuffix("_stats.json"): json.loads(Path(p).read_text())
         for p in inputs if Path(p).name.startswith("train_") and p.endswith("_stats.json")}
early = R.find("early_exit_stats.json", required=False)
medusa = R.find("medusa_stats.json", required=False)
records = [*topk, *stats.values(), *(s for s in (early, medusa) if s)]
if topk:
    data = (f"every split point of the greedy answers to {topk[0]['heldout_sequences']} held-out ShareGPT prompts "
            f"({topk[0]['n']} points, the same for every method)")
else:  # each training measured on its own run's held-out answers: say so where they differ
    s0 = next(iter(stats.values()))
    mixed = report.mixed_data(stats)
    data = (f"maps trained on greedy answers to {s0['train_sequences']} ShareGPT prompts; measured on every split "
            f"point of the greedy answers to {s0['heldout_sequences']} held-out ones") if not mixed else (
        f"maps on greedy answers to ShareGPT prompts, {mixed}; each measured on every split point of its held-out ones")
meta = {"model": ", ".join(sorted({r["model"] for r in records})), "profile": profile, "data": data,
        "hardware": ", ".join(sorted({r["hardware"] for r in records})),
        "code_version": ", ".join(sorted({r["code_version"] for r in records})),
        "sources": ", ".join(str(p) for p in inputs)}
if maps_training(stats.values()):  # the layer sweeps' trainings (Figure 3 reads scores, not trainings)
    meta["maps"] = maps_training(stats.values())


def check(ok, what):
    """A training of the wrong shape for a figure fails the render, naming it."""
    check_trainings(stats, ok, f"{what} (config {profile}: firp.ablation)", artifact_id)


def claims(key):
    """Print the paper's claims for figure ``key`` with their citation."""
    for c in paper[key]["claims"]:
        print("paper:", c, f"({paper[key]['cite']})")


def title(fig):
    """Name the model, profile and hardware above a figure."""
    fig.suptitle(f"{meta['model']}, {meta['profile']}, {meta['hardware']}", fontsize=9)


meta

# %% md [firp.fig3]
# ## Figure 3: FIRP against early exit and Medusa heads
# All three predict *K* draft tokens from one forward, each from a different state of the
# split point's last token: **FIRP** maps its state entering layer *t_i* to a pseudo state for
# the position *i* ahead and runs that through the layers above (the main maps);
# **early exit** puts an LM head on the same state entering *t_i* and guesses the token at once
# (`python -m firp.exit_heads`); **Medusa** heads read the last layer's state. The early-exit
# and Medusa heads are the same module trained the same way (a residual block before a
# vocabulary projection; the teacher cache; the profile's Medusa recipe), so they differ only
# in the layer they read; with a shared LM head (the embedded profile) each trains a block of
# as many parameters as one FIRP map, where the paper trains an independent LM head per
# layer. One difference in recipe: the early-exit heads train their softmax over the whole
# vocabulary (config `firp.exit_heads`), the Medusa heads over the tokens some label holds. On a
# mid-depth state the LM head ranks tokens outside the labels high, and a label-only loss never
# lowers them: trained that way the early-exit heads ended below their untrained start (step-1
# top-1 0.030 against 0.042), while on the last layer's state the label-only loss loses nothing.
# All three are scored by one run (`python -m firp.accuracy`) on the same points.
# Beside the embedded Medusa (4 heads through the shared LM head) stands the paper's like for
# like, **Medusa-1**: *K* = 3 heads with an LM head each (`firp.medusa_own`), where the profile
# trains it. "reads layer" *l*: the state entering layer *l* (*d*, the last layer's output, for
# Medusa); `component_params`: the whole trained component (the embedded Medusa has 4 heads,
# *K* = 3).

# %% [firp.fig3]
NAMES = method_names(topk)
df = topk_frame(topk)
table = topk_table(df, NAMES)
K = int(df.step.max())
fig, axes = plt.subplots(1, K, figsize=(4 * K, 3.8), sharey=True)
width = 0.8 / len(NAMES)
for i, ax in enumerate(np.atleast_1d(axes)):
    for j, m in enumerate(NAMES):
        r = df[(df.method == m) & (df.step == i + 1)].iloc[0]
        ax.bar(np.arange(len(KS)) + (j - (len(NAMES) - 1) / 2) * width, [top(r.acc, k) for k in KS], width,
               label=f"{NAMES[m]} (layer {r.layer})")
    ax.set_xticks(np.arange(len(KS)), [f"top-{k}" for k in KS])
    ax.set_title(f"step {i + 1} (N = {i + 2})")
    ax.legend(fontsize=7)
np.atleast_1d(axes)[0].set_ylabel("accuracy on the held-out split points")
title(fig)
R.save_figure(fig)
claims("fig3")
seen = seen_by(df, NAMES)  # what each component trained on
for other in [m for m in NAMES if m != "firp"]:
    print(R.trend(f"FIRP >= {NAMES[other]} (every step, top-1..5)", at_least(df, "firp", other),
                  mixed=report.mixed_data({m: seen[m] for m in ("FIRP", NAMES[other])})))
# the heads' own held-out numbers (their trainer's positions), where their records are of the heads scored
scored = {m: g.steps.iloc[0] for m, g in df.groupby("method")}
for m, s in (("early_exit", early), ("medusa", medusa)):
    if s is not None and m in scored:
        print(f"{NAMES[m]} held-out top-1 per step as its trainer measured it:",
              [round(x, 3) for x in s["heldout_top1"][:K]] if s.get("steps") == scored[m] else
              f"not shown: its training record ({s.get('steps')} steps) is not of the heads scored here ({scored[m]} steps)")
R.save_table(table, meta)

# %% md [firp.fig5]
# ## Figure 5: first-step accuracy vs prediction layer
# One training per layer of a single map (*K* = 1), each by the same recipe (config
# `firp.ablation.fig5` names them); `train_seqs` and `steps` say what each saw, and where the
# rows saw different data the verdicts say so and call no test either way. A lower layer gives the pseudo state more
# layers to gather context through, at more cost per step; the paper finds accuracy flat from
# the low to the middle layers and falling fast above, and picks the middle.

# %% [firp.fig5]
check(lambda s: s["steps_k"] == 1, "must train one step (steps_k 1)")
table = layer_table(stats)
R.cut(*model_cut(stats, paper["fig5"]))  # the paper plots two models; the header says which we stand in with
depth = next(s.get("model_layers") for s in stats.values())
mid = middle_layer(table.layer, depth)  # the paper's middle, 15 of 32
fig, ax = plt.subplots(figsize=(6, 4))
for c in ("top1", "top5"):
    ax.plot(table.layer, table[c], marker="o", label=c.replace("top", "top-"))
ax.axvline(mid, ls=":", c="gray")
ax.set_xticks(table.layer)
ax.set_xlabel(f"prediction layer of step 1 (of {depth})")
ax.set_ylabel("step-1 accuracy (held-out)")
ax.legend()
title(fig)
R.save_figure(fig)
claims("fig5")
low, high = table[table.layer <= mid], table[table.layer >= mid]
print(R.trend(f"layers up to the middle ({mid}) within 10% of each other (top-1)",
            [abs(a - b) <= 0.1 * max(a, b) for a, b in itertools.combinations(low.top1, 2)],
            mixed=report.mixed_data({n: stats[n] for n in low.variant})))
print(R.trend(f"above the middle ({mid}) each higher layer is less accurate (top-1, top-5)",
            [b < a for c in ("top1", "top5") for a, b in zip(high[c], high[c][1:])],
            mixed=report.mixed_data({n: stats[n] for n in high.variant})))
print("ours: top-1 at the middle / the highest layer:", round(high.top1.iloc[0], 3), "/", round(high.top1.iloc[-1], 3))
R.save_table(table, meta)

# %% md [firp.fig6]
# ## Figure 6: second-step accuracy vs its prediction layer, the first fixed
# Two maps (*K* = 2): step 1 at the main maps' first layer in every training, step 2 at one
# layer above it per training (config `firp.ablation.fig6`; strictly above, since a step's
# pseudo state enters after the earlier step's: the paper's axis may start at step 1's own
# layer). Step 2's pseudo state sees step 1's; step 1's accuracy is shown too (it should barely
# move).

# %% [firp.fig6]
check(lambda s: s["steps_k"] == 2 and not s["mask_earlier"], "must train two unmasked steps")
first = {s["layers"][0] for s in stats.values()}
if len(first) != 1:
    raise ValueError(f"{artifact_id}: step 1's layer must be the same in every training; got {sorted(first)}")
table = second_step_table(stats)
R.cut(*model_cut(stats, paper["fig6"]))  # as Figure 5: one model for the paper's two
fig, ax = plt.subplots(figsize=(6, 4))
for c in ("step2_top1", "step2_top5", "step1_top1"):
    ax.plot(table.step2_layer, table[c], marker="o", ls="--" if c.startswith("step1") else "-",
            label=c.replace("_top", " top-"))
ax.set_xticks(table.step2_layer)
ax.set_xlabel(f"prediction layer of step 2 (step 1 at {first.pop()})")
ax.set_ylabel("accuracy (held-out)")
ax.legend()
title(fig)
R.save_figure(fig)
claims("fig6")
print(R.trend("step 2 no more accurate as its layer moves up (top-1, top-5)",
            [b <= a for c in ("step2_top1", "step2_top5") for a, b in zip(table[c], table[c][1:])],
            mixed=report.mixed_data(stats)))
print(R.trend("the highest step-2 layer is the least accurate (top-1, top-5)",
            [table[c].iloc[-1] == table[c].min() for c in ("step2_top1", "step2_top5")], mixed=report.mixed_data(stats)))
R.save_table(table, meta)

# %% md [firp.fig7]
# ## Figure 7: the second step, masked from the first vs not
# Two trainings at the same layers (config `firp.ablation.fig7`: *K* = 2 at the main maps' first
# two layers, as the paper's 15 and 20): normal attention, where step 2's pseudo state attends
# to step 1's, and masked, where it sees only the real context and itself. The paper does not
# say whether its masked maps were trained masked; here they are (trained, measured and decoded
# that way: `python -m firp.train --mask-earlier`), so two trained settings are compared.

# %% [firp.fig7]
names = list(stats)
check(lambda s: s["steps_k"] >= 2, "must train two steps or more")
layers = {tuple(stats[n]["layers"]) for n in names}
if len(layers) != 1 or sorted(stats[n]["mask_earlier"] for n in names) != [False, True]:
    raise ValueError(f"{artifact_id}: needs one unmasked and one masked training at the same layers; got "
                     f"{ {n: (stats[n]['layers'], stats[n]['mask_earlier']) for n in names} }")
table = mask_table(stats)
fig, ax = plt.subplots(figsize=(6, 4))
for j, r in enumerate(table.itertuples()):
    ax.bar(np.arange(len(KS)) + (j - 0.5) * 0.4, [getattr(r, f"step2_top{k}") for k in KS], 0.4, label=r.setting)
ax.set_xticks(np.arange(len(KS)), [f"top-{k}" for k in KS])
ax.set_ylabel("step-2 accuracy (held-out)")
ax.set_title(f"layers {table.layers.iloc[0]}")
ax.legend()
title(fig)
R.save_figure(fig)
claims("fig7")
on, off = (table[table.setting == s].iloc[0] for s in ("not masked", "masked"))
print(R.trend("masked < not masked for step 2 (top-1..5)", [off[f"step2_top{k}"] < on[f"step2_top{k}"] for k in KS],
            mixed=report.mixed_data(stats), ties=[(off[f"step2_top{k}"], on[f"step2_top{k}"]) for k in KS]))
R.save_table(table, meta)

# %%
R.publish()  # last step: tables and figure move into place only when all of it worked
