"""EAGLE-3's ablation table (artifact ``cross.eagle3``, config ``eagle3_ablation``): one row per
draft head, in the order each adds one thing, its training record beside the benchmark of the
decoder drafting with it.

What a row adds is read from the training records, never typed: a head of another kind than the
row before (EAGLE's head -> EAGLE-3's: fused features of several layers, the token-only loss),
more unrolled training-time-test steps, another corpus. The benchmark's columns come from one
interleaved run (:func:`common.harness.report.summarize`: speedup over vanilla in the same run,
mean accepted length ``tau``, outputs identical to vanilla's).
"""
from __future__ import annotations

from typing import Mapping

import pandas as pd

from ..config import placeholders

DEPTHS = 4  # held-out top-1 columns: the depths an 8-position tree reaches


def head_label(head: str, options: Mapping[str, Mapping]) -> str | None:
    """The benchmark label whose options name component ``head`` (``"{head}"``); None when no
    label drafts with it; a ValueError when several do (the row would be ambiguous)."""
    hits = [label for label, opts in options.items() if head in placeholders(opts)]
    if len(hits) > 1:
        raise ValueError(f"several benchmark labels draft with {head!r}: {hits}; the ablation needs one each")
    return hits[0] if hits else None


def precision(stats: Mapping) -> str:
    """A training record's precision of its steps (records before the option trained in float32)."""
    return stats.get("precision") or "float32"


def adds(prev: Mapping | None, cur: Mapping) -> str:
    """What training record ``cur`` changes from ``prev`` (the row before), in words."""
    if prev is None:
        return "baseline"
    out = []
    if prev.get("kind", prev.get("component")) != cur.get("kind", cur.get("component")):
        layers = cur.get("fused_layers")
        out.append(f"fused features (layers {', '.join(map(str, layers))})" if layers else "another head")
    if prev.get("ttt_steps", 1) != cur.get("ttt_steps", 1):
        out.append(f"training-time test ({cur.get('ttt_steps', 1)} steps)")
    if precision(prev) != precision(cur):  # a confound, not an ingredient: the row says so
        out.append(f"{precision(cur)} training steps")
    pc, cc = prev.get("corpus") or {}, cur.get("corpus") or {}
    if pc.get("dir") != cc.get("dir") or pc.get("answer_tokens") != cc.get("answer_tokens"):
        out.append(f"corpus {cc.get('dir')} ({cc.get('answer_tokens', 0):,} answer tokens)")
    return " + ".join(out) or "nothing (same recipe)"


def ablation_rows(heads: list[str], stats: Mapping[str, Mapping], summary: pd.DataFrame,
                  options: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per head of ``heads`` (in order).

    Args:
        heads: component names, each adding one thing to the one before.
        stats: head -> its training record (``cross/raw/<head>_stats.json``).
        summary: :func:`common.harness.report.summarize` of the ablation's run (one row per label).
        options: the run's labels -> decoder options (which label drafts with which head).
    Returns:
        columns ``head, adds, label, answer_tokens, precision, steps, train_h, stopped, top1_d1..top1_d4``
        (held-out top-1 at each depth given correct ancestors: ``depth_acc_top1``),
        ``tau_predicted`` (the 8-node static tree's expected accepted length from those rates),
        ``tau``, ``speedup``, ``speedup_lo``, ``speedup_hi``, ``identical``.
    """
    by_label = summary.set_index("decoder")
    rows, prev = [], None
    for h in heads:
        s = stats[h]
        label = head_label(h, options)
        bench = by_label.loc[label] if label is not None and label in by_label.index else None
        acc = list(s.get("depth_acc_top1") or [])
        row = {"head": h, "adds": adds(prev, s), "label": label or "not benchmarked",
               "answer_tokens": (s.get("corpus") or {}).get("answer_tokens", s.get("answer_tokens")),
               "precision": precision(s), "steps": s.get("steps"), "train_h": (s.get("train_wall_s") or 0.0) / 3600, "stopped": s.get("stopped")}
        row.update({f"top1_d{d + 1}": acc[d] if d < len(acc) else None for d in range(DEPTHS)})
        row["tau_predicted"] = (s.get("tree_expected_accept_length") or {}).get("8")
        for col, src in (("tau", "mean_accepted_length"), ("speedup", "speedup"), ("speedup_lo", "speedup_lo"),
                         ("speedup_hi", "speedup_hi"), ("identical", "identical_to_vanilla")):
            row[col] = bench[src] if bench is not None and src in bench else None
        rows.append(row)
        prev = s
    return pd.DataFrame(rows)
