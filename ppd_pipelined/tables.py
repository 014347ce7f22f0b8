"""What the ``ppdp.*`` notebooks share: their inputs, provenance, match-rate frames, the
paper's reported numbers and the one-line trend statements that compare the two.

Notebooks (notebooks/src/ppdp_*.py) stay narrative: they load records, call the functions here
that compute each table and its trend lines, and show the figure. They read exactly the raw records their artifact
declares (:func:`common.workflow.artifacts.artifact_inputs`) and publish tables and figures atomically
(:class:`common.workflow.artifacts.Staged`).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from common.harness.render import Render as _Render, paper_numbers as _paper_numbers

from . import theory
from .config import from_profile

LABEL = {"squad": "SQuAD 1.1", "wmt": "WMT EN-FR", "cnn_dm": "CNN/DM"}


def paper_numbers(key: str) -> dict:
    """One table's entry of ppd_pipelined/paper_numbers.yaml (numbers plus the citation)."""
    return _paper_numbers("ppd_pipelined")[key]


class Render(_Render):
    """One ``ppdp.*`` render (:class:`common.harness.render.Render`) with PPD's config as ``cfg``."""

    def __init__(self, artifact_id: str, results_root: str, package: str, profile: str,
                 inputs: list[str] | None = None):
        super().__init__(artifact_id, results_root, package, profile, inputs, build_cfg=from_profile)


def data_note(recs: Iterable[dict], tasks: Iterable[str]) -> str:
    """'SQuAD 1.1: mt-bench (offline stand-in ...)' per task, from the records themselves."""
    seen = {}
    for r in recs:
        t = r.get("task") or r.get("category")
        seen[t] = f"{LABEL.get(t, t)}: {r.get('dataset')}" + (
            " (offline stand-in for the paper's set)" if r.get("stand_in") else "")
    return "; ".join(seen[t] for t in tasks if t in seen)


def provenance(recs: list[dict], sources: Iterable[str], tasks: Iterable[str], **extra) -> dict:
    """Model, profile, hardware, dtype and data named by the records, then ``extra`` and the sources."""
    meta = {}
    for label, k in {"model": "model", "profile": "profile", "hardware": "device", "dtype": "dtype"}.items():
        vals = sorted({str(r[k]) for r in recs if k in r})
        if vals:
            meta[label] = ", ".join(vals)
    meta["data"] = data_note(recs, tasks)
    meta.update(extra)
    meta["sources"] = ", ".join(sources)
    return meta


def ranks_frame(recs: list[dict]) -> pd.DataFrame:
    """One row per (record, classifier, layer, generated position): the chosen token's early rank."""
    rows = []
    for i, r in enumerate(recs):
        for c, by_layer in r["early"].items():
            for layer, v in by_layer.items():
                for pos, rank in enumerate(v["rank"]):
                    rows.append((r["task"], r.get("method", "greedy"), i, c, int(layer), pos, rank))
    return pd.DataFrame(rows, columns=["task", "method", "rec", "classifier", "layer", "pos", "rank"])


def pct(x) -> float:
    """A share as a percentage, 2 decimals (the paper's tables print percentages)."""
    return round(100 * float(x), 2)




# The paper probes LLaMA-2-13B, 40 layers deep (its Table 2: layers 10/20/30/35/37 of 40).
PAPER_DEPTH = 40


def paper_layer(layer: int, depth: int, paper: dict) -> int:
    """The paper's probed layer (``paper["layers"]``) at the depth fraction nearest ours
    (``layer`` of ``depth``)."""
    return min(paper["layers"], key=lambda L: abs(L / PAPER_DEPTH - layer / depth))


def match_table(G: pd.DataFrame, tasks: list[str], ks: list[int], layers: list[int], depth: int,
                paper: dict) -> pd.DataFrame:
    """Table 2: p_correct (%) per (dataset, k, head) at each of ``layers``, from the ranks frame
    ``G`` (:func:`ranks_frame`), and the paper's value at the layer nearest in depth fraction
    (``paper``: its table2 entry; nan where it has no row)."""
    prow = {(t, k, c): v for t, k, c, *v in paper["rows"]}
    rows = []
    for t in tasks:
        for k in ks:
            for c in sorted(G.classifier.unique()):
                g = G[(G.task == t) & (G.classifier == c)]
                row = {"dataset": LABEL[t], "k": k, "trained": c, "tokens": int(g[g.layer == layers[0]].shape[0])}
                for l in layers:
                    row[f"layer {l}"] = pct((g[g.layer == l]["rank"] < k).mean())
                for l in layers:
                    L = paper_layer(l, depth, paper)
                    row[f"paper layer {L}"] = prow[(t, k, c)][paper["layers"].index(L)] if (t, k, c) in prow else np.nan
                rows.append(row)
    return pd.DataFrame(rows)


def rises(df: pd.DataFrame, cols: list[str], by: str, order: list) -> list[bool]:
    """Per pair of rows adjacent along ``order`` of column ``by`` (k or the head), per column of
    ``cols``: does p_correct grow (or stay)?"""
    out = []
    for _, g in df.groupby([c for c in ("dataset", "k", "trained") if c != by]):
        g = g.set_index(by).reindex(order).dropna(how="all")
        out += [bool(b >= a) for col in cols for a, b in zip(g[col][:-1], g[col][1:])]
    return out


def grows_along(df: pd.DataFrame, cols: list[str]) -> list[bool]:
    """Per row, per pair of adjacent columns of ``cols`` (layers in order): does the value grow (or stay)?"""
    return [b >= a for r in df[cols].values for a, b in zip(r[:-1], r[1:])]


def position_table(greedy: list[dict], G: pd.DataFrame, tasks: list[str], ks: list[int], layers: list[int],
                   depth: int, paper: dict) -> pd.DataFrame:
    """Tables 6-8: p_correct (%) per bucket of 1/8 of the generation length (the paper: 16
    tokens in pairs, 128 in 16s) per (dataset, layer, k, head), the row's total, and the
    paper's first bucket and total at the layer nearest in depth fraction."""
    prow = {(t, l, k, c): v for t, l, k, c, *v in paper["rows"]}
    rows = []
    for t in tasks:
        recs = [r for r in greedy if r["task"] == t]
        L = recs[0]["max_new_tokens"]
        width = max(1, L // 8)
        edges = list(range(0, L, width))
        g = G[G.task == t]
        for l in layers:
            for k in ks:
                for c in sorted(g.classifier.unique()):
                    h = g[(g.layer == l) & (g.classifier == c)]
                    row = {"dataset": LABEL[t], "tokens per bucket": width, "layer": l, "k": k, "trained": c}
                    for j, e in enumerate(edges):
                        b = h[(h.pos >= e) & (h.pos < e + width)]
                        row[f"bucket {j + 1}"] = pct((b["rank"] < k).mean()) if len(b) else np.nan
                    row["Total"] = pct((h["rank"] < k).mean())
                    p = prow.get((t, paper_layer(l, depth, paper), k, c))
                    row["paper bucket 1"], row["paper Total"] = (p[0], p[-1]) if p else (np.nan, np.nan)
                    rows.append(row)
    table = pd.DataFrame(rows)
    return table[[c for c in table.columns if not c.startswith(("Total", "paper"))] + ["Total", "paper bucket 1", "paper Total"]]


def sampling_names(recs: list[dict]) -> dict[str, str]:
    """Table 5's row name per decoding method of the sampling records (with its k or p)."""
    names = {"greedy": "Greedy decoding"}
    for r in recs:
        if r["method"] == "top_k":
            names["top_k"] = f"Top-k sampling (k={r['method_params']['top_k']})"
        if r["method"] == "top_p":
            names["top_p"] = f"Top-p sampling (p={r['method_params']['top_p']})"
    return names


def sampling_table(S: pd.DataFrame, names: dict[str, str], tasks: list[str], layer: int, paper: dict) -> pd.DataFrame:
    """Table 5: p_correct (%) of the N head at ``layer`` per method and early top-k (1 and the
    paper's k), per task, with the paper's values at its k."""
    prow = {m: dict(zip(paper["columns"][1:], v)) for m, *v in paper["rows"]}
    rows = []
    for mth in ("greedy", "top_k", "top_p"):
        for k in sorted({1, paper["k"]}):  # top-1 and the paper's k
            row = {"method": names[mth], "early top-k": k}
            for t in tasks:
                g = S[(S.task == t) & (S.method == mth) & (S.layer == layer) & (S.classifier == "N")]
                row[LABEL[t]] = pct((g["rank"] < k).mean())
            for t in tasks:
                row[f"paper {LABEL[t]}"] = prow[mth][t] if k == paper["k"] else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def greedy_at_least_sampling(table: pd.DataFrame, names: dict[str, str], tasks: list[str], k: int,
                             prefix: str = "") -> list[bool]:
    """Per task and sampling method, at early top-``k``: is greedy's p_correct at least the
    method's? ``prefix``: ``"paper "`` for the paper's columns."""
    at_k = table[table["early top-k"] == k].set_index("method")
    return [at_k.loc[names["greedy"], f"{prefix}{LABEL[t]}"] >= at_k.loc[names[m], f"{prefix}{LABEL[t]}"]
            for t in tasks for m in ("top_k", "top_p")]


def below_greedy(table: pd.DataFrame, col: str) -> list[bool]:
    """Per pipelined row of Table 3: is its ``col`` latency below greedy's on the same dataset?"""
    out = []
    for _, g in table.groupby("dataset", sort=False):
        base = g.loc[g.method == "greedy", col].iloc[0]
        out += list(g.loc[g.method != "greedy", col] < base)
    return out


def falls_with_k(df: pd.DataFrame, col: str) -> list[bool]:
    """Per (dataset, head), per pair of adjacent k: does ``col`` (a latency) fall (or stay) as k grows?"""
    return [b <= a for _, g in df.groupby(["dataset", "trained"]) for a, b in zip(g.sort_values("k")[col][:-1],
                                                                               g.sort_values("k")[col][1:])]


# Table 3 reports each latency for 128 generated tokens: ours are scaled to the same length.
PAPER_LENGTH = 128


def implementation_table(bench: list[dict], tasks: list[str], paper: dict) -> pd.DataFrame:
    """Table 3: per dataset, greedy and each pipelined k from the ``common.harness.bench``
    records ``bench`` (each with its ``task``): prompts, p_correct of the observed matches,
    measured latency and tokens/s, the theorem's (:func:`theory.latency_from_matches` of the
    observed matches x one measured per-layer time per dataset), identity with greedy, and
    the paper's values (``paper``: its table3 entry)."""
    prow = {(t, k): dict(zip(paper["columns"][2:], v)) for t, k, *v in paper["rows"]}
    df = pd.DataFrame(bench)
    rows = []
    for t in tasks:
        g = df[df.task == t]
        base_tok = g[g.decoder == "vanilla"].set_index("question_id")["tokens"]
        ppd = g[g.decoder.str.startswith("ppd_pipelined")]
        # One layer time per dataset for every row (greedy and each k): the theorem's latencies
        # then differ only by the accounting of the observed matches, not by how much each run's
        # main worker was slowed by its own sub-workers sharing the cores.
        layer_s = float(np.mean([e["layer_time_s"] for e in ppd.extra if e.get("layer_time_s")])) if len(ppd) else np.nan
        for dec, h in g.groupby("decoder", sort=False):
            ex = list(h.extra)
            is_ppd = dec.startswith("ppd_pipelined")
            matches = [m for e in ex for m in (e.get("matches") or [])] if is_ppd else []
            new = h.new_tokens.sum()
            if is_ppd:
                pred = sum(theory.latency_from_matches(e["layers"], e["exit_layer"], e["k"],
                                                       [bool(m) for m in e["matches"]]).latency for e in ex) * layer_s
            else:
                d = int(ppd.extra.iloc[0]["layers"]) if len(ppd) else np.nan
                pred = d * layer_s * new if len(ppd) else np.nan
            k = ex[0].get("k") if is_ppd else 0
            pp = prow.get((t, k), {})
            rows.append({
                "dataset": LABEL[t], "method": "greedy" if dec == "vanilla" else "greedy (w/ PPD)",
                "k": k if is_ppd else "-", "workers": (k + 1) if is_ppd else 1,
                "prompts": len(h), "mean_new_tokens": new / len(h),
                "p_correct": round(float(np.mean(matches)), 4) if matches else np.nan,
                "measured_latency_s": h.wall_time.mean(),
                "measured_latency_128_s": (h.wall_time.sum() / new) * PAPER_LENGTH,
                "measured_tokens_per_s": new / h.wall_time.sum(),
                "theorem_latency_128_s": pred / new * PAPER_LENGTH,
                "theorem_tokens_per_s": new / pred if pred else np.nan,
                "identical_to_greedy": f"{sum(tok == base_tok.get(q) for q, tok in zip(h.question_id, h.tokens))}/{len(h)}",
                "paper_p_correct": pp.get("p_correct", np.nan) / 100 if pp.get("p_correct") else np.nan,
                "paper_latency_128_s": pp.get("latency_128_s", np.nan),
                "paper_tokens_per_s": pp.get("tokens_per_s", np.nan),
            })
    return pd.DataFrame(rows)


def tradeoff_table(G: pd.DataFrame, tasks: list[str], ks: list[int], mid: int, depth: int,
                   paper_p: dict) -> pd.DataFrame:
    """Figures 3-4: per (dataset, head, k), p_correct at layer ``mid`` of ``depth`` from the
    ranks frame ``G`` and the limit forms of Theorem 4.1 relative to greedy (eq. 3 latency,
    eq. 5 compute per time unit, eq. 6 compute per token), and the same equations at the
    paper's p (``paper_p``: {(task, k, head): p}; nan where it has none)."""
    frac = mid / depth
    rows = []
    for t in tasks:
        for c in sorted(G.classifier.unique()):
            g = G[(G.task == t) & (G.classifier == c) & (G.layer == mid)]
            for k in ks:
                p = float((g["rank"] < k).mean())
                pp = paper_p.get((t, k, c), np.nan)  # nan == nan is False: no paper value for this row
                rows.append({"dataset": LABEL[t], "trained": c, "k": k, "p_correct": round(p, 4),
                             "latency_per_token": theory.per_token_latency(p, d_bar_frac=frac),
                             "compute_per_time_unit": theory.compute_per_time_unit(p, k, d_bar_frac=frac),
                             "compute_per_token": theory.compute_per_token(p, k, d_bar_frac=frac),
                             "paper_p_correct": pp,
                             "paper_latency_per_token": theory.per_token_latency(pp) if pp == pp else np.nan,
                             "paper_compute_per_time_unit": theory.compute_per_time_unit(pp, k) if pp == pp else np.nan,
                             "paper_compute_per_token": theory.compute_per_token(pp, k) if pp == pp else np.nan})
    return pd.DataFrame(rows)


def templates_table(recs: list[dict], tasks: list[str]) -> pd.DataFrame:
    """Table 1: per task, the prompt template as the code rendered it (``prompts_<task>.jsonl``
    records): the paper's dataset, the one used, how many prompts, the template and its fields."""
    rows = []
    for t in tasks:
        r = [x for x in recs if x["task"] == t]
        rows.append({"task": LABEL[t], "paper dataset": r[0]["paper_dataset"], "dataset used": r[0]["dataset"],
                     "prompts": len(r), "template": r[0]["template"],
                     "prompt": r[0]["template_text"].replace("\n", "<br>"), "fields": r[0]["fields_rule"]})
    return pd.DataFrame(rows)


def heads_recipe_table(hm: dict, paper: dict) -> tuple[pd.DataFrame, list[str]]:
    """Table 4: the intermediate heads' training recipe read from the checkpoint's metadata
    (``heads_meta.json``: ``hm``) beside the paper's values (``paper``: hyperparameter -> value),
    then what the paper does not state and the held-out change per layer. Returns the table and
    the paper's hyperparameters used at another value here."""
    c, m = hm["config"], hm["meta"]
    used = {"Number of Epochs": c["epochs"], "Learning Rate": c["lr"], "Batch Size": c["batch_size"],
            "Optimizer": "AdamW", "Loss Function": "Cross-Entropy (next token, reply tokens)",
            "Max Sequence Length": c["max_len"], "Warmup ratio": c["warmup_frac"], "Weight Decay": c["weight_decay"]}
    rows = [{"hyperparameter": k, "paper": str(paper[k]), "used": str(used[k])} for k in paper]
    extra = [("LR schedule", "-", "linear warmup, then linear decay (common.training.loop)"),
             ("Max grad norm", "-", c["max_grad_norm"]), ("Seed", "-", c["seed"]),
             ("Initialization", "-", m["init"]), ("Frozen", "all model parameters", m["frozen"]),
             ("Training data", "ShareGPT", f"{m['dataset']}: {m['sequences']} conversations "
                                          f"({hm['train_tokens']} reply tokens), {m['excluded_eval_conversations']} "
                                          f"evaluation conversations excluded"),
             ("Layers", "each probed layer", ", ".join(map(str, m["layers"]))),
             ("Steps", "-", hm["steps"]), ("Training wall time (s)", "8 A100 GPUs", round(hm["train_wall_s"], 1)),
             ("Stopped", "after the epochs", f"{hm.get('stopped')} (held-out check every {c.get('eval_every')} steps, "
                                             f"patience {c.get('patience')}, min_delta {c.get('min_delta')}, "
                                             f"budget {c.get('wall_budget_s')} s)")]
    rows += [{"hyperparameter": a, "paper": str(b), "used": str(v)} for a, b, v in extra]
    if hm.get("holdout_before") and hm.get("holdout_after"):
        b, a = hm["holdout_before"], hm["holdout_after"]
        for layer in m["layers"]:
            x, y = b[str(layer)], a[str(layer)]
            rows.append({"hyperparameter": f"held-out, layer {layer}: CE / top-1 acc / top-1 = final",
                         "paper": "-", "used": f"{x['loss']:.3f} -> {y['loss']:.3f} / {x['acc']:.3f} -> {y['acc']:.3f}"
                                               f" / {x['match_final']:.3f} -> {y['match_final']:.3f}"
                                               f" ({b['tokens']} tokens, before -> after)"})
    differ = [k for k in paper if str(paper[k]) != str(used[k]).split(" (")[0]]
    return pd.DataFrame(rows), differ
