# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # Cross-method comparison
# Every decoder registered in this repository on the same model, prompts and machine.
# Each benchmark group (`<results_root>/cross/raw/bench_<group>.jsonl`) ran its decoders
# interleaved per prompt with its own `vanilla` baseline, so every speedup is a ratio measured
# within one run. Computed from the raw records only (written by `common.harness.bench`): exactly the
# files the artifact declares for the profile's `cross.groups` (a missing or truncated one is
# an error, a stray file in the folder is ignored). The paper packages' own runs on the same
# dataset (`cross.joins`: prompt decoding's, FIRP's and BiLD's MT-Bench benchmarks) join as groups
# named after the package, with their trained decoders and the `vanilla` of their own run.
# Every decoder here is lossless except BiLD away from `rollback_threshold` 0 (`bild@rb0` is its
# exact setting): `identical_to_vanilla` says how many of its outputs still equal vanilla's.
# This comparison is the project's own: no paper reports it, so no paper numbers stand beside it.

# %%
import dataclasses
import json
from pathlib import Path

from common.config import labels_config
from common.workflow.artifacts import cross_joins
from common.records import read_jsonl
from common.harness.cross_tables import cross_rows
from common.harness.render import Render
from common.cost import read_cost_curves
from common.harness.report import check_decoders, check_settings, provenance

# each group's speedups are against its own vanilla, in runs without an A/A pair: no noise line
R = Render(artifact_id, results_root, package, profile, inputs, noise=False)
P = dataclasses.replace(R.profile, results_root=results_root)
joins = {s: {**j, "record": Path(results_root) / j["record"], "stats": Path(results_root) / j["stats"]}
         for s, j in cross_joins(P).items()}
joined = {j["record"].resolve(): s for s, j in joins.items()}
# the cross groups in name order, as the committed tables have always listed them, then the joins
files = sorted(Path(p) for p in R.inputs if Path(p).name.startswith("bench_") and Path(p).resolve() not in joined)
curve = read_cost_curves(R.inputs)  # one curve per host; each group reads its own host's
groups = {f.stem.removeprefix("bench_"): read_jsonl(f) for f in files}
for g, recs in groups.items():  # a group's record must be the run its config describes
    check_decoders(recs, P.cross.groups[g], f"cross/raw/bench_{g}.jsonl", f"cross.groups.{g}",
                   labels_config(P, P.cross.groups[g]))
models = {r["model"] for recs in groups.values() for r in recs}
for s, j in joins.items():
    recs = read_jsonl(j["record"])
    # a label whose setting the config re-chose after the paper run is refused
    check_settings(recs, labels_config(P, {r["decoder"] for r in recs}), str(j["record"]), f"cross.joins.{s}")
    other = {(r["model"], r["dataset"]) for r in recs} - {(m, P.cross.dataset) for m in models}
    if other:  # a join compares only on the cross groups' own model and prompts
        raise ValueError(f"{j['record']}: cross.joins.{s} ran {sorted(other)}; valid: a run of "
                         f"{sorted(models)} on {P.cross.dataset}")
    groups[s] = [r for r in recs if r["decoder"] == "vanilla" or r["decoder"].split("@")[0] in j["decoders"]]
    files.append(j["record"])
records = [r for recs in groups.values() for r in recs]
meta = {**provenance(records), "sources": ", ".join(str(f) for f in files)}
meta

# %% md
# Trained components: extra parameters (what a decoder adds to the target's memory) and training
# wall time, from the statistics their training rules wrote beside the benchmark records. The
# self-distillation corpus both are trained on is generated once and is not counted here. The draft
# is counted whole, as the decoders load it: its embeddings and tied head are frozen copies of the
# target's and could be shared, which would leave only `params_not_shared` in `draft_stats.json`.
# A joined group's decoders load its package's component (`cross.joins.<package>.stats`).
# `ran_on` names the machine a group's benchmark ran on (each group is one run, its own vanilla
# included). `trained_on` names the hardware a component was trained on: training times compare only
# between rows trained on the same. `same_weights` says whether the benchmark decoded the weights
# that training wrote (`common.harness.report.stats_match`: the digest in its stats against the records'
# `components`): `no` is a component retrained after its benchmark, whose speedup is then the
# earlier weights' (`tools/weights_status.py` lists the benchmark to rerun); `unknown`, stats
# written before trainings named their weights' digest.

# %%
joined_stats = {j["stats"].resolve(): s for s, j in joins.items()}
stats = {joined_stats.get(Path(p).resolve(), Path(p).name.removesuffix("_stats.json")): json.loads(Path(p).read_text())
         for p in R.inputs if p.endswith("_stats.json")}


def own_comparison(table) -> str:
    """The note where a paper's table would stand: no paper has this comparison; on how many machines it ran."""
    machines = table.ran_on.nunique()
    return ("No paper reports this comparison: it is this project's own, every method on one model and prompt set"
            + (", on one machine." if machines == 1 else
               f"; the groups ran on {machines} machines (`ran_on`), so each speedup is a ratio to its own group's "
               "vanilla on the same machine, and tokens/s compare only within a machine."))


# %% md
# `extra_mem_mib` is the most memory one call of a decoder added above what was live when it
# began (`mem_growth_bytes`, largest over the prompts), minus the same for its group's `vanilla`
# (`common.harness.report.extra_memory`): its buffers, trees and drafts' caches at decode time. A trained
# component's weights are loaded before any call and are not in it: they weigh `extra_params_m` x 4
# bytes (fp32). On CPU it is the process's own memory, so the gloo sub-worker processes of
# `ppd_pipelined` (each holding a copy of the first layers) are not in it. It is blank for a group
# whose records predate `mem_growth_bytes`: those keep only `peak_mem_mib`, each call's resident
# peak, which counted every page earlier calls of any decoder had left to the allocator (the
# resident set fell between calls a few times in a run of hundreds), so its differences say
# nothing about a decoder.

# %% md
# `mean_accepted_length` is new tokens per target forward for every decoder (1 for `vanilla`).
# For a draft-and-verify decoder proposing gamma tokens a step, (length - 1) / gamma is the share
# of drafted tokens the target accepted when gamma is fixed (`speculative`, `self_speculative`).
# `hf_assisted` runs transformers' defaults: up to 20 drafts a step, cut after the first draft
# token whose draft probability is below 0.4 (the threshold stays fixed: scikit-learn, which
# transformers uses to tune it, is not installed). The `@stop` variants run the same rule in our
# loop (`gamma: 20, confidence: 0.4`), so the two implementations are compared like for like.

# %% md
# The limit columns compare each decoder with what the hardware allows it (`common.harness.report.limits`).
# `step_cost` is its mean verification forward cost in single-token steps, T(q)/T(1), read off
# the machine's cost curve (`cost.fig`, same forward path as the benchmark) at each step's q
# (proposed tokens + the root); `limit` = mean_accepted_length / step_cost is the speedup it
# would reach if a step cost nothing but that forward, and `pct_of_limit` = speedup / limit. A low
# `limit` means the proposals are not accepted often enough (or cost too much to verify); a low
# `pct_of_limit` means the time goes elsewhere: drafting (a draft model's or the heads' own
# forwards), Python around the forward. Blank: decoders that record no per-step proposals
# (transformers' own `generate` loops, pipelined workers), records made before proposals
# were recorded, and every decoder of a group benchmarked on hardware no committed cost curve was
# measured on: T(q) is that machine's own. Each group reads its own host's curve: the rule's latest
# (`cost.fig`) or one kept from an earlier host (`results/cross/raw/cost_curves/`).

# %% md
# Where a step goes (`common.harness.report.step_times`, milliseconds per step over all of a decoder's
# steps, the prefill's wall time included): `step_ms` is the whole step; `target_ms` the target's
# forwards, `propose_ms` the proposer's own work (a draft model's or EAGLE head's forwards, REST's
# datastore lookups) and `other_ms` the rest (trees, masks, acceptance, cache bookkeeping, Python).
# EAGLE's readout of its draft tokens through the LM head counts as proposing from code cbc85a5 on;
# in records of older code (the `code_version` column of the records) it is inside `other_ms`.
# A decoder below its limit loses the difference in `propose_ms` and `other_ms`. Proposers that
# ride on the target's forward or read its states (Medusa's heads, prompt tokens, FIRP's maps) time
# nothing of their own (0): their share is inside `target_ms` and `other_ms`. Blank where the
# records time no target forward (`vanilla`, prompt lookup, transformers' own loops, pipelined workers).

# %% [cross.table]
table = cross_rows(groups, stats, joins, curve)
cols = ["group", "decoder", "prompts", "new_tokens", "tokens_per_s", "speedup", "mean_accepted_length",
        "step_cost", "limit", "pct_of_limit", "step_ms", "target_ms", "propose_ms", "other_ms", "peak_mem_mib",
        "extra_mem_mib", "extra_params_m", "train_wall_s", "trained_on", "same_weights", "ran_on",
        "identical_to_vanilla"]
table = table[cols]
for c in ("step_cost", "limit", "pct_of_limit", "target_ms", "propose_ms", "other_ms"):  # blank, not nan, where none
    table[c] = table[c].astype(object).where(table[c].notna(), None)
ranked = table[table.decoder != "vanilla"].sort_values("speedup", ascending=False)
lossy = [d for d, s in zip(table.decoder, table.identical_to_vanilla) if s.split("/")[0] != s.split("/")[1]]
verdict = (f"this project's comparison (no paper has it): fastest {ranked.decoder.iloc[0]} {ranked.speedup.iloc[0]:.2f}x, "
           f"slowest {ranked.decoder.iloc[-1]} {ranked.speedup.iloc[-1]:.2f}x over {len(ranked)} decoders, each against "
           f"its own group's vanilla; not identical to greedy: {', '.join(lossy) or 'none'}"
           + "".join(f"; benchmarked on other weights than its component's training: {', '.join(d)}"
                     for d in [list(table.decoder[table.same_weights == "no"])] if d))
R.no_paper_numbers(own_comparison(table))
R.save_table(table, {**meta, "verdict": verdict})  # the verdict after the sources, as the table has always put it

# %% [cross.fig]
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

table = cross_rows(groups, stats, joins, curve)
table = table[table.decoder != "vanilla"]
# One row per decoder, sorted by speedup, its name on the axis (never printed over another's):
# speedup with its 95% bootstrap interval on the left, extra peak memory on the right.
rows = table.sort_values("speedup").reset_index(drop=True)
colors = {g: plt.cm.tab10(i % 10) for i, g in enumerate(dict.fromkeys(table.group))}
fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.26 * len(rows) + 1.6), sharey=True,
                             gridspec_kw={"width_ratios": [3, 2]})
y = range(len(rows))
err = [(rows.speedup - rows.speedup_lo).clip(lower=0), (rows.speedup_hi - rows.speedup).clip(lower=0)]
a1.barh(y, rows.speedup, color=[colors[g] for g in rows.group], xerr=err, error_kw={"lw": 0.8})
a1.axvline(1.0, color="grey", lw=0.8, ls="--")
a1.set_yticks(list(y), [f"{d} ({g})" for d, g in zip(rows.decoder, rows.group)], fontsize=7)
a1.set_xlabel("speedup vs its group's vanilla (same run; 95% interval)")
measured = rows.extra_mem_mib.notna()  # blank for groups whose records predate per-call growth
a2.barh([i for i, m in zip(y, measured) if m], rows.extra_mem_mib[measured].astype(float),
        color=[colors[g] for g in rows.group[measured]])  # measured, not derived from parameters
a2.set_xlabel("extra memory per call vs vanilla (MiB, same run; no bar: not in the records)")
fig.suptitle(f"{meta.get('model')}, {meta.get('dataset')}, {meta.get('profile')}\n{meta.get('device')}", fontsize=8)
R.save_figure(fig)
out = table[["group", "decoder", "speedup", "extra_mem_mib", "extra_params_m"]]
faster = out[out.speedup > 1.0]
mem = out.extra_mem_mib.dropna().astype(float)
verdict = (f"this project's comparison (no paper has it): {len(faster)}/{len(out)} decoders faster than vanilla; "
           + (f"extra memory per call {mem.min():.1f}-{mem.max():.1f} MiB over {len(mem)} decoders" if len(mem) else
              "extra memory per call not in these records (they predate mem_growth_bytes)"))
R.no_paper_numbers(own_comparison(table))
R.save_table(out, {**meta, "verdict": verdict})

# %%
R.publish()
