"""The ``pd.*`` tables: speed and accepted length (Tables 1-4, the draft-model study ``pd.spec``),
the trained prompt tokens' accuracy and the ablations, from the raw records.

Pure functions from records to the tables the notebooks (notebooks/src/pd_*.py) write; a
notebook loads its declared records, calls these, states the trend lines against the paper and
draws the figure.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from common.harness.report import limits, stats_match, summarize

from .sparse_tree import amortized, best_split, hardware_size, random_tree, static


def gamma_of(label: str) -> int | None:
    """The draft length of a draft-model decoder label (``speculative@g4`` -> 4); None without one."""
    return int(label.split("@g")[1]) if "@g" in label else None


def spec_table(runs: dict[str, list[dict]]) -> pd.DataFrame:
    """``pd.spec``: per run (dataset) and decoder, speed, accepted length (tau), identity with
    vanilla, and for a draft-model decoder the drafted tokens per draft forward and the draft's
    and target's forward milliseconds per target step; ``best`` marks each drafter's fastest gamma."""
    rows = []
    for dataset, recs in runs.items():
        s = summarize(recs).set_index("decoder")
        df = pd.DataFrame(recs)
        for name, g in df.groupby("decoder", sort=False):
            ex = pd.DataFrame(list(g.extra))
            row = {"dataset": dataset, "decoder": name, "drafter": name.split("@")[0], "gamma": gamma_of(name),
                   "prompts": int(s.loc[name, "prompts"]), "tokens_per_s": s.loc[name, "tokens_per_s"],
                   "speedup": s.loc[name, "speedup"], "tau": s.loc[name, "mean_accepted_length"],
                   "identical_to_vanilla": s.loc[name, "identical_to_vanilla"]}
            if "draft_forwards" in ex:
                drafted = sum(sum(p) for p in ex.proposed)
                row.update({"draft_tokens_per_forward": drafted / ex.draft_forwards.sum(),
                            "draft_ms_per_step": 1000 * ex.draft_forward_s.sum() / g.steps.sum(),
                            "target_ms_per_step": 1000 * ex.target_forward_s.sum() / g.steps.sum()})
            rows.append(row)
    table = pd.DataFrame(rows)
    best = table[table.gamma.notna()].groupby(["dataset", "drafter"]).tokens_per_s.idxmax()
    table["best"] = table.index.isin(best.values)
    return table


def spec_gains(table: pd.DataFrame, paper_gain: float) -> pd.DataFrame:
    """Per dataset: each drafter at its fastest gamma and ``gain``, prompt decoding in the draft
    (``pd_speculative``) over speculative decoding alone in tokens/s, beside the paper's."""
    pairs = []
    for dataset, t in table[table.best].groupby("dataset"):
        b = t.set_index("drafter")
        pairs.append({"dataset": dataset, "speculative": b.loc["speculative", "decoder"],
                      "pd_speculative": b.loc["pd_speculative", "decoder"],
                      "gain": b.loc["pd_speculative", "tokens_per_s"] / b.loc["speculative", "tokens_per_s"],
                      "paper_gain": paper_gain})
    return pd.DataFrame(pairs)


def same_chains(runs: dict[str, list[dict]], gammas) -> list[bool]:
    """Per prompt and gamma of ``gammas``: did both drafters' steps accept the same lengths?
    (At one gamma they propose the same chains, so they must.)"""
    same = []
    for recs in runs.values():
        acc = {(r["decoder"], r["question_id"]): r["accept_lengths"] for r in recs}
        for g in set(gammas):
            a, b = f"speculative@g{int(g)}", f"pd_speculative@g{int(g)}"
            same += [acc[(a, q)] == acc[(b, q)] for (d, q) in acc if d == a and (b, q) in acc]
    return same


# --- the benchmark section (pd.table1, pd.fig1, fig4, fig5, fig7, fig8) ------------------------

# The paper's Figure 4 methods (prompt lookup is its PLD); the other decoders run here stay in
# the comparison table and in cross.table.
PAPER_FIG4 = ("prompt_decoding", "medusa", "eagle", "lookahead", "rest", "prompt_lookup")


def size_of(label: str) -> int | None:
    """The tree size of a bench label (prompt_decoding@t24 -> 24, @static24 -> 24); None without one."""
    tail = label.split("@")[-1]
    return int("".join(ch for ch in tail if ch.isdigit())) if "@" in label else None


def pd_sizes(labels) -> list[int]:
    """The dynamic-tree sizes of prompt decoding among decoder ``labels``, ascending."""
    return sorted({size_of(d) for d in labels if d.startswith("prompt_decoding@t")})


def hardware_label(stats: dict, labels, cost) -> str:
    """The prompt decoding label of the hardware-aware size (:func:`hardware_size`) among the
    dynamic sizes of ``labels``, from the trained prompt tokens' ``stats`` (accuracies, m) and
    the machine's cost ratio T(n)/T(1)."""
    return f"prompt_decoding@t{hardware_size(stats['acc'], stats['m'], pd_sizes(labels), cost)['size']}"


def paper_table1(t1: dict) -> pd.DataFrame:
    """The paper's Table 1 (``paper_numbers.yaml`` ``table1``), one row per (model, method), with
    the speedup its tokens/s imply over the model's vanilla."""
    ptab = pd.DataFrame([{"model": mdl, "method": meth, **dict(zip(t1["columns"], v))}
                         for mdl, rows in t1["rows"].items() for meth, v in rows.items()])
    ptab["speedup"] = ptab.tokens_per_s / ptab.model.map(ptab[ptab.method == "vanilla"].set_index("model").tokens_per_s)
    return ptab


def speed_table(recs: list[dict], curve, pd_stats: dict, medusa_stats: dict | None, cost) -> pd.DataFrame:
    """Table 1: the MT-Bench run's summary per decoder, with the hardware limits where a cost
    ``curve`` is known, ms per step, trainable parameters in % of the model and
    ``hardware_choice`` (the prompt decoding size the hardware-aware rule picks)."""
    table = summarize(recs)
    lim = limits(recs, curve) if curve is not None else None
    if lim is not None:
        table = table.merge(lim, on="decoder", how="left")
    steps = pd.DataFrame(recs).groupby("decoder").apply(lambda g: 1000 * g.wall_time.sum() / g.steps.sum(),
                                                       include_groups=False)
    table["ms_per_step"] = table.decoder.map(steps)
    base_params = pd_stats["params"] / (pd_stats["params_pct_of_base"] / 100)
    table["trainable_pct"] = table.decoder.map(
        lambda d: pd_stats["params_pct_of_base"] if d.startswith("prompt_decoding")
        else (100 * medusa_stats["params"] / base_params if d.startswith("medusa") and medusa_stats else 0.0))
    table["hardware_choice"] = table.decoder == hardware_label(pd_stats, table.decoder, cost)
    return table


def sampled_table(greedy: list[dict], sampled: list[dict], curve, pd_stats: dict, medusa_stats: dict | None,
                  cost) -> pd.DataFrame:
    """Table 1 as the paper ran it beside ours greedy (artifact pd.sampled): :func:`speed_table`
    of the sampled run (MT-Bench at its category temperatures, typical acceptance where a decoder
    offers it) and of the greedy run, for the decoders the sampled run has; ``mode`` says which,
    ``tau_vs_greedy`` is the sampled τ over the same decoder's greedy τ (what EAGLE and Spec-Bench
    report beside sampled speedups). A sampled output is not compared with vanilla's (its draws
    differ by design): ``identical_to_vanilla`` is left empty there, and ``hardware_choice`` is
    the greedy run's pick in both."""
    g = speed_table(greedy, curve, pd_stats, medusa_stats, cost)
    s = speed_table(sampled, curve, pd_stats, medusa_stats, cost)
    g = g[g.decoder.isin(s.decoder)].assign(mode="greedy")
    s = s.assign(mode="sampled", identical_to_vanilla=None,
                 hardware_choice=s.decoder.map(g.set_index("decoder").hardware_choice).fillna(False).astype(bool))
    s["tau_vs_greedy"] = s.mean_accepted_length / s.decoder.map(g.set_index("decoder").mean_accepted_length)
    cols = ["mode", "decoder"] + [c for c in s.columns if c not in ("mode", "decoder")]
    return pd.concat([g, s], ignore_index=True)[cols]


def beside_paper_7b(table: pd.DataFrame, ptab: pd.DataFrame) -> pd.DataFrame:
    """vanilla, Medusa's fastest size and the hardware-aware prompt decoding of :func:`speed_table`
    beside the paper's Vicuna-7B row (its Table 1's only model with all three)."""
    pdr = table[table.decoder.str.startswith("prompt_decoding@t")]
    med = table[table.decoder.str.startswith("medusa")]
    pv7 = ptab[ptab.model == "vicuna-7b"].set_index("method")
    picks = {"vanilla": "vanilla", "medusa": med.sort_values("speedup").decoder.iloc[-1] if len(med) else None,
             "ppd": pdr[pdr.hardware_choice].decoder.iloc[0] if pdr.hardware_choice.any() else None}
    ours = table.set_index("decoder")
    return pd.DataFrame([{"method": k, "decoder": d, "speedup": ours.loc[d, "speedup"],
                          "tau": ours.loc[d, "mean_accepted_length"], "paper_speedup": pv7.loc[k, "speedup"],
                          "paper_tau": pv7.loc[k, "tau"]} for k, d in picks.items() if d is not None and k in pv7.index])


def throughput_table(benches: dict[str, list[dict]], pd_stats: dict, cost) -> pd.DataFrame:
    """Figure 5: per dataset, vanilla's and prompt decoding's tokens/s at one hardware-aware size,
    chosen among the sizes MT-Bench ran (a dataset that ran fewer sizes falls back to its own)."""
    first = summarize(benches["mt-bench"] if "mt-bench" in benches else next(iter(benches.values())))
    choice_all = hardware_label(pd_stats, first.decoder, cost)
    rows = []
    for name, recs in benches.items():
        s = summarize(recs).set_index("decoder")
        choice = choice_all if choice_all in s.index else hardware_label(pd_stats, s.index, cost)
        rows.append({"dataset": name, "prompts": int(s.loc["vanilla", "prompts"]),
                     "vanilla_tok_s": s.loc["vanilla", "tokens_per_s"], "prompt_decoding": choice,
                     "prompt_decoding_tok_s": s.loc[choice, "tokens_per_s"], "speedup": s.loc[choice, "speedup"],
                     "tau": s.loc[choice, "mean_accepted_length"], "identical": s.loc[choice, "identical_to_vanilla"]})
    return pd.DataFrame(rows)


def tree_theory(acc, m: int, cost, largest: int) -> pd.DataFrame:
    """Figure 8 (a, b): per even tree size from m + 2 below ``largest``, the expected accepted
    length (Prop. 4.4) of the dynamic, static and random trees, the cost T(n)/T(1) and the
    hardware-aware objective tau / cost. ``tau_static`` is None where no static tree fits."""
    rows = []
    for n in range(m + 2, largest, 2):
        dyn, r = best_split(acc, m, n)
        n_c = max(0, n // (m + 1) - 1)  # the largest static tree within n: (n_c + 1) * (m + 1) positions
        row = {"size": n, "tau_dynamic": r + 1, "tau_random": amortized(random_tree(acc, m, n, seed=0), acc) + 1,
               "cost": cost(n)}
        st = static(acc, m, n_c)
        row["tau_static"] = amortized(st, acc) + 1 if st[m].size <= n else None
        row["objective"] = row["tau_dynamic"] / row["cost"]
        rows.append(row)
    return pd.DataFrame(rows)


def measured_sizes(recs: list[dict]) -> pd.DataFrame:
    """Figure 8 (a, c): per prompt decoding label of a run, its size, tree shape, measured tau and speedup."""
    s = summarize(recs).set_index("decoder")
    return pd.DataFrame([{"size": size_of(d), "shape": "static" if "static" in d else "dynamic",
                          "tau_measured": s.loc[d, "mean_accepted_length"], "speedup_measured": s.loc[d, "speedup"]}
                         for d in s.index if d.startswith("prompt_decoding@")])


def comparison_table(runs: dict[str, list[dict]], hw_label: str) -> pd.DataFrame:
    """Figures 4 and 1: one row per decoder, fastest first, each against its own run's vanilla:
    Medusa and prompt decoding (``hw_label``) from this section's ``mt-bench`` run, every other
    decoder from the cross-method groups (transformers' own ``generate``, a vanilla, left out)."""
    speed = pd.concat([summarize(recs).assign(run=name) for name, recs in runs.items()], ignore_index=True)
    speed = speed[(speed.decoder != "vanilla") & ~speed.decoder.str.startswith("hf_generate")]
    keep = speed[(speed.run != "mt-bench") & ~speed.decoder.str.startswith(("medusa", "prompt_decoding"))]
    ours = speed[(speed.run == "mt-bench") & (speed.decoder.str.startswith("medusa") | (speed.decoder == hw_label))]
    out = pd.concat([keep, ours], ignore_index=True)
    out["lossless"] = out.identical_to_vanilla.map(lambda s: s.split("/")[0] == s.split("/")[1])
    out = out[["decoder", "run", "speedup", "mean_accepted_length", "tokens_per_s", "identical_to_vanilla", "lossless"]]
    return out.sort_values("speedup", ascending=False).reset_index(drop=True)


def paper_methods(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`comparison_table` whose method the paper's Figure 4 compares."""
    return table[table.decoder.map(lambda d: d.split("@")[0]).isin(PAPER_FIG4)].reset_index(drop=True)


def memory_table(pd_stats: dict, medusa_stats: dict | None, draft_stats: dict | None,
                 eagle_stats: dict | None) -> pd.DataFrame:
    """Figure 7: each trained method's extra parameters (None stats: not trained in this
    profile), their fp32 MiB, share of the model, ratio to prompt decoding's, and training minutes."""
    base_params = pd_stats["params"] / (pd_stats["params_pct_of_base"] / 100)
    extra = [{"method": "prompt_decoding", "component": f"{pd_stats['m']} prompt tokens x {pd_stats['n']} EPT",
              "params": pd_stats["params"], "train_min": pd_stats["train_wall_s"] / 60}]
    if medusa_stats is not None:
        extra.append({"method": "medusa", "component": "Medusa heads (shared LM head)", "params": medusa_stats["params"],
                      "train_min": medusa_stats["train_wall_s"] / 60})
    if draft_stats is not None:
        extra.append({"method": "speculative",
                      "component": f"draft model ({draft_stats['layers']} layers, shared embeddings/head)",
                      "params": draft_stats["params_not_shared"], "train_min": draft_stats["train_wall_s"] / 60})
    if eagle_stats is not None:
        extra.append({"method": "eagle", "component": "EAGLE draft head (fc + 1 decoder layer, shared embeddings/head)",
                      "params": eagle_stats["params"], "train_min": eagle_stats["train_wall_s"] / 60})
    mem = pd.DataFrame(extra)
    mem["MiB_fp32"] = mem.params * 4 / 2**20
    mem["pct_of_model"] = 100 * mem.params / base_params
    mem["vs_prompt_decoding"] = mem.params / pd_stats["params"]
    return mem


def cost_table(mem: pd.DataFrame, comparison: pd.DataFrame, hw_label: str, benches: dict[str, list[dict]],
               trained_by: dict[str, dict | None]) -> pd.DataFrame:
    """Figure 1: :func:`memory_table`'s methods with their speedup (Medusa's fastest size,
    prompt decoding's ``hw_label``, the draft as ``speculative``) and run from ``comparison``,
    the training-free methods at zero memory, and ``same_weights``: whether the speedup's run
    decoded the weights ``trained_by`` (stats per method) names."""
    pick = {"prompt_decoding": hw_label,
            "medusa": comparison[comparison.decoder.str.startswith("medusa")].sort_values("speedup").decoder.iloc[-1],
            "speculative": "speculative"}
    fig1 = mem.assign(decoder=mem.method.map(pick))
    fig1 = fig1.merge(comparison[["decoder", "speedup", "run"]], on="decoder", how="left")
    free = comparison[comparison.decoder.isin(["prompt_lookup", "self_speculative"])].assign(params=0, MiB_fp32=0.0,
                                                                                          train_min=0.0)
    free["method"] = free.decoder
    fig1 = pd.concat([fig1, free[["method", "decoder", "params", "MiB_fp32", "train_min", "speedup", "run"]]],
                     ignore_index=True)
    fig1["same_weights"] = [stats_match(trained_by[m], [r for r in benches[run] if r["decoder"] == d])
                            if trained_by.get(m) is not None and isinstance(run, str) else None
                            for m, d, run in zip(fig1.method, fig1.decoder, fig1.run)]
    return fig1


# --- the training section (pd.table2-8, pd.fig6, pd.fig9) --------------------------------------

# Appendix options of a training; its stats carry each one only when it is set.
EXTRAS = ("aggregation", "head", "prefix", "exits", "init_from")
# The appendix tables' four numbers: distance 1 and 2, top-1 and top-5.
COLS = ["acc1_top1", "acc1_top5", "acc2_top1", "acc2_top5"]


def plain(s: dict, main: dict) -> bool:
    """Whether training ``s`` is the paper's method, differing from ``main`` at most in the EPT count."""
    return (s["mask"] == "ensemble" and s["distill"] and not any(k in s for k in EXTRAS)
            and s["config"]["batch_size"] == main["config"]["batch_size"])


def accumulated(acc) -> np.ndarray:
    """``[d][k]`` top-(k+1) accuracy from per-rank accuracies ``acc[d][r]``."""
    return np.cumsum(np.asarray(acc), axis=1)


def acc_cols(s: dict) -> dict:
    """The appendix tables' four numbers (:data:`COLS`) of training ``s``, on every cut of the
    held-out answers, and what it cost."""
    a = accumulated(s["acc"])
    return {**dict(zip(COLS, [a[0, 0], a[0, 4], a[1, 0], a[1, 4]])), "train_seqs": s["train_sequences"],
            "heldout_seqs": s["heldout_sequences"], "steps": s["steps"], "stopped": s["stopped"],
            "train_min": round((s["train_wall_s"] + (s.get("stage1_wall_s") or 0)) / 60, 1), "params": s["params"],
            # where it trained: accuracies compare across devices (same recipe and data, fp32),
            # training minutes do not
            "trained_on": s["hardware"].split(", torch")[0]}


def ablation_table(stats: dict[str, dict], key, paper_rows: dict) -> pd.DataFrame:
    """Ours per training (in the ablation's order) beside the paper's row of the same setting
    (``key(stats) -> the paper's row name``; None where the paper has no such row)."""
    t = pd.DataFrame([{"variant": name, "setting": key(s), **acc_cols(s)} for name, s in stats.items()])
    for c_i, c in enumerate(COLS):
        t[f"paper_{c}"] = [paper_rows.get(k, [None] * 4)[c_i] for k in t.setting]
    return t


def no_better(t: pd.DataFrame, a, b) -> list[bool]:
    """Per metric of :data:`COLS`: is setting ``b`` at most as accurate as setting ``a``?"""
    ra, rb = t[t.setting == a].iloc[0], t[t.setting == b].iloc[0]
    return [rb[c] <= ra[c] for c in COLS]


def gaps(t: pd.DataFrame, a, b) -> list[tuple[float, float]]:
    """The (``b``, ``a``) accuracies per metric of :data:`COLS` that :func:`no_better` compares:
    what ``Render.trend(..., ties=...)`` reads to call a comparison a tie when every gap is
    smaller than a single seed can resolve."""
    ra, rb = t[t.setting == a].iloc[0], t[t.setting == b].iloc[0]
    return [(float(rb[c]), float(ra[c])) for c in COLS]


def consecutive(df: pd.DataFrame) -> list[tuple[float, float]]:
    """The (earlier, later) accuracy pairs :func:`rising` compares, in its order."""
    df = df.sort_values("EPTs")
    return [(float(a), float(b)) for c in COLS for a, b in zip(df[c], df[c][1:])]


def paper_no_better(rows: dict, a, b) -> list[bool]:
    """:func:`no_better` on the paper's table ``rows`` {setting: four numbers}."""
    return [rows[b][i] <= rows[a][i] for i in range(4)]


def ept_table(stats: dict[str, dict], by_n: dict[int, str], t2: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Table 2: per EPT count (``by_n`` {count: training}), the four numbers beside the paper's
    (``t2``: its table2 entry). Returns (the table, ours, the paper's)."""
    ours = pd.DataFrame([{"EPTs": n, "variant": name, **acc_cols(stats[name])} for n, name in by_n.items()])
    pp = pd.DataFrame([{"EPTs": int(n), **dict(zip(t2["columns"], v))} for n, v in t2["rows"].items()])
    return ours.merge(pp.rename(columns={c: f"paper_{c}" for c in COLS}), on="EPTs", how="left"), ours, pp


def rising(df: pd.DataFrame) -> list[bool]:
    """Per metric of :data:`COLS`, per pair of consecutive EPT counts: does accuracy rise (or stay)?"""
    df = df.sort_values("EPTs")
    return [b >= a for c in COLS for a, b in zip(df[c], df[c][1:])]


def accumulated_table(main: dict, medusa: dict | None, most: dict | None) -> pd.DataFrame:
    """Figure 6: per distance and k of 1/3/5/10, the accumulated top-k accuracy of the main
    prompt tokens, the Medusa head of that distance (``medusa`` stats; None: not trained) and
    the training with the most EPTs (``most``; None: the main one is it)."""
    A = accumulated(main["acc"])
    rows = []
    for d in range(A.shape[0]):
        for k in (1, 3, 5, 10):
            row = {"distance": d + 1, "top_k": k, "prompt_tokens": A[d, k - 1]}
            if medusa is not None and d < len(medusa["accuracy"]):
                row["medusa_head"] = accumulated(medusa["accuracy"])[d, k - 1]
            if most is not None:
                row[f"prompt_tokens_{most['n']}ept"] = accumulated(most["acc"])[d, k - 1]
            rows.append(row)
    return pd.DataFrame(rows)


def epochs(curve: pd.DataFrame, s: dict) -> pd.Series:
    """Epochs seen at each evaluation of a learning ``curve`` of training ``s``."""
    return curve.examples_seen / s["train_sequences"]


def loss_table(stats: dict[str, dict], curves: dict[str, pd.DataFrame], by_n: dict[int, str]) -> pd.DataFrame:
    """Figure 9: per EPT count, the training loss at the first and last evaluation and its
    minimum, the epochs seen, the held-out distance-1 top-1 at the start and end, and why it stopped."""
    rows = []
    for n, name in by_n.items():
        c = curves[name]
        ep = epochs(c, stats[name])
        rows.append({"EPTs": n, "first_loss": c.train_loss.iloc[1] if len(c) > 1 else None,
                     "last_loss": c.train_loss.iloc[-1], "min_loss": c.train_loss[1:].min(), "epochs": float(ep.iloc[-1]),
                     "top1_start": c.heldout_top1.iloc[0][0], "top1_end": c.heldout_top1.iloc[-1][0],
                     "stopped": stats[name]["stopped"]})
    return pd.DataFrame(rows)


def _curve_row(variant: str, s: dict, r, epochs_seen: float) -> dict:
    """A Table 3 row read off a learning curve's evaluation ``r`` (its held-out subset)."""
    return {"variant": variant, "EPTs": s["n"], "KD": s["distill"], "batch": s["config"]["batch_size"],
            "epochs": epochs_seen, "steps": int(r.step), "measured_on": "the curve's held-out subset",
            "acc1_top1": r.heldout_top1[0], "acc1_top5": r.heldout_top5[0], "acc2_top1": r.heldout_top1[1],
            "acc2_top5": r.heldout_top5[1]}


def recipe_table(stats: dict[str, dict], curves: dict[str, pd.DataFrame], ref_name: str) -> tuple[pd.DataFrame, dict, list]:
    """Table 3: each training's four numbers and recipe (distillation, batch, epochs); the
    reference's (``ref_name``) curve at each whole epoch; and each training of another batch
    size and the reference read off their curves at equal sequences seen (the fewer of the two).
    Returns (the table, the equal-sequences rows by (training, read training), the trainings of another batch)."""
    rows = []
    for name, s in stats.items():
        rows.append({"variant": name, "EPTs": s["n"], "KD": s["distill"], "batch": s["config"]["batch_size"],
                     "train_seqs": s["train_sequences"],
                     "epochs": round(s["steps"] * s["config"]["batch_size"] / s["train_sequences"], 2),
                     "steps": s["steps"], "stopped": s["stopped"],  # a wall budget may end one row before its step limit
                     "measured_on": f"{s['heldout_sequences']} held-out answers", **acc_cols(s)})
    ref = stats[ref_name]
    c = curves[ref_name]
    ep = epochs(c, ref)
    for e in range(1, int(ep.max()) + 1):
        r = c.loc[(ep - e).abs().idxmin()]
        rows.append(_curve_row(f"{ref_name} (curve)", ref, r, round(float(ep[r.name]), 2)))
    batch = [n for n, s in stats.items() if s["config"]["batch_size"] != ref["config"]["batch_size"]]
    equal = {}
    for name in batch:
        seen = int(min(curves[ref_name].examples_seen.max(), curves[name].examples_seen.max()))
        for n in (ref_name, name):
            r = curves[n].loc[(curves[n].examples_seen - seen).abs().idxmin()]
            equal[(name, n)] = _curve_row(f"{n} (curve, {int(r.examples_seen)} seen)", stats[n], r,
                                          round(int(r.examples_seen) / stats[n]["train_sequences"], 2))
            rows.append(equal[(name, n)])
    return pd.DataFrame(rows), equal, batch
