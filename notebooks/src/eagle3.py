# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # EAGLE-3's ablation: which part buys what on this model
# EAGLE-3 (Li et al., 2025) changes three things from EAGLE-2's draft head: the head reads a fusion of a
# low, a middle and a high layer's features instead of the last one (and drops the feature-regression
# loss), it is trained with a *training-time test* (unrolled on its own outputs, with the attention it
# sees when drafting), and it is trained on much more data. The rows below add one of these at a time
# (config `eagle3_ablation.heads`; what each row adds is read from the training records): EAGLE's head,
# then EAGLE-3's head with one unrolled step (the fused features alone), then with the training-time
# test, then on the larger corpus. Each head drafts the same static tree in one interleaved benchmark run
# with vanilla and its A/A pair (`cross/raw/eagle3_ablation_<dataset>.jsonl`, rule `eagle3_ablation_bench`).
# Columns: held-out top-1 at each depth of a drafted chain given correct ancestors (`top1_d1..4`, the
# training records' `depth_acc_top1`), the expected accepted length of the 8-node tree those rates predict
# (`tau_predicted`), the measured `tau` (new tokens per target forward) and speedup over vanilla in the
# same run with its 95% interval, and the outputs identical to vanilla's (greedy, fp32: lossless).
# `precision` is that of the training steps (bfloat16: the frozen pass and the head's steps in bf16, its
# weights fp32); the held-out metrics and the benchmark run the head in fp32 either way. Where it
# differs from the row before, `adds` says so: it is a confound of that row, not an ingredient.

# %%
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from common.config import AA_LABEL, labels_config
from common.harness.ablation_tables import DEPTHS, ablation_rows
from common.harness.render import Render
from common.harness.report import check_decoders, noise_line, provenance, summarize

R = Render(artifact_id, results_root, package, profile, inputs)
P = R.profile
section = P.raw["eagle3_ablation"]
heads = list(section["heads"])
stats = {h: R.find(f"/{h}_stats.json") for h in heads}
runs = R.runs("eagle3_ablation_")  # dataset -> the run's records
labels = [*section["bench"]["decoders"], AA_LABEL]
options = labels_config(P, labels)
for ds, recs in runs.items():
    check_decoders(recs, labels, f"cross/raw/eagle3_ablation_{ds}.jsonl", f"eagle3_ablation.bench ({ds})", options)
records = [r for recs in runs.values() for r in recs]
meta = {**provenance(records), "sources": ", ".join(Path(p).name for p in R.inputs), "noise": noise_line(runs)}
meta

# %% [cross.eagle3]
tables = []
for ds, recs in runs.items():
    rows = ablation_rows(heads, stats, summarize(recs), options)
    rows.insert(0, "dataset", ds)
    tables.append(rows)
import pandas as pd

table = pd.concat(tables, ignore_index=True)
for ds, rows in table.groupby("dataset", sort=False):
    steps = list(zip(rows["adds"].iloc[1:], rows.tau.iloc[:-1], rows.tau.iloc[1:],
                     rows.speedup.iloc[:-1], rows.speedup.iloc[1:]))
    measured = [(a, t0, t1, s0, s1) for a, t0, t1, s0, s1 in steps if None not in (t0, t1, s0, s1)]
    # the paper's claim (EAGLE-3, Table 4 and its ablation): each of these raises the accepted length
    R.trend(f"{ds}: each added part raises tau (row over row)", [t1 > t0 for _, t0, t1, _, _ in measured],
            [True] * len(measured), over=f"{len(measured)} steps of the ablation: " + "; ".join(a for a, *_ in measured))
    R.trend(f"{ds}: and the speedup", [s1 > s0 for *_, s0, s1 in measured], [True] * len(measured),
            gaps=[(s1, s0) for *_, s0, s1 in measured], over="the same steps")
R.no_paper_numbers("EAGLE-3's paper reports its ablation on LLaMA-3.1-8B-Instruct and a GPU (tau and speedup for "
                   "EAGLE-2, + the training-time test and fused features, + more data); the trend lines above test "
                   "its claim that each part raises acceptance, not its values.")

fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
first = table[table.dataset == table.dataset.iloc[0]]
for r in first.itertuples():
    ax.plot(range(1, DEPTHS + 1), [getattr(r, f"top1_d{d}") for d in range(1, DEPTHS + 1)], marker="o",
            label=f"{r.head}: {r.adds}"[:70])
ax.set_xlabel("draft depth")
ax.set_ylabel("held-out top-1 (correct ancestors)")
ax.set_xticks(range(1, DEPTHS + 1))
ax.legend(fontsize=6)
bx.bar(range(len(first)), first.speedup.fillna(0.0))
bx.axhline(1.0, color="black", lw=0.8)
bx.set_xticks(range(len(first)), first["head"], rotation=20, fontsize=8)
bx.set_ylabel("speedup over vanilla (same run)")
fig.suptitle(f"{meta.get('model')}, {meta.get('profile')}; {meta.get('device')}", fontsize=8)
R.save_figure(fig)
R.save_table(table, meta)

# %%
R.publish()  # last step: tables and figures move into place only when all of it worked
