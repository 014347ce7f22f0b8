# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # BiLD: the oracle study (Figure 2, section 3.1)
# The small model decodes greedily while the large model scores every step on the same prefix;
# where the large model's probability of the small model's token is below a threshold, the large
# model's argmax takes its place (`python -m bild.oracle`, rule `bild_oracle`; one record per
# prompt and threshold in `bild/raw/oracle_<task>_<variant>.jsonl`). Threshold 0 is the small
# model alone, an infinite one the large model alone. The x axis is the share of tokens where the
# large model's prediction was taken ("engagement"; where it equals the small model's token the
# text does not change, so the share of changed tokens is in the table too); quality is the task's
# corpus metric against the references (`common.metrics`). The paper: about 20% engagement brings
# the small model to the large model's quality (`bild/paper_numbers.yaml`).

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bild.config import from_profile
from bild.plots import quality_panel
from bild.tables import oracle_reached, oracle_table
from common.harness.render import Render, paper_numbers
from common.harness.report import provenance

R = Render(artifact_id, results_root, package, profile, inputs, build_cfg=from_profile)
cfg = R.cfg
runs = {tuple(name.rsplit("_", 1)): recs for name, recs in R.runs("oracle_").items()}  # (task, variant)
points = oracle_table(runs, lambda t: cfg.task(t).metric)
paper = paper_numbers(package)["fig2"]
records = [r for recs in runs.values() for r in recs]
meta = {**provenance(records), "small models": ", ".join(sorted({r["small"] for r in records})),
        "tasks": "; ".join(f"{t}: {cfg.task(t).dataset} ({cfg.oracle.prompts(cfg.task(t))} prompts, {cfg.task(t).metric})"
                           for t in cfg.tasks),
        "sources": ", ".join(R.inputs)}
meta

# %%
fig, axes = plt.subplots(1, len(cfg.tasks), figsize=(5 * len(cfg.tasks), 4), squeeze=False)
for ax, t in zip(axes[0], cfg.tasks):
    for (v, g), color in zip(points[points.task == t].groupby("variant"), ("tab:blue", "tab:orange")):
        g = g.sort_values("engaged")
        ax.plot(100 * g.engaged, g.quality, marker="o", color=color, label=f"oracle ({v} small model)")
        ax.axhline(g[g.setting == "small"].quality.iloc[0], color=color, ls=":", lw=0.8, label=f"small alone ({v})")
    large = points[(points.task == t) & (points.setting == "large")].quality.iloc[0]
    ax.axhline(large, color="black", ls="--", lw=0.8, label="large alone")
    ax.axvline(100 * paper["engaged_to_match"], color="grey", lw=0.6, label="paper: ~20% matches the large model")
    quality_panel(ax, t, cfg.task(t), "large model's engagement (% of tokens)")
fig.suptitle(f"{meta.get('model')}, {meta.get('profile')}", fontsize=8)
R.save_figure(fig)
R.save_table(points[["task", "variant", "setting", "threshold", "engaged", "changed", "quality", "prompts"]], meta)

# %% md
# The paper's claim, computed on ours: the smallest engagement at which the oracle's quality reaches
# the large model's alone (none: no threshold of the grid does).

# %%
reached = []
for (t, v), hit in oracle_reached(points).items():
    reached.append(hit is not None and hit <= 2 * paper["engaged_to_match"])
    print(f"{t} ({v}): large-model quality reached at "
          f"{'no threshold' if hit is None else f'{100 * hit:.0f}% engagement'} (paper: ~{100 * paper['engaged_to_match']:.0f}%)")
eng = points[points.setting != "large"].engaged
print(R.trend(f"the large model's quality reached by at most {200 * paper['engaged_to_match']:.0f}% engagement "
              "(per task and small model)", reached,
              over=f"engagement {100 * eng.min():.0f}-{100 * eng.max():.0f}% of tokens",
              caveat="stand-in references (ShareGPT replies): quality differences of a point are noise"))

# %%
R.publish()  # last step: tables and figures move into place only when all of it worked
