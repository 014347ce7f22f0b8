# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # Trained components: learning curves
# The Medusa heads, the distilled draft, EAGLE's head and BiLD's small models (`small_aligned`,
# `small_unaligned`, and `compact`, the 2-layer one with a reduced head) train on one teacher-forced pass of the
# frozen base model (`common.training.teacher`: its hidden states and its own next-token distributions,
# no generation) over the text their `data` column names: in the embedded profile the sharded
# corpus of the model's own greedy answers to ShareGPT prompts (`common.training.corpus`); a component
# trained before the corpus existed names ShareGPT conversations. They are measured, every
# `eval_every` steps, on a held-out set of the base model's own greedy answers to other
# ShareGPT prompts: for Medusa, top-1 of each head against the token the model says k + 2
# positions later; for the draft, top-1 agreement with the target's greedy token and the
# divergence from the target's top-k distribution (BiLD's small models likewise: the aligned ones
# learn the target's greedy tokens, the unaligned one ShareGPT's reference replies, the data
# its row names); for EAGLE, top-1 of its first draft token.
# Training stops when the best held-out top-1 (head 1 for Medusa) of the last `patience`
# evaluations beats the best before them by less than `min_delta`, or when the wall budget or
# step cap is spent (`common.training.loop.Stopping`); `stopped` says which. Wall times are of the
# machine named below; the teacher pass is counted separately. No paper reports these curves for
# this model, so no paper numbers stand beside them.

# %%
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from common.harness.cross_tables import curve_rows
from common.harness.render import Render
from common.records import read_jsonl

R = Render(artifact_id, results_root, package, profile, inputs)
stats = {Path(p).name.removesuffix("_stats.json"): json.loads(Path(p).read_text())
         for p in R.inputs if p.endswith("_stats.json")}
curves = {Path(p).name.removesuffix("_curve.jsonl"): pd.DataFrame(read_jsonl(p))
          for p in R.inputs if p.endswith("_curve.jsonl")}
teacher = stats.pop("teacher")
key = teacher["key"]


def data_of(k, counts=None):
    """What a teacher cache (its key ``k``; ``counts``: the teacher rule's sizes) holds, in words."""
    if k is None:
        return "unknown"
    if "text" in k:  # reference text, held out on the corpus's held-out shard (common.training.teacher.from_text)
        t, rec = k["text"], k["corpus"]
        sizes = "" if counts is None else f" ({counts['train_tokens']} tokens)"
        return (f"train: {t['sequences']} ShareGPT reference replies{sizes} after the held-out prompts, "
                f"<= {t['max_len']} tokens each (no pass: text labels); held out: the corpus's greedy answers "
                f"to the first {rec['heldout']} ShareGPT prompts")
    if "shards" in k:  # the sharded corpus (common.training.corpus)
        rec = k["corpus"]
        sizes = "" if counts is None else (f", {counts['corpus']['answer_tokens']} answer tokens, "
                                           f"{counts['train_tokens']} with prompts")
        held = "" if counts is None else f", {counts['heldout_answer_positions']} positions"
        return (f"train: {k['pass_dtype']} pass over the model's own greedy answers, {len(k['shards'])} corpus "
                f"shards{sizes} (top-{k['topk']} stored); held out: its greedy answers (<= {rec['answer_tokens']} "
                f"tokens) to the first {rec['heldout']} ShareGPT prompts{held}")
    sizes = "" if counts is None else f" ({counts['train_tokens']} tokens)"
    return (f"train: pass over {k['sequences']} ShareGPT conversations{sizes}, <= {k['max_len']} tokens each; "
            f"held out: greedy answers ({k['answer_tokens']} tokens) to the first {k['heldout_prompts']} ShareGPT prompts")


meta = {"model": key["base"], "data": data_of(key, teacher),
        "profile": profile,
        "hardware": ", ".join(sorted({s["hardware"] for s in (teacher, *stats.values()) if "hardware" in s})) or "unknown",
        "code_version": ", ".join(sorted({s.get("code_version", "unknown") for s in (teacher, *stats.values())})),
        "sources": ", ".join(str(p) for p in R.inputs)}
meta

# %% md
# One row per component: the budget it took (steps, examples, wall time), the tokens of its
# training set (prompts included, where its stats count them: EAGLE's count answer tokens only,
# in its stats' `corpus`) and the held-out top-1 before training (step 0), at its best
# evaluation and at the end. Medusa's examples are positions (each trains all heads), the
# others' are sequences.

# %%
table = curve_rows(curves, stats, key, data_of)
# a pass resumed from parts written before parts kept their time does not know the whole cost
untimed = teacher.get("untimed_parts", 0)
table.loc[len(table)] = {"component": "teacher pass",
                         "train_wall_s": round(sum(teacher["wall_s"].values()), 1) if not untimed else None,
                         "stopped": f"{untimed} parts untimed" if untimed else "", "watched": "", "data": "as above"}
if "medusa" in curves:
    last = curves["medusa"].iloc[-1]
    print("Medusa held-out top-1 per head at the end:", last.heldout_top1,
          "| expected accepted length of the best trees:", stats["medusa"]["trees"])
if "draft" in curves:
    print("draft held-out KL at the start / end:", curves["draft"].heldout_kl.iloc[0], "/",
          curves["draft"].heldout_kl.iloc[-1])
print("teacher pass wall s:", {k: round(v, 1) for k, v in teacher["wall_s"].items()},
      f"(the timed parts only: {untimed} parts have no time)" if untimed else "")

# %%
fig, axes = plt.subplots(2, 2, figsize=(11, 7))
for name, c in curves.items():
    per_head = isinstance(c.heldout_top1.iloc[0], list)
    series = ([(f"{name} head {k + 1}", c.heldout_top1.map(lambda v, k=k: v[k]), c.heldout_loss.map(lambda v, k=k: v[k]))
               for k in range(len(c.heldout_top1.iloc[0]))] if per_head
              else [(f"{name} (agreement)", c.heldout_top1, c.heldout_loss)])
    for label, acc, loss in series:
        axes[0, 0].plot(c.step, acc, marker=".", label=label)
        axes[0, 1].plot(c.wall_s / 60, acc, marker=".", label=label)
        axes[1, 0].plot(c.step, loss, marker=".", label=label)
    if "heldout_kl" in c:
        axes[1, 1].plot(c.wall_s / 60, c.heldout_kl, marker=".", label=f"{name} KL(target top-k || draft)")
    if per_head:
        axes[1, 1].plot(c.wall_s / 60, c.heldout_loss.map(lambda v: v[0]), marker=".", label=f"{name} head 1 loss")
axes[0, 0].set_ylabel("held-out top-1")
axes[1, 0].set_ylabel("held-out cross-entropy (nats)")
axes[1, 1].set_ylabel("held-out divergence / loss (nats)")
for a in axes[:, 0]:
    a.set_xlabel("optimizer step")
for a in axes[:, 1]:
    a.set_xlabel("training wall time (min)")
axes[0, 1].set_ylabel("held-out top-1")
for a in axes.flat:
    a.legend(fontsize=7)
fig.suptitle(f"{meta['model']}, {meta['profile']}, {meta['hardware']}", fontsize=9)
R.save_figure(fig)
trained = table[table.component != "teacher pass"]
up = [f"{r.component} {r.top1_untrained:.3f} -> {r.top1_kept:.3f}" for r in trained.itertuples()]
verdict = (f"training helps: {sum(trained.top1_kept > trained.top1_untrained)}/{len(trained)} components' kept weights are "
           f"above their untrained held-out top-1 ({'; '.join(up)}); learning curves, no paper trend to test")
R.no_paper_numbers("No paper reports these learning curves: they show how the trained components here were trained.")
R.save_table(table, {**meta, "verdict": verdict})  # the verdict after the sources, as the table has always put it

# %%
R.publish()
