# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # The verification forward's cost curve
# One forward of q new tokens after a fixed context, run the way tree decoders verify
# (`common.engine.target.Target.verify`: a chain mask and explicit positions), timed on the machine at
# hand by `python -m common.harness.cost_curve` (warm-up rounds, then every q once per round, interleaved,
# medians). `ratio` = T(q) / T(1): what verifying q candidates costs in single-token steps. A
# decoder that accepts tau tokens per step at a step cost of T(step) can reach at most
# tau * T(1) / T(step) times vanilla's speed, and prompt decoding sizes its tree by
# maximizing tau(n) / T(n). This curve is the project's own measurement: no paper reports it
# for this model and machine, so no paper numbers stand beside it. Two forward paths are
# measured interleaved in one run: `fast` (`common.engine.fast`: prepacked linear layers, grouped-query
# attention without KV copies, a preallocated cache; what every decoder and the vanilla baseline
# run) and `stock` (transformers' own modules, SDPA attention and `DynamicCache`).
# The LM head runs on the root's row only, as the greedy tree loop's lazy head does (it computes
# head rows only along the path it accepts). T(q) is the host's own: the figure and table show the
# curve of the host the rule last ran on and those kept from the hosts earlier benchmarks ran on
# (`tools/cost_curves.py`), one line style per host; every table's limit columns read their own host's.

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from common.harness.render import Render
from common.cost import cost_curve_paths, read_cost_curves

R = Render(artifact_id, results_root, package, profile, inputs)
# the rule's curve (the host it last ran on) and those kept from earlier hosts (tools/cost_curves.py keep)
records = read_cost_curves(R.inputs)
df = pd.DataFrame(records)
if "forward_path" not in df:
    df["forward_path"] = "stock"  # records made before the fast path existed
df["host"] = df.device.str.split(",").str[0]  # the CPU or GPU and its threads, without the torch version
df = df.sort_values(["host", "forward_path", "q"])
meta = {"model": ", ".join(sorted(df.model.unique())),
        "data": f"random token ids, a {int(df.context.iloc[0])}-token context (cost does not depend on the text)",
        "profile": ", ".join(sorted(df.profile.unique())), "hardware": ", ".join(sorted(df.device.unique())),
        "dtype": ", ".join(sorted(df.dtype.unique())), "rounds": int(df.rounds.iloc[0]),
        "code_version": ", ".join(sorted(df.get("code_version", pd.Series(["unknown"])).astype(str).unique())),
        "sources": ", ".join(map(str, cost_curve_paths(R.inputs)))}
meta

# %% md
# Where the curve leaves the flat, memory-bound regime (reading the weights once serves every
# q there): the largest q whose forward still costs at most 1.5 single-token steps.

# %%
for (host, path), d in df.groupby(["host", "forward_path"]):
    flat = d[d.ratio <= 1.5]
    print(f"{host}, {path}: T(1) = {d.set_index('q').ms[1]:.1f} ms; T(q) <= 1.5 T(1) up to q = "
          f"{int(flat.q.max()) if len(flat) else 'none'}; T(2)/T(1) = {d.set_index('q').ratio.get(2, float('nan')):.2f}")
for host, h in df.groupby("host"):
    if h.forward_path.nunique() > 1:
        w = h.pivot(index="q", columns="forward_path", values="ms")
        print(f"{host}: stock / fast ms per q:", ", ".join(f"q={q}: {r:.2f}x" for q, r in (w["stock"] / w["fast"]).items()))

# %%
fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
styles = dict(zip(df.host.unique(), ["-", "--", ":", "-."] * 4))  # one line style per host, one colour per path
colours = dict(zip(sorted(df.forward_path.unique()), ["C0", "C1", "C2", "C3"]))
for (host, path), d in df.groupby(["host", "forward_path"]):
    t1 = d.ms[d.q == 1].iloc[0]
    style = {"ls": styles[host], "color": colours[path], "marker": "o"}
    ax.plot(d.q, d.ratio, label=f"{host}: {path} (T(1) = {t1:.1f} ms)", **style)
    ax.fill_between(d.q, d.ms_q1 / t1, d.ms_q3 / t1, alpha=0.15, color=colours[path])
    ax2.plot(d.q, d.ms, label=f"{host}: {path}", **style)
ax.axhline(1.0, color="grey", lw=0.8, ls="--")
for a in (ax, ax2):
    a.set_xscale("log", base=2)
    a.set_xlabel("q (new tokens in one verification forward)")
    a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below the axes: host names are long
ax.set_ylabel("T(q) / T(1) (band: interquartile range)")
ax2.set_ylabel("ms per forward")
ax.set_title(f"{meta['model']}, {meta['profile']}, {meta['dtype']}\n{meta['hardware']}", fontsize=8)
R.save_figure(fig)
flat_to = {key: int(d[d.ratio <= 1.5].q.max()) if (d.ratio <= 1.5).any() else None
           for key, d in df.groupby(["host", "forward_path"])}
verdict = ("each host's cost curve (no paper trend; the hardware-aware tree sizes read the benchmarks' own host's): "
           "T(q) <= 1.5 T(1) up to " + ", ".join(f"q = {q} ({host}, {path})" for (host, path), q in flat_to.items())
           + f", measured over q = {df.q.min()}-{df.q.max()}")
R.no_paper_numbers("No paper reports this machine's cost curve: the hardware-aware tree sizes (prompt decoding) read it.")
R.save_table(df[["host", "forward_path", "q", "ms", "ms_q1", "ms_q3", "ratio"]].astype({"q": str}),
             {**meta, "verdict": verdict})  # the verdict after the sources, as the table has always put it

# %%
R.publish()
