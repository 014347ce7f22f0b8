# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # BiLD: model analysis and example outputs (appendix 7.3.1 and 7.3.2: Figures 8 and 10)
# Both read the sweeps (`bild/raw/sweep_<task>_<variant>.jsonl`, rule `bild_sweep`) and show, per
# task and small-model variant, BiLD at the setting with roughly the large model's quality: Table
# 1's fastest setting without loss, else its fastest within one point, else the grid's best quality
# (`bild.analysis.chosen_setting`; the cell is named beside the setting). That choice is the paper's,
# on the reference metric; on stand-in references it is noise-bound, so each chosen setting also
# states `agree_tokens`, the share of the large model's own greedy tokens it keeps.

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bild.config import from_profile
from bild.tables import chosen_changes_output, chosen_settings, examples_table, fig8_table
from common.harness.render import Render, paper_numbers
from common.harness.report import provenance

R = Render(artifact_id, results_root, package, profile, inputs, build_cfg=from_profile)
cfg = R.cfg
sweeps = {tuple(name.rsplit("_", 1)): recs for name, recs in R.runs("sweep_").items()}  # (task, variant)
chosen = chosen_settings(sweeps, lambda t: cfg.task(t).metric)
meta = {**provenance([r for recs in sweeps.values() for r in recs]), "sources": ", ".join(R.inputs)}
meta["chosen settings"] = (chosen_changes_output(chosen)
                           or "each keeps the large model's own greedy output (agree_tokens 1)")
meta

# %% md [bild.fig8]
# Figure 8: FLOPs, memory operations (MOPs) and arithmetic intensity (FLOPs per element moved),
# counted analytically (`bild.flops`) over the forwards each run made: vanilla's one per token;
# BiLD's large- and small-model forwards as its decoder logged them (new positions, cached
# positions). Weights are read once per forward, so the large model's non-autoregressive passes
# cut MOPs while FLOPs stay (plus the small model's). All normalised to vanilla over the same
# prompts, beside the measured speedup; the paper's CNN/DM numbers (from its text) in the last row.

# %% [bild.fig8]
p8 = paper_numbers(package)["fig8"]
table = fig8_table(chosen, sweeps, R.find("models.jsonl"), p8)
R.save_table(table, meta)
ours = table[~table.task.str.startswith("paper") & table.mops.notna()]
fig, ax = plt.subplots(figsize=(2 + 2.2 * max(len(ours), 1), 4))
bars = ["flops", "mops", "intensity", "speedup"]
width = 0.8 / len(bars)
for i, b in enumerate(bars):
    ax.bar([j + i * width for j in range(len(ours))], ours[b], width, label=b if b != "mops" else "MOPs")
ax.axhline(1.0, color="black", lw=0.8)
ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ours))])
ax.set_xticklabels([f"{t}\n{v}" for t, v in zip(ours.task, ours.variant)], fontsize=8)
ax.set_ylabel("BiLD / vanilla")
ax.set_title(f"{meta.get('model')}, {meta.get('device')}; paper (CNN/DM): MOPs x{p8['mops']}, "
             f"intensity x{p8['intensity']}, speedup {p8['speedup']}x", fontsize=8)
ax.legend(fontsize=7)
R.save_figure(fig)
for r in ours.itertuples():
    print(f"{r.task} ({r.variant}): MOPs cut {1 / r.mops:.1f}x, intensity up {r.intensity:.1f}x, FLOPs x{r.flops:.2f}, "
          f"speedup {r.speedup:.2f}x (paper: ~{1 / p8['mops']:.0f}x, ~{p8['intensity']:.0f}x, slightly above 1, "
          f"{p8['speedup']}x)")
print(R.trend("BiLD moves fewer memory elements than vanilla (MOPs < 1, per task and variant)", ours.mops < 1.0, [p8["mops"] < 1.0],
              over=f"the chosen settings (speedup {ours.speedup.min():.2f}-{ours.speedup.max():.2f}x)"))
print(R.trend("its arithmetic intensity is above vanilla's", ours.intensity > 1.0, [p8["intensity"] > 1.0],
              over="the same settings"))
print(R.trend("and it is faster than vanilla", ours.speedup > 1.0, [p8["speedup"] > 1.0], over="the same settings",
              caveat="counted FLOPs/MOPs are analytic; the speedup is measured on this CPU"))

# %% md [bild.fig10]
# Figure 10: a few prompts per task and variant, first those where the small model alone
# (`bild/raw/oracle_<task>_<variant>.jsonl`, threshold 0) wrote something other than the large
# model alone (`vanilla` in the sweep): the reference, both models alone, and BiLD's output with
# the large model's tokens in **bold** (the decoder's per-token sources; a run of tokens is bold
# where the large model produced it). The paper's examples are IWSLT translations.

# %% [bild.fig10]
oracles = {tuple(name.rsplit("_", 1)): recs for name, recs in R.runs("oracle_").items()}
table = examples_table(chosen, sweeps, oracles, 3)
R.verdict(f"examples only ({len(table)} outputs; the paper's Figure 10 shows IWSLT examples): no trend to test; "
          + (f"the large model wrote {table.large_share.min():.0%}-{table.large_share.max():.0%} of BiLD's tokens here"
             if len(table) else "no example"))
R.save_table(table, meta, floatfmt=".2f")

# %%
R.publish()  # last step: tables and figures move into place only when all of it worked
