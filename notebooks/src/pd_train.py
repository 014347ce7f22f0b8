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

from common.harness import report
from common.records import read_jsonl
from common.harness.render import Render, paper_numbers
from prompt_decoding.tables import (COLS, ablation_table, accumulated, accumulated_table, epochs, ept_table,
                                    consecutive, gaps, loss_table, no_better, paper_no_better, plain, recipe_table, rising)

R = Render(artifact_id, results_root, package, profile, inputs)  # the declared inputs, staged outputs
inputs = R.inputs
paper = paper_numbers(package)
stats = {Path(p).name.removeprefix("train_").removesuffix("_stats.json"): json.loads(Path(p).read_text())
         for p in inputs if "/prompt_decoding/" in p and p.endswith("_stats.json")}
curves = {Path(p).name.removeprefix("train_").removesuffix("_curve.jsonl"): pd.DataFrame(read_jsonl(p))
          for p in inputs if p.endswith("_curve.jsonl")}
medusa = next((json.loads(Path(p).read_text()) for p in inputs if p.endswith("medusa_stats.json")), None)
ref_name = next(iter(stats))                 # the first training an artifact compares: its reference
main = stats.get("main", stats[ref_name])
by_n = dict(sorted((s["n"], name) for name, s in stats.items() if plain(s, main)))
# the artifact's trainings are the rows its verdicts compare: trained on different data, they test nothing
MIXED = report.mixed_data(stats)
PAPER_EPTS = sorted(int(n) for n in paper["table2"]["rows"])  # the EPT counts the paper swept (Table 2)
meta = {"model": main["model"], "profile": profile,
        "data": (f"trained on greedy answers to {main['train_sequences']} ShareGPT prompts; measured on greedy "
                 f"answers to {main['heldout_sequences']} held-out ShareGPT prompts (every cut)") if not MIXED else
                (f"greedy answers to ShareGPT prompts, {MIXED}; each measured on every cut of its held-out answers"),
        "hardware": ", ".join(sorted({s["hardware"] for s in stats.values()})),
        "code_version": ", ".join(sorted({s["code_version"] for s in stats.values()})),
        "sources": ", ".join(str(p) for p in inputs)}


def paper_trend(name, a, b):
    """:func:`no_better` on the paper's table ``name``."""
    return paper_no_better(paper[name]["rows"], a, b)


# Every training here ran one seed: an accuracy gap smaller than report.ACCURACY_TOL is inside
# what another seed moves, so a comparison resting only on such gaps is a tie, not a verdict
# (each trend below passes the accuracies it compares as ``ties``).


meta

# %% md [pd.table2]
# ## Table 2: EPTs per prompt token
# Accuracy at distances 1 and 2, top-1 and top-5, for each number of ensemble prompt tokens (EPTs)
# trained here, beside the paper's. More EPTs give each prompt token more parameters (its
# guess is the average of its EPTs' logits); the paper finds accuracy rising with them, most
# at distance 2.
#
# Read the rows with their `steps`, `stopped` and `train_seqs`: where a training ends (its step
# budget, the flat rule, or the wall budget) moves the accuracy as much as the EPT count does
# here, and rows trained on different data compare the data, not the EPT count (the verdict
# then says so and counts no test).

# %% [pd.table2]
table, ours, pp = ept_table(stats, by_n, paper["table2"])
R.cut("EPTs", by_n, PAPER_EPTS)
print("paper:", paper["table2"]["cite"])
print(R.trend("accuracy does not fall as EPTs grow (each metric, consecutive EPT counts)", rising(ours), rising(pp),
              mixed=MIXED, ties=consecutive(ours)))
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
R.cut("EPTs", by_n, [PAPER_EPTS[0], PAPER_EPTS[-1]])  # the paper's figure: its fewest and most
A = accumulated(main["acc"])
m = A.shape[0]
most = by_n[max(by_n)]
table = accumulated_table(main, medusa, stats[most] if most != "main" else None)
for c in paper["fig6"]["claims"]:
    print("paper:", c)
if "medusa_head" in table:
    far = table[table.distance >= 2]
    print(R.trend("prompt tokens >= Medusa heads at distance >= 2 (top-1/3/5/10)", far.prompt_tokens >= far.medusa_head,
                  mixed=report.mixed_data({"prompt tokens": main, "Medusa heads": medusa}),
                  ties=list(zip(far.medusa_head, far.prompt_tokens))))
if most != "main":
    col = f"prompt_tokens_{stats[most]['n']}ept"
    print(R.trend(f"{stats[most]['n']} EPTs >= 1 EPT at every distance (top-1/3/5/10)", table[col] >= table.prompt_tokens,
                  mixed=report.mixed_data({n: stats[n] for n in ("main", most)}),
                  ties=list(zip(table.prompt_tokens, table[col]))))

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
R.cut("EPTs", by_n, [PAPER_EPTS[0], PAPER_EPTS[-1]])  # the paper's figure: its fewest and most
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for n, name in by_n.items():
    c = curves[name]
    ep = epochs(c, stats[name])
    axes[0].plot(ep[1:], c.train_loss[1:], marker=".", label=f"{n} EPT{'s' if n > 1 else ''}")
    axes[1].plot(ep, c.heldout_top1.map(lambda v: v[0]), marker=".", label=f"{n} EPT{'s' if n > 1 else ''}")
axes[0].set_ylabel("training loss (eq. 1)")
axes[1].set_ylabel("held-out top-1 @1")
for a in axes:
    a.set_xlabel("epochs")
    a.legend(fontsize=7)
fig.suptitle(f"{meta['model']}, {meta['profile']}, {meta['hardware']}", fontsize=9)
R.save_figure(fig)
table = loss_table(stats, curves, by_n)
for c in paper["fig9"]["claims"]:
    print("paper:", c)
one, many = table.iloc[0], table.iloc[-1]
if len(table) > 1:
    print(R.trend("many EPTs start with a lower loss than 1 EPT", [many.first_loss < one.first_loss], mixed=MIXED))
print(R.trend("the loss falls during training (each EPT count)", table.last_loss < table.first_loss))
R.save_table(table, meta)

# %% md [pd.table3]
# ## Table 3: distillation, epochs and batch size
# Each training here against the reference (distillation, 1 sequence per step): without
# distillation (cross-entropy on ShareGPT's own replies to the same conversations instead of KL
# to the model's distributions along its greedy answers to them) and with 4 sequences per step.
# The paper trains a fixed number of epochs per row; here each training stops at its step limit,
# when its held-out curve flattens or at its wall budget (`steps`, `stopped`), so the rows may
# have seen different numbers of sequences (`epochs`). Two kinds of extra rows come from the
# learning curves, measured on the curve's held-out subset (`measured_on`) rather than on every
# held-out answer: the batch sizes compared at equal sequences seen (the paper's equal epochs),
# and the reference at each whole epoch it completed (none where it trains on less than one).

# %% [pd.table3]
# The paper compares batch sizes at equal epochs; a step limit or a wall budget ends the two
# trainings at different sequences seen, so both are also read off their curves where they had
# seen the same number of sequences (the fewer of the two), on the curve's held-out subset.
table, equal, batch = recipe_table(stats, curves, ref_name)
pp = pd.DataFrame(paper["table3"]["rows"], columns=paper["table3"]["columns"])
R.cut("EPTs", [s["n"] for s in stats.values()], pp.ept)
# epochs each training saw before its step or wall budget ended it (no epoch sweep here)
R.cut("epochs", [round(s["steps"] * s["config"]["batch_size"] / s["train_sequences"], 2) for s in stats.values()],
      pp.epochs)
print("paper:", paper["table3"]["cite"])
print(pp.to_string(index=False))
ref = table.iloc[0]
for name, s in stats.items():
    if not s["distill"]:
        r = table[table.variant == name].iloc[0]
        print(R.trend("distillation >= cross-entropy on the references (each metric)", [ref[c] >= r[c] for c in COLS],
                    [a >= b for a, b in zip(pp.iloc[5, 4:], pp.iloc[6, 4:])],
                    mixed=report.mixed_data({n: stats[n] for n in (ref_name, name)}),
                    ties=[(r[c], ref[c]) for c in COLS]))
    if name in batch:
        mixed = report.mixed_data({n: stats[n] for n in (ref_name, name)})
        r = table[table.variant == name].iloc[0]
        small, big = (ref, r) if ref.batch < r.batch else (r, ref)
        print(R.trend("a smaller batch >= a larger one (each metric, each training's kept weights)",
                    [small[c] >= big[c] for c in COLS], [a >= b for a, b in zip(pp.iloc[7, 4:], pp.iloc[5, 4:])],
                    mixed=mixed, ties=[(big[c], small[c]) for c in COLS]))
        a, b = equal[(name, ref_name)], equal[(name, name)]
        small, big = (a, b) if a["batch"] < b["batch"] else (b, a)
        print(R.trend("a smaller batch >= a larger one at equal sequences seen (each metric, curve subset)",
                    [small[c] >= big[c] for c in COLS], [a >= b for a, b in zip(pp.iloc[7, 4:], pp.iloc[5, 4:])],
                    mixed=mixed, ties=[(big[c], small[c]) for c in COLS]))
cur = table[table.variant.str.endswith("(curve)")]
if len(cur) > 1:
    print(R.trend("accuracy rises with epochs along the reference's curve (@1 top-1)",
                [b >= a for a, b in zip(cur.acc1_top1, cur.acc1_top1[1:])],
                ties=list(zip(cur.acc1_top1, cur.acc1_top1[1:]))))
R.save_table(table, meta)

# %% md [pd.table4]
# ## Table 4: prefix tuning
# Prefix tuning beside the prompt tokens: trained keys and values in every layer's attention (one
# prefix token per prompt token, started from the model's own keys and values for the last init
# text token), seen only by that prompt token's EPTs, so the model's own outputs stay unchanged.
# Decoding does not run such checkpoints (an accuracy ablation, as in the paper).

# %% [pd.table4]
key = lambda s: "with prefix tuning" if s.get("prefix") else "without prefix tuning"
table = ablation_table(stats, key, paper["table4"]["rows"])
print("paper:", paper["table4"]["cite"])
print(R.trend("prefix tuning does not help (each metric)", no_better(table, "without prefix tuning", "with prefix tuning"),
            paper_trend("table4", "without prefix tuning", "with prefix tuning"), mixed=MIXED,
            ties=gaps(table, "without prefix tuning", "with prefix tuning")))
R.save_table(table, meta)

# %% md [pd.table5]
# ## Table 5: a custom decoding head
# A second LM head (a trained copy of the model's, so the prompt tokens' states no longer go
# through the model's own head): trained with the prompt tokens from the start (1-stage, the
# prompt tokens' learning rate), or after the reference's training, starting from its prompt
# tokens at a tenth of the rate (2-stage; `train_min` counts both stages). The head adds the
# vocabulary x hidden parameters the `params` column shows.

# %% [pd.table5]
key = lambda s: ("custom head, 2-stage" if s.get("init_from") else "custom head, 1-stage") if s.get("head") \
    else "without custom head"
table = ablation_table(stats, key, paper["table5"]["rows"])
print("paper:", paper["table5"]["cite"])
print(R.trend("1-stage is below no custom head (each metric)", no_better(table, "without custom head", "custom head, 1-stage"),
            paper_trend("table5", "without custom head", "custom head, 1-stage"), mixed=MIXED,
            ties=gaps(table, "without custom head", "custom head, 1-stage")))
print(R.trend("2-stage >= no custom head (each metric)", no_better(table, "custom head, 2-stage", "without custom head"),
            paper_trend("table5", "custom head, 2-stage", "without custom head"), mixed=MIXED,
            ties=gaps(table, "custom head, 2-stage", "without custom head")))
R.save_table(table, meta)

# %% md [pd.table6]
# ## Table 6: attention among the EPTs
# The ensemble mask (the paper's: EPT *i* of each prompt token sees only EPT *i* of the earlier
# ones, *n* disjoint groups whose logits are averaged) against decoder-like (every earlier EPT)
# and encoder-like (also every EPT of its own prompt token), at the most EPTs trained here.

# %% [pd.table6]
table = ablation_table(stats, lambda s: s["mask"], paper["table6"]["rows"])
print("paper:", paper["table6"]["cite"])
R.cut("EPTs", [s["n"] for s in stats.values()], [PAPER_EPTS[-1]])  # the paper's ablation ran at its most EPTs
for other in ("decoder", "encoder"):
    if other in set(table.setting):
        print(R.trend(f"ensemble >= {other}-like (each metric)", no_better(table, "ensemble", other),
                    paper_trend("table6", "ensemble", other), mixed=MIXED, ties=gaps(table, "ensemble", other)))
R.save_table(table, meta)

# %% md [pd.table7]
# ## Table 7: averaging the EPTs' logits against learned weights
# Learned weights: a trained scalar per EPT (started at 1/n, the average), `p = sum_i w_i p_i`.

# %% [pd.table7]
table = ablation_table(stats, lambda s: s.get("aggregation", "average"), paper["table7"]["rows"])
print("paper:", paper["table7"]["cite"])
R.cut("EPTs", [s["n"] for s in stats.values()], [PAPER_EPTS[-1]])  # the paper's ablation ran at its most EPTs
print(R.trend("the average >= learned weights (each metric)", no_better(table, "average", "learned"),
            paper_trend("table7", "average", "learned"), mixed=MIXED, ties=gaps(table, "average", "learned")))
R.save_table(table, meta)

# %% md [pd.table8]
# ## Table 8: multi-exit ensemble
# A prompt token's state is the average of the last *k* layers' outputs (then the final norm and
# the LM head), an ensemble without more input positions. Decoding does not run such
# checkpoints (an accuracy ablation, as in the paper).

# %% [pd.table8]
table = ablation_table(stats, lambda s: s.get("exits", 1), {int(k): v for k, v in paper["table8"]["rows"].items()})
print("paper:", paper["table8"]["cite"])
for k in sorted(set(table.setting) - {1}):
    print(R.trend(f"{k} exits do not help (each metric)", no_better(table, 1, k),
                paper_trend("table8", 1, k), mixed=MIXED, ties=gaps(table, 1, k)))
R.save_table(table, meta)

# %%
R.publish()  # last step: tables and figure move into place only when all of it worked
