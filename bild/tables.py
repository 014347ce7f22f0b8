"""The ``bild.*`` sweep tables (Table 1, Figures 4, 5 and 9, section 4.2's speculative sampling)
from the sweep points of :mod:`bild.analysis`.

Pure functions from records and sweep points to the tables and verdict inputs the notebook
(notebooks/src/bild_sweep.py) writes; the notebook loads the declared records, calls these,
states the trend lines against the paper and draws the figures.
"""
from __future__ import annotations

import pandas as pd

from common.metrics import METRICS

from .analysis import best_settings

GRID = r"^bild@fb[0-9.]+_rb[0-9.]+$"  # BiLD proper: the grid's bild@fb<alpha_FB>_rb<alpha_RB> labels


def vs_large(records: list[dict], metric: str) -> dict[str, float]:
    """decoder -> its corpus ``metric`` against the large model's own greedy output (``vanilla``'s
    text in the same run) instead of the dataset's reference: what BiLD actually loses."""
    df = pd.DataFrame(records)
    base = df[df.decoder == "vanilla"].set_index("question_id").text
    return {d: METRICS[metric](list(g.text), [base[q] for q in g.question_id]) for d, g in df.groupby("decoder")}


def stand_in_note(points: pd.DataFrame) -> str:
    """What every BiLD verdict rests on: the stand-in references are another model's replies
    (ShareGPT), so a corpus metric of ~1.5 BLEU moves by whole points between settings that
    differ in a few tokens (agreement with the large model's own output is steadier); the paper
    profile's datasets have their own references."""
    if "translate" in set(points.task):
        bleu = points[(points.task == "translate") & (points.decoder == "vanilla")].quality.mean()
        return (f"stand-in references (ShareGPT replies): translation BLEU ~{bleu:.1f}, "
                "so a one-point quality difference there is noise, not a measurement")
    return "stand-in references (ShareGPT replies)" if set(points.task) & {"summarize"} else "the tasks' own references"


def span(g: pd.DataFrame, col: str = "latency") -> str:
    """'latency 0.88-1.31x of vanilla (27 settings)': the range a verdict was measured over."""
    g = g[g.decoder != "vanilla"]
    return f"{col} {g[col].min():.2f}-{g[col].max():.2f}x of vanilla ({len(g)} settings)"


def dominated(p, front: pd.DataFrame) -> bool:
    """Is point ``p`` (latency, quality) matched by a ``front`` point at least as fast and as good?"""
    return bool(((front.latency <= p.latency) & (front.quality >= p.quality)).any())


def grid_points(points: pd.DataFrame) -> pd.DataFrame:
    """BiLD proper: the sweep points of the grid's settings and vanilla."""
    return points[points.decoder.str.match(GRID) | (points.decoder == "vanilla")]


def reaches_speedup(grid: pd.DataFrame, tasks, variants=("unaligned", "aligned")) -> list[bool]:
    """Per task and variant: does some BiLD setting run faster than vanilla?"""
    return [bool(((grid.task == t) & (grid.variant == v) & (grid.decoder != "vanilla") & (grid.speedup > 1.0)).any())
            for t in tasks for v in variants]


def table1_rows(t: str, v: str, g: pd.DataFrame, records: list[dict], paper: dict,
                paper_variant: str | None = None) -> list[dict]:
    """Table 1's two cells (no loss, within one point) for one sweep's grid points ``g`` of task
    ``t`` and variant ``v`` (its ``records`` give vanilla's speed), with the paper's cells
    (``paper``: its table1 entry, read for ``paper_variant``) for the datasets ``t`` stands in for."""
    best = best_settings(g)
    van = [r for r in records if r["decoder"] == "vanilla"]
    tok_s = sum(r["new_tokens"] for r in van) / sum(r["wall_time"] for r in van)
    out = []
    for cell in ("no_loss", "within"):
        b = best[cell]
        row = {"task": t, "variant": v, "cell": cell, "vanilla_quality": best["baseline_quality"], "vanilla_tok_s": tok_s,
               "setting": b["decoder"] if b else "none", "quality": b["quality"] if b else None,
               "speedup": b["speedup"] if b else None,
               "agree_tokens": float(g.set_index("decoder").agree_tokens[b["decoder"]]) if b else None,
               "quality_vs_large": (float(g.set_index("decoder").quality_vs_large[b["decoder"]])
                                    if b and "quality_vs_large" in g else None)}
        for ds, stand in paper["stand_in"].items():
            if stand == t and paper_variant is not None:
                q, s = paper[paper_variant][cell][ds]
                row[f"paper {ds}"] = f"{q} ({paper['vanilla'][ds]}), {s}x"
        out.append(row)
    return out


def paper_speedups(table: pd.DataFrame, paper: dict) -> pd.DataFrame:
    """Each Table 1 cell's speedup (paper variants only) beside the paper's for every dataset its
    task stands in for."""
    return pd.DataFrame([{"task": r.task, "variant": r.variant, "cell": r.cell, "paper dataset": ds, "speedup": r.speedup,
                          "paper_speedup": paper[r.variant][r.cell][ds][1]}
                         for r in table.itertuples() if r.variant in ("unaligned", "aligned")
                         for ds, stand in paper["stand_in"].items() if stand == r.task])


def falls_with_rollback(tab: pd.DataFrame) -> list[bool]:
    """Figure 9: per task and alpha_FB, per consecutive alpha_RB: does latency fall (or stay)?"""
    return [b <= a for _, c in tab.groupby(["task", "fallback_threshold"])
            for a, b in zip(c.sort_values("rollback_threshold").latency[:-1],
                            c.sort_values("rollback_threshold").latency[1:])]


def ablation_kind(decoder: str) -> str:
    """Figure 5's kind of a sweep label: vanilla, BiLD, or one of its two ablations."""
    return ("vanilla" if decoder == "vanilla" else "no rollback" if decoder.endswith("_norb")
            else "no fallback" if "handover" in decoder else "BiLD")


def sampling_kind(decoder: str) -> str:
    """Section 4.2's kind of a sweep label: vanilla, speculative sampling (``_t1``: temperature
    1), speculative (greedy), BiLD or other."""
    return ("vanilla" if decoder == "vanilla" else "speculative sampling" if decoder.startswith("speculative")
            and decoder.endswith("_t1") else "speculative (greedy)" if decoder.startswith("speculative")
            else "BiLD" if decoder.startswith("bild@fb") else "other")
