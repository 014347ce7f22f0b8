# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # The cross-method study
# Every method this repository has, at one setting each (config `study`, chosen from its own section's
# records), on every task category, following Spec-Bench's protocol: the same model, prompts and machine
# for every method, decoders interleaved per prompt, speedup and mean accepted length per category, an
# equality check against greedy. Each dataset is one run (`<results_root>/cross/raw/study_<dataset>.jsonl`,
# rule `study_bench`) with its own `vanilla` and the A/A pair `vanilla@aa` (vanilla again, last in each
# prompt): the A/A spread is the run's noise floor, so a speedup within it of another is a tie.
# Categories are Spec-Bench's names (`common.harness.specbench.category_of`): MT-Bench's eight from the records,
# a dataset's task where the dataset stands for one (the mined ShareGPT stand-ins offline: they are
# stand-ins, not Spec-Bench's own sources), `code` for HumanEval (beyond Spec-Bench).
# No paper reports this comparison: it is this project's own, so no paper numbers stand beside it.

# %%
import dataclasses
import json
from pathlib import Path

import pandas as pd

from common.config import AA_LABEL, labels_config, placeholder
from common.workflow.artifacts import study_section
from common.harness.cross_tables import fastest_lines, per_category, study_runs
from common.harness.render import Render
from common.cost import cost_of, curve_fits, host_curve, read_cost_curves
from common.harness.report import (components_line, extra_memory, limits, noise_line, provenance, stats_match,
                                   step_positions, summarize)
from common.harness.specbench import export

R = Render(artifact_id, results_root, package, profile, inputs)
P = dataclasses.replace(R.profile, results_root=results_root)
study = study_section(P)
runs = study_runs(R.inputs, "study_", study["bench"], "study.bench", P)  # dataset -> its run's records
records = [r for recs in runs.values() for r in recs]
decoders = [d for d in dict.fromkeys(r["decoder"] for r in records) if d != "vanilla"]
categories = list(dict.fromkeys(r["category"] for r in records))
meta = {**provenance(records), "sources": ", ".join(f"cross/raw/study_{d}.jsonl" for d in runs)}
meta["noise"] = noise_line(runs)
meta["components"] = components_line(runs)  # the datasets run in several sessions: the same weights in each?
meta

# %% md
# Every speedup is a ratio of totals within one run: a decoder's new tokens over its summed wall time,
# over vanilla's on the same prompts (`common.harness.report.summarize`); a category's speedup uses only its
# prompts, `overall` every prompt of every run (Spec-Bench's overall). The 95% intervals resample prompts.
# `identical` counts outputs equal to vanilla's (greedy, fp32): every method is lossless but `bild`
# away from rollback threshold 0, marked `lossy`.

# %%
long = per_category(records, categories)
ov = long[long.category == "overall"].set_index("decoder")  # the overall rows, by decoder

# %% [study.table]
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import TwoSlopeNorm

wide = long.pivot(index="decoder", columns="category", values="speedup").reindex(index=decoders)
wide = wide[[*categories, "overall"]]
overall = ov.reindex(decoders)
table = wide.reset_index()
table["overall_lo"] = overall.speedup_lo.to_numpy()
table["overall_hi"] = overall.speedup_hi.to_numpy()
table["tau"] = overall.mean_accepted_length.to_numpy()
table["identical"] = overall.identical_to_vanilla.to_numpy()
table["lossless"] = ["yes" if x else "lossy" for x in overall.lossless]
verdict = "; ".join(fastest_lines(long))

fig, ax = plt.subplots(figsize=(1.1 * wide.shape[1] + 3, 0.42 * wide.shape[0] + 1.5))
values = wide.to_numpy(dtype=float)
norm = TwoSlopeNorm(vcenter=1.0, vmin=min(0.5, float(pd.DataFrame(values).min().min())),
                    vmax=max(1.5, float(pd.DataFrame(values).max().max())))
im = ax.imshow(values, cmap="RdBu", norm=norm, aspect="auto")
for i in range(values.shape[0]):
    for j in range(values.shape[1]):
        if values[i, j] == values[i, j]:
            ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=7)
ax.set_xticks(range(wide.shape[1]), wide.columns, rotation=35, ha="right", fontsize=8)
ax.set_yticks(range(wide.shape[0]), [d + ("" if ok else " (lossy)") for d, ok in zip(decoders, overall.lossless)],
              fontsize=8)
ax.set_title(f"speedup over vanilla (same run), {meta.get('model')}, {meta.get('profile')}\n{meta.get('device')}",
             fontsize=8)
fig.colorbar(im, ax=ax, shrink=0.8, label="speedup")
R.save_figure(fig)

# The Spec-Bench export: one answer file per label, Spec-Bench's fields and category names, so its
# evaluation/speed.py (--file-path <label>.jsonl --base-path vanilla.jsonl) and equal.py read them.
written = export(records, R.stage("specbench"), name=lambda r: f"{r['decoder']}.jsonl")
print("Spec-Bench export:", json.dumps(written))
R.no_paper_numbers("No paper reports this comparison: it is this project's own, every method on one model, prompt set "
                   "and machine. Spec-Bench's leaderboard (its models and GPUs) ranks the same methods; our records, "
                   "exported in its format beside this table, can be scored by its own scripts.")
R.save_table(table, {**meta, "verdict": verdict})  # the verdict after the sources, as the table has always put it

# %% [study.detail]
detail = long[["category", "decoder", "prompts", "new_tokens", "tokens_per_s", "speedup", "speedup_lo", "speedup_hi",
               "mean_accepted_length", "aa_spread", "identical_to_vanilla", "lossless"]]
lossy = sorted({d for d, ok in zip(long.decoder, long.lossless) if not ok})
verdict = (f"{len(decoders) - 1} methods x {len(categories)} categories; not identical to greedy on every prompt: "
           f"{', '.join(lossy) or 'none'}; " + "; ".join(fastest_lines(long)))
R.no_paper_numbers("No paper reports this comparison: it is this project's own (Spec-Bench's table shape, with "
                   "intervals).")
R.save_table(detail, {**meta, "verdict": verdict})

# %% md
# Beside Spec-Bench's published leaderboard (`common/harness/specbench_leaderboard.yaml`, from its
# Leaderboard.md): per Spec-Bench task, the order of the methods both rank, ours beside each board's,
# and the Spearman correlation of the two orders. MT-Bench's eight categories together are its
# multi-turn conversation, and `overall` here is its six tasks together (HumanEval's code left out).
# Its numbers come from Vicuna-7B in fp16 on a GPU, ours from this profile's model on this machine:
# the orders compare, the speedups do not (a method's step cost and limit are the machine's,
# study.positions).

# %% [study.specbench]
from common.harness.specbench import leaderboard, ranks_beside, task_of

lb = leaderboard()
ours = {}  # Spec-Bench task -> {label: our speedup}, from that task's prompts of every run
for task in lb["tasks"]:
    recs = [r for r in records
            if (task_of(r["category"]) is not None if task == "overall" else task_of(r["category"]) == task)]
    if recs:
        t = summarize(recs)
        ours[task] = dict(zip(t.decoder, t.speedup))
ranks = pd.DataFrame([{"board": name, **row} for name, board in lb["boards"].items()
                      for row in ranks_beside(ours, board, lb["methods"], lb["tasks"])],
                     columns=["board", "task", "methods", "ours", "specbench", "spearman", "same_fastest"])
lines = []
for name, g in ranks.groupby("board", sort=False):
    ov_row = g[g.task == "overall"]
    lines.append(f"{name}: the same fastest method in {int(g.same_fastest.sum())}/{len(g)} tasks"
                 + ("" if ov_row.empty or ov_row.spearman.isna().all() else
                    f"; overall order Spearman {float(ov_row.spearman.iloc[0]):+.2f} (ours {ov_row.ours.iloc[0]};"
                    f" Spec-Bench {ov_row.specbench.iloc[0]})"))
src = lb["source"]
sb_meta = {**meta, "specbench": f"{src['repo']} {src['path']} at {src['commit'][:12]}; "
           + "; ".join(f"{n}: {b['model']}, {b['device']}" for n, b in lb["boards"].items()),
           "methods": ", ".join(f"{m} = {lab}" for m, lab in lb["methods"].items()),
           "verdict": "; ".join(lines)}
R.no_paper_numbers("Spec-Bench's leaderboard is the published comparison of these methods: its orders stand beside "
                   "ours; its speedups (other models, GPUs) do not compare with ours and are not shown as if they did.")
R.save_table(ranks, sb_meta)

# %% md
# Verified positions per step: a tree or chain decoder verifies q positions in one target forward (its
# proposals + the root + positions it injects, in full-forward equivalents, as `common.harness.report.limits`
# counts them). On this machine a forward of q positions costs T(q)/T(1) single-token steps (`cost.fig`),
# so a decoder gains only where its mean accepted length tau exceeds that cost: the grey curve is
# break-even. Decoders that record no per-step proposals (transformers' own loops, pipelined workers,
# BiLD) are not in this figure.

# %% [study.positions]
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

curve = read_cost_curves(R.inputs)  # one curve per host: the study's own is read
fits = len({r["device"] for r in records}) == 1 and curve_fits(curve, records[0]["device"])
lim = limits(records, curve).set_index("decoder") if fits else None
rows = []
for d in decoders:
    if d == AA_LABEL:
        continue
    qs = step_positions([r for r in records if r["decoder"] == d])
    if not qs:  # no per-step proposals recorded
        continue
    q = sum(qs) / len(qs)
    rows.append({"decoder": d, "positions_per_step": q, "tau": ov.loc[d, "mean_accepted_length"],
                 "speedup": ov.loc[d, "speedup"],
                 "step_cost": None if lim is None else lim.loc[d, "step_cost"],
                 "limit": None if lim is None else lim.loc[d, "limit"],
                 "pct_of_limit": None if lim is None else lim.loc[d, "pct_of_limit"]})
pos = pd.DataFrame(rows, columns=["decoder", "positions_per_step", "tau", "speedup", "step_cost", "limit",
                                  "pct_of_limit"])
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
for _, r in pos.iterrows():
    for ax, y in ((a1, r.tau), (a2, r.speedup)):
        ax.scatter(r.positions_per_step, y, s=40, label=r.decoder)
if fits and len(pos):
    path = records[0].get("forward_path", "fast")
    ratio = cost_of(curve, path, records[0]["device"])
    own = host_curve(curve, records[0]["device"])
    measured = max(int(r["q"]) for r in own if r.get("forward_path", "stock") == path)
    qmax = max(2.0, float(pos.positions_per_step.max()) * 1.1)
    xs = [1 + i * (qmax - 1) / 100 for i in range(101)]
    inside = [x for x in xs if x <= measured]
    a1.plot(inside, [ratio(x) for x in inside], color="grey", lw=1, label="break-even: T(q)/T(1)")
    beyond = [measured] + [x for x in xs if x > measured]
    if len(beyond) > 1:  # past the curve's last measured q: extrapolated along its last segment
        a1.plot(beyond, [ratio(x) for x in beyond], color="grey", lw=1, ls=":", label="extrapolated")
a2.axhline(1.0, color="grey", lw=0.8, ls="--")
a1.set_xlabel("verified positions per step (mean)")
a1.set_ylabel("mean accepted length tau")
a2.set_xlabel("verified positions per step (mean)")
a2.set_ylabel("speedup over vanilla (same run)")
a2.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
fig.suptitle(f"{meta.get('model')}, {meta.get('profile')}, all categories\n{meta.get('device')}", fontsize=8)
R.save_figure(fig)
above = [r.decoder for r in pos.itertuples() if r.step_cost is not None and not pd.isna(r.step_cost) and r.tau > r.step_cost]
verdict = (f"{len(pos)} decoders record their proposals; "
           + (f"tau above the step cost (can beat vanilla here): {', '.join(above) or 'none'}" if fits else
              "the cost curve was measured on other hardware than the study: no break-even curve"))
R.no_paper_numbers("No paper reports this comparison: it is this project's own, every tree and chain decoder against "
                   "this machine's cost curve.")
R.save_table(pos, {**meta, "verdict": verdict})

# %% md
# What each method costs besides decoding: the extra parameters of its trained component and the
# wall time that trained it (REST: its datastore's build time), from the training records
# `study.stats` names, and the extra memory one call added above what was live when it began, minus
# vanilla's, over every run (`common.harness.report.extra_memory`; components and datastores are loaded
# before any call and are not in it; blank where the records predate per-call growth, see
# `cross.table`). `trained_on` names the machine that trained it: training times compare only
# between rows trained on the same; `same_weights`, whether the runs decoded the weights that
# training wrote (`no`: retrained since, so the speedup is the earlier weights'; `unknown`: no
# digest to compare, as in `cross.table`). The corpus the components learned from is generated once for
# all and not counted.

# %% [study.cost]
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

stats_paths = {s: Path(results_root) / p for s, p in study["stats"].items()}
stats = {s: json.loads(p.read_text()) for s, p in stats_paths.items() if str(p) in R.inputs}
options = labels_config(P, study["bench"]["decoders"])
extra_mem = extra_memory(records)  # None throughout for records that predate mem_growth_bytes
rows = []
for d in decoders:
    if d == AA_LABEL:
        continue
    named = [placeholder(v) for v in options.get(d, {}).values() if placeholder(v) in stats]
    s = stats[named[0]] if named else {}
    rows.append({"decoder": d, "component": named[0] if named else None,
                 "extra_params_m": s["params"] / 1e6 if "params" in s else (0.0 if not named else None),
                 "train_s": s.get("train_wall_s", s.get("build_s")),
                 "trained_on": s.get("hardware"),
                 "same_weights": stats_match(s, [r for r in records if r["decoder"] == d]) if named else None,
                 "extra_mem_mib": extra_mem.get(d),
                 "speedup": ov.loc[d, "speedup"], "lossless": bool(ov.loc[d, "lossless"])})
cost = pd.DataFrame(rows)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
for _, r in cost.iterrows():
    a1.scatter(r.train_s if r.train_s is not None and not pd.isna(r.train_s) else 0.0, r.speedup, s=40, label=r.decoder)
    if pd.notna(r.extra_mem_mib):
        a2.scatter(r.extra_mem_mib, r.speedup, s=40, label=r.decoder)
for ax in (a1, a2):
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
a1.set_xscale("symlog", linthresh=10)
a1.set_xlabel("training wall time (s; 0: nothing trained)")
a1.set_ylabel("speedup over vanilla, all categories")
a2.set_xlabel("extra memory per call vs vanilla (MiB)")
# one legend entry per decoder (a1 has every point; a2 only the measured ones): no label overprints
a2.legend(*a1.get_legend_handles_labels(), fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
if not cost.extra_mem_mib.notna().any():
    a2.text(0.5, 0.5, "not in these records\n(they predate mem_growth_bytes)", ha="center", va="center",
            transform=a2.transAxes, fontsize=8)
fig.suptitle(f"{meta.get('model')}, {meta.get('profile')}\n{meta.get('device')}", fontsize=8)
R.save_figure(fig)
free = cost[cost.component.isna()].sort_values("speedup", ascending=False)
trained = cost[cost.component.notna()].sort_values("speedup", ascending=False)
verdict = (f"fastest with nothing trained: {free.decoder.iloc[0]} {free.speedup.iloc[0]:.2f}x" if len(free) else
           "every method trains a component") + (
    f"; fastest trained: {trained.decoder.iloc[0]} {trained.speedup.iloc[0]:.2f}x" if len(trained) else "") + "".join(
    f"; benchmarked on other weights than its component's training: {', '.join(d)}"
    for d in [list(cost.decoder[cost.same_weights == "no"])] if d)
R.no_paper_numbers("No paper reports this comparison: it is this project's own.")
R.save_table(cost, {**meta, "verdict": verdict})

# %% md [study.oracle]
# Choosing per prompt between methods, with hindsight: on each prompt the oracle takes the least wall time
# among the methods whose output equals vanilla's there (a method that differs from greedy on a prompt is
# no candidate on it; vanilla and its A/A twin never are), and its speedup is vanilla's summed wall time
# over the oracle's, within each run (`common.harness.cross_tables.oracle_rows`). `oracle_all` chooses among
# every method, `oracle_two` between the two fastest lossless methods overall (the pair issue #79 names);
# `oracle_all` is at least the best single method by construction, so that comparison is no evidence.
# Hindsight on noisy timings also flatters the oracle: `aa_oracle` is what choosing the faster of vanilla
# and its identical A/A twin gains from noise alone. The pool (`common/decoders/pool.py`) chooses per step
# instead, among every source's candidates in one verified tree, without hindsight; its columns say
# whether it has run.

# %% [study.oracle]
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from common.harness.cross_tables import POOL, best_pair, oracle_rows

NOT_RUN = "not run (study.pending)"
pools = [lab for lab in dict.fromkeys([*study["bench"]["decoders"], *study.get("pending", [])])
         if lab.split("@")[0] == POOL]
pair = best_pair(runs)
orc = oracle_rows(runs, categories, pools, pair, absent=NOT_RUN)
ran_pools = [lab for lab in pools if (orc[lab] != NOT_RUN).all()]
top = orc[orc.category == "overall"].iloc[0]
speed = lambda v: "—" if v is None or pd.isna(v) else f"{v:.2f}x"  # a blank cell: fewer than two lossless methods
orc_meta = {**meta, "pair": (" and ".join(pair) + " (the two fastest lossless methods overall)" if len(pair) == 2
                             else f"fewer than two lossless methods ({', '.join(pair) or 'none'}): no pair"),
            "overall": f"best single {top.best_single or '—'} {speed(top.best_single_speedup)}; oracle of the pair "
                       f"{speed(top.oracle_two)}; oracle of every method {speed(top.oracle_all)}; "
                       f"A/A oracle {speed(top.aa_oracle)}"}

cats = orc[orc.category != "overall"]
if ran_pools:
    for lab in ran_pools:
        cells = cats[cats[lab].notna()]  # blank: the pool lacks some of the category's prompts
        R.trend(f"{lab} reaches the per-prompt oracle over every method", list(cells[lab] >= cells.oracle_all),
                over=f"{len(cells)} categories", gaps=list(zip(cells[lab], cells.oracle_all)))
        R.trend(f"{lab} beats the best single method", list(cells[lab] > cells.best_single_speedup),
                over=f"{len(cells)} categories", gaps=list(zip(cells[lab], cells.best_single_speedup)))
else:
    R.verdict("no verdict: no pool record yet (" + (f"{', '.join(pools)} in study.pending, not run" if pools else
              "no pool label in study.bench or study.pending") + "); the oracle columns are what a pool run will be "
              "measured against")

series = [("best single", orc.best_single_speedup), ("oracle of the pair", orc.oracle_two.astype(float)),
          ("oracle of every method", orc.oracle_all)] + [(lab, pd.to_numeric(orc[lab])) for lab in ran_pools]
fig, ax = plt.subplots(figsize=(0.75 * len(orc) * max(1, len(series) / 4) + 3, 4.2))
width = 0.8 / len(series)
for i, (name, ys) in enumerate(series):
    ax.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(orc))], ys.astype(float), width, label=name)
ax.scatter(range(len(orc)), orc.aa_oracle.astype(float), marker="_", s=300, color="black",
           label="A/A oracle (noise alone)")
ax.axhline(1.0, color="grey", lw=0.8, ls="--")
ax.set_xticks(range(len(orc)), orc.category, rotation=35, ha="right", fontsize=8)
ax.set_ylabel("speedup over vanilla (same run)")
ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
if not ran_pools:
    ax.text(0.01, 0.97, f"pool: {NOT_RUN}", transform=ax.transAxes, fontsize=8, va="top")
ax.set_title(f"per-prompt oracle vs best single method, {meta.get('model')}, {meta.get('profile')}\n"
             f"{meta.get('device')}", fontsize=8)
R.save_figure(fig)
R.no_paper_numbers("No paper reports this comparison: it is this project's own (issue #79), an upper bound from "
                   "hindsight over this study's records beside the pool that chooses per step.")
R.save_table(orc, orc_meta)

# %% md [study.sampled]
# ## The study at temperature 1
# The lossless decoders that sample (config `study.sampled`: pipelined decoding cannot, BiLD is lossy), on
# the first prompts of each dataset, each run at temperature 1 with one seed (rule `study_sampled_bench`,
# `cross/raw/sampled_study_<dataset>.jsonl`), interleaved per prompt with `vanilla` sampling at the same
# settings and its A/A pair. A sampled output is exact in distribution, not equal to vanilla's (the draws
# differ by design: `cross.sampling` tests the distributions); beside each decoder its greedy speedup and τ
# on the same prompts from the greedy study, and `tau_vs_greedy`, the τ kept at temperature 1 (what EAGLE
# and Spec-Bench report beside their sampled speedups).

# %% [study.sampled]
from common.harness.cross_tables import sampled_rows
from common.harness.report import decoding_line

sruns = study_runs(R.inputs, "sampled_study_", study["sampled"], "study.sampled", P)
srecs = [r for recs in sruns.values() for r in recs]
table = sampled_rows(records, srecs)
kept = table.dropna(subset=["tau_vs_greedy"])
best = table.sort_values("speedup").iloc[-1]
R.verdict(f"{int((kept.tau_vs_greedy >= 0.85).sum())} of {len(kept)} decoders keep >= 85% of their greedy tau at "
          f"temperature 1; the fastest there: {best.decoder} {best.speedup:.2f}x (greedy on the same prompts: "
          f"{best.greedy_speedup:.2f}x)")
eagle = table[table.decoder.str.startswith("eagle")]
if len(eagle):
    R.trend("the EAGLE family keeps >= 85% of its greedy tau at temperature 1 (issue #80's aim)",
            list(eagle.tau_vs_greedy >= 0.85), over=f"{len(eagle)} EAGLE settings, {int(eagle.prompts.max())} prompts",
            records=srecs)
R.no_paper_numbers("No paper reports this comparison at temperature 1 on this model: EAGLE and Spec-Bench report "
                   "their own T = 1 columns (other models and GPUs); here every method runs on one model and machine.")
R.save_table(table, {**provenance(srecs), "noise": noise_line(sruns), "decoding": decoding_line(srecs),
                     "greedy columns": "the greedy study's records on the same prompts",
                     "sources": ", ".join(f"cross/raw/sampled_study_{d}.jsonl" for d in sruns)})

# %% md [study.calibration]
# The pool scores every candidate node by an acceptance probability it calibrates online per source and
# depth; each record's `extra.pool_calibration` holds, for that call, the nodes verified (`tested`), their
# mean predicted acceptance and the observed acceptance rate. Here they are pooled over prompts per pool
# label, source and depth (`common.harness.cross_tables.calibration_rows`: tested-weighted means). A cell is
# calibrated when its observed rate lies within two binomial standard errors of the prediction (`se`, as
# if its nodes were independent draws at the predicted rate: a node counts as tested when its parent was
# accepted, and of siblings at most one is, so the bound is approximate).

# %% [study.calibration]
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from common.harness.cross_tables import POOL, calibration_rows

pools = [lab for lab in dict.fromkeys([*study["bench"]["decoders"], *study.get("pending", [])])
         if lab.split("@")[0] == POOL]
cal = calibration_rows(runs)
labels = list(dict.fromkeys(cal.decoder)) or [None]
fig, axes = plt.subplots(1, len(labels), figsize=(4.6 * len(labels) + 1.5, 4.4), squeeze=False)
for ax, lab in zip(axes[0], labels):
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="calibrated")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted acceptance (tested-weighted mean)")
    ax.set_ylabel("observed acceptance rate")
    if lab is None:
        ax.text(0.5, 0.5, "no pool record yet\n(study.pending: not run)", ha="center", va="center",
                transform=ax.transAxes, fontsize=9)
        continue
    g = cal[cal.decoder == lab]
    for src, h in g.groupby("source", sort=False):
        ax.scatter(h.predicted, h.observed, s=15 + 300 * h.tested / cal.tested.max(), alpha=0.7, label=src)
        for r in h.itertuples():  # which depth each marker is: calibration drifts with depth
            ax.annotate(str(r.depth), (r.predicted, r.observed), fontsize=6, ha="center", va="center")
    ax.set_title(lab, fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
fig.suptitle(f"the pool's acceptance calibration (marker area ~ nodes tested), {meta.get('model')}, "
             f"{meta.get('profile')}\n{meta.get('device')}", fontsize=8)
R.save_figure(fig)
cal_meta = dict(meta)
if cal.empty:
    R.verdict("no verdict: no record carries pool_calibration yet (" + (
        f"{', '.join(pools)} in study.pending, not run" if pools else "no pool label in study.bench or study.pending")
        + "): nothing to calibrate")
else:
    cal_meta["mean absolute gap"] = "; ".join(
        f"{lab} {src}: {(h.gap.abs() * h.tested).sum() / h.tested.sum():.3f} over {int(h.tested.sum())} nodes"
        for (lab, src), h in cal.groupby(["decoder", "source"], sort=False))
    for lab, g in cal.groupby("decoder", sort=False):
        R.trend(f"{lab}: observed acceptance within two standard errors of the predicted",
                list(g.gap.abs() <= 2 * g.se), over=f"{len(g)} source x depth cells")
R.no_paper_numbers("No paper reports this: the pool and its calibration are this project's own (issue #79).")
R.save_table(cal, cal_meta)

# %%
R.publish()  # last step: tables, figures and the export move into place only when all of it worked
