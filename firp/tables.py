"""The ``firp.*`` tables: speed (Tables 1-3, Figure 1) from the benchmark records, accuracy
(Figures 3, 5-7) from the top-k records and the trainings' statistics, similarity (Figure 4).

Pure functions from records to the tables the notebooks (notebooks/src/firp_*.py) write; a
notebook loads its declared records, calls these, states the trend lines against the paper and
draws the figure.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from common.engine.tree_search import best_tree, expected_accept_length
from common.harness.report import summarize
from common.metrics import rouge_2

METHODS = ("vanilla", "self_speculative", "medusa", "firp")  # Table 1's rows, in its order


def method(label: str) -> str:
    """The method of a decoder label (``firp@t16`` -> ``firp``)."""
    return label.split("@")[0]


def nodes(label: str) -> int | None:
    """The tree size of a decoder label (``firp@t16`` -> 16); None for a label without one."""
    return int(label.split("@t")[1]) if "@t" in label else None


def best_of(s: pd.DataFrame, name: str) -> str | None:
    """The fastest label of method ``name`` in a summary ``s`` (indexed by decoder); None when absent."""
    rows = s[[method(d) == name for d in s.index]]
    return rows.speedup.idxmax() if len(rows) else None


def draft_params(firp_stats: dict, medusa_stats: dict | None) -> dict[str, int | None]:
    """The paper's "draft size" per method: FIRP's maps and Medusa's heads (None: not trained
    in this profile), none for the others."""
    return {"firp": firp_stats["params"], "medusa": medusa_stats["params"] if medusa_stats else None,
            "self_speculative": 0, "vanilla": 0}


def quality_table(benches: dict[str, list[dict]], draft: dict) -> pd.DataFrame:
    """Table 1: per dataset but MT-Bench, each method's fastest label with its speedup, mean
    accepted length, ROUGE-2 F1 against the references (None where a record has none),
    identity with vanilla and draft parameters (millions)."""
    rows = []
    for name in [n for n in benches if n != "mt-bench"]:
        recs = benches[name]
        s = summarize(recs).set_index("decoder")
        df = pd.DataFrame(recs)
        for m in METHODS:
            d = "vanilla" if m == "vanilla" else best_of(s, m)
            if d is None:
                continue
            g = df[df.decoder == d]
            r2 = rouge_2(list(g.text), list(g.reference)) if g.reference.notna().all() else None
            rows.append({"dataset": name, "method": m, "decoder": d, "draft_params_m": (draft[m] or 0) / 1e6,
                         "speedup": s.loc[d, "speedup"], "tau": s.loc[d, "mean_accepted_length"], "rouge2": r2,
                         "identical": s.loc[d, "identical_to_vanilla"]})
    return pd.DataFrame(rows)


def paper_table1(t1: dict) -> pd.DataFrame:
    """The paper's Table 1 (``paper_numbers.yaml`` ``table1``) as one row per (model, method)."""
    return pd.DataFrame([{"model": mdl, "method": mth, **dict(zip(t1["columns"], v))}
                         for mdl, r in t1["rows"].items() for mth, v in r.items()])


def paper_speedups(table: pd.DataFrame, t1: dict) -> tuple[str, list]:
    """The paper's Table 1 speedup beside each row of :func:`quality_table`: its first model's,
    for the dataset ours stands in for (summarization: XSum, math: GSM8K; None otherwise).
    Returns (that model, the speedups)."""
    pm = next(iter(t1["rows"]))
    pcol = {"summarize": t1["columns"].index("xsum_speedup"), "math": t1["columns"].index("gsm8k_speedup")}
    prow = t1["rows"][pm]
    return pm, [next((prow.get("autoregressive" if m == "vanilla" else m, [None] * 9)[i] for k, i in pcol.items() if k in d),
                     None) for d, m in zip(table.dataset, table.method)]


def mt_bench_table(bench: list[dict], lookahead: list[dict] | None, draft: dict) -> pd.DataFrame:
    """Table 2: every decoder of the MT-Bench run, then Lookahead's settings from the
    cross-method ``lookahead`` run (None: not run), each against its own run's vanilla, with
    the machine each ran on and draft parameters (millions)."""
    table = summarize(bench).assign(run="firp_bench")
    if lookahead is not None:
        la = summarize(lookahead)
        table = pd.concat([table, la[la.decoder != "vanilla"].assign(run="cross lookahead")], ignore_index=True)
    ran_on = {"firp_bench": bench[0]["device"], "cross lookahead": (lookahead or [{}])[0].get("device")}
    table["ran_on"] = table.run.map(lambda r: (ran_on[r] or "").split(", torch")[0])
    table["draft_params_m"] = [(draft.get(method(d)) or 0) / 1e6 for d in table.decoder]
    return table


def accepted_length_table(benches: dict[str, list[dict]], firp_acc: list | None,
                          medusa_acc: list | None) -> pd.DataFrame:
    """Table 3: per dataset, Medusa's and FIRP's mean accepted length at each tree size, beside
    the length the tree search expects (:func:`expected_accept_length` of the best tree of
    that size) from each method's held-out accuracies (None: not known)."""
    rows = []
    for name, recs in benches.items():
        s = summarize(recs).set_index("decoder")
        for d in s.index:
            if method(d) in ("medusa", "firp") and nodes(d):
                acc = firp_acc if method(d) == "firp" else medusa_acc
                exp = expected_accept_length(best_tree(acc, nodes(d)), acc) if acc else None
                rows.append({"dataset": name, "method": method(d), "nodes": nodes(d),
                             "tau": s.loc[d, "mean_accepted_length"], "tau_expected": exp, "speedup": s.loc[d, "speedup"]})
    return pd.DataFrame(rows)


def method_table(records: list[dict], draft: dict) -> pd.DataFrame:
    """Figure 1: self-speculative decoding, Medusa and FIRP at their fastest labels: speedup,
    mean accepted length and draft parameters (millions)."""
    s = summarize(records).set_index("decoder")
    rows = []
    for m in METHODS[1:]:
        d = best_of(s, m)
        if d is not None:
            rows.append({"method": m, "decoder": d, "speedup": s.loc[d, "speedup"],
                         "tau": s.loc[d, "mean_accepted_length"], "draft_params_m": (draft[m] or 0) / 1e6})
    return pd.DataFrame(rows)


# --- accuracy (firp.fig3, fig5-7) and the pseudo states' similarity (firp.fig4) ----------------

KS = [1, 2, 3, 4, 5]  # the top-k drawn (tables add top-10 where the records have it)
NAMES = {"firp": "FIRP", "early_exit": "early exit", "medusa": "Medusa", "medusa_own": "Medusa-1"}
# The paper's middle prediction layer: 15 of LLaMA-2-7B's 32 layers.
PAPER_MIDDLE = 15 / 32


def top(acc, k: int) -> float:
    """Top-k accuracy from the rank-r hit rates ``acc[r]`` (a guess is right at one rank at most)."""
    return float(np.sum(acc[:k]))


MAP_TRAININGS = {"separate": "trained separately, one training per map (the paper's section 3.3)",
                 "joint": "trained jointly, one training on the K steps' summed loss (the paper trains them "
                          "separately, K trainings; firp/train.py --mode joint)"}


def maps_training(stats) -> str | None:
    """How the maps of the training records ``stats`` were trained, in words (records without
    ``mode`` predate the option and trained jointly); K = 1 maps are the same either way. None
    without records."""
    modes = {}
    for s in stats:
        modes.setdefault(s.get("mode") or "joint", []).append(s)
    words = []
    for mode, group in sorted(modes.items()):
        single = all(s.get("steps_k") == 1 for s in group)
        words.append("one map each (K = 1: separate and joint training are the same)" if single
                     else MAP_TRAININGS[mode])
    if not words:
        return None
    return words[0] if len(words) == 1 else "mixed: " + "; ".join(words)


def training(s: dict) -> dict:
    """What one sweep training (its stats ``s``) saw, cost and why it ended: 'max steps', 'flat'
    (the sweep recipe's patience) or 'wall budget' (config ``firp.variants``)."""
    return {"train_seqs": s["train_sequences"], "heldout_seqs": s["heldout_sequences"], "steps": s["steps"],
            "stopped": s["stopped"], "train_min": round(s["train_wall_s"] / 60, 1),
            "trained_on": s["hardware"].split(", torch")[0]}  # training minutes compare only on one device


def check_trainings(stats: dict[str, dict], ok, what: str, where: str) -> None:
    """A training of the wrong shape for a figure fails the render, naming it (``where``: the
    artifact and the config that chose the trainings)."""
    bad = [n for n in stats if not ok(stats[n])]
    if bad:
        raise ValueError(f"{where}: {', '.join(bad)} {what}")


def method_names(topk: list[dict]) -> dict[str, str]:
    """The display name of each method the top-k records score, in Figure 3's order."""
    return {m: n for m, n in NAMES.items() if m in {r["method"] for r in topk}}


def topk_frame(topk: list[dict]) -> pd.DataFrame:
    """The top-k records (``python -m firp.accuracy``) as a frame; what each component trained on
    is None where its record does not say."""
    df = pd.DataFrame(topk)
    for col in ("train_sequences", "heldout_sequences"):
        df[col] = df[col] if col in df else None
    return df


def topk_table(df: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """Figure 3: per method and step, the layer it reads, top-1..5 and top-10 accuracy, the
    component's parameters and what trained it."""
    rows = []
    for r in df.itertuples():
        head = "" if r.method == "firp" else " (shared LM head)" if r.share_lm_head else " (own LM heads)"
        rows.append({"method": names[r.method] + head, "step": r.step, "N": r.distance, "reads layer": r.layer,
                     **{f"top{k}": top(r.acc, k) for k in (*KS, 10)}, "component_params": r.params,
                     "train_seqs": r.train_sequences, "trained_steps": r.steps, "stopped": r.stopped})
    return pd.DataFrame(rows)


def seen_by(df: pd.DataFrame, names: dict[str, str]) -> dict[str, dict]:
    """Per method's display name: the train and held-out sequences its component saw ("?" where
    its record does not say), for :func:`common.harness.report.mixed_data`."""
    seen = {names[m]: {"train_sequences": g.train_sequences.iloc[0], "heldout_sequences": g.heldout_sequences.iloc[0]}
            for m, g in df.groupby("method")}
    return {m: {k: ("?" if pd.isna(v) else int(v)) for k, v in d.items()} for m, d in seen.items()}


def at_least(df: pd.DataFrame, a: str, b: str) -> list[bool]:
    """Per step and top-k (1..5): is method ``a``'s accuracy at least method ``b``'s?"""
    x, y = df[df.method == a].set_index("step"), df[df.method == b].set_index("step")
    return [top(x.acc[s], k) >= top(y.acc[s], k) for s in x.index for k in KS]


def layer_table(stats: dict[str, dict]) -> pd.DataFrame:
    """Figure 5: per one-map training, its layer and step-1 top-1/top-5, by layer."""
    return pd.DataFrame([{"variant": n, "layer": s["layers"][0], "top1": top(s["acc"][0], 1),
                          "top5": top(s["acc"][0], 5), **training(s)} for n, s in stats.items()]).sort_values("layer")


def paper_models(entry: dict) -> list[str]:
    """The models a paper figure was measured on, as its citation in ``paper_numbers.yaml`` names
    them (the comma-separated names before the first ";" inside its parentheses: "Figure 5
    (Vicuna-7B, LLaMA-2-Chat-7B; ...)"), so a header can say which of them a run stands in for
    without the names being typed twice. An empty list when the citation names none."""
    cite = str(entry.get("cite", ""))
    inside = cite.partition("(")[2].rpartition(")")[0].partition(";")[0]
    # a clause that is not a list of model names ("all models and datasets") names none
    names = [n.strip() for n in inside.split(",") if n.strip()]
    return names if names and all(" " not in n for n in names) else []


def model_cut(stats: dict[str, dict], entry: dict) -> tuple[str, list[str], list[str]]:
    """The arguments of ``Render.cut`` for a figure built on the trainings ``stats`` where the
    paper (its ``paper_numbers.yaml`` ``entry``) measured several models: ("models", ours,
    the paper's)."""
    return "models", sorted({str(s["model"]) for s in stats.values()}), paper_models(entry)


def middle_layer(layers: pd.Series, depth: int) -> int:
    """Of the trained ``layers``, the one nearest the paper's middle fraction of ``depth``."""
    return layers.iloc[int(np.argmin(np.abs(layers - depth * PAPER_MIDDLE)))]


def second_step_table(stats: dict[str, dict]) -> pd.DataFrame:
    """Figure 6: per two-map training, both layers, step 2's top-1/top-5 and step 1's top-1, by step 2's layer."""
    return pd.DataFrame([{"variant": n, "step1_layer": s["layers"][0], "step2_layer": s["layers"][1],
                          "step2_top1": top(s["acc"][1], 1), "step2_top5": top(s["acc"][1], 5),
                          "step1_top1": top(s["acc"][0], 1), **training(s)}
                         for n, s in stats.items()]).sort_values("step2_layer")


def mask_table(stats: dict[str, dict]) -> pd.DataFrame:
    """Figure 7: per training (masked or not), step 2's top-1..5 and step 1's top-1."""
    return pd.DataFrame([{"setting": "masked" if s["mask_earlier"] else "not masked", "variant": n,
                          "layers": str(s["layers"]), **{f"step2_top{k}": top(s["acc"][1], k) for k in KS},
                          "step1_top1": top(s["acc"][0], 1), **training(s)} for n, s in stats.items()])


def cosine_table(df: pd.DataFrame) -> pd.DataFrame:
    """Figure 4: per step and layer, the cosine of pseudo and real states, one column per maps
    state (``trained``, ``identity``)."""
    table = df.pivot_table(index=["step", "layer"], columns="maps_state", values="cosine").reset_index()
    table.columns.name = None
    table[["step", "layer"]] = table[["step", "layer"]].astype(int)
    return table
