"""The ``bild.*`` tables: the sweep's (Table 1, Figures 4, 5 and 9, section 4.2's speculative
sampling), the oracle's (Figure 2), the appendix's (Figures 8 and 10) and early exit's (Figures 6
and 7), from the points of :mod:`bild.analysis`.

Pure functions from records and sweep points to the tables and verdict inputs the notebook
(notebooks/src/bild_*.py) writes; the notebook loads the declared records, calls these,
states the trend lines against the paper and draws the figures.
"""
from __future__ import annotations

import pandas as pd

from common.metrics import METRICS

from .analysis import (best_settings, chosen_setting, oracle_match, oracle_points, quality_gap, split_reduced,
                       sweep_points)
from .examples import example_table
from .flops import model_shapes, normalized

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


PAPER_VARIANTS = ("unaligned", "aligned")  # Table 1's rows the paper has (the others are this project's)


def no_loss_cells(table: pd.DataFrame) -> pd.DataFrame:
    """Table 1's no-loss cells of the paper's variants (:func:`table1_rows`' rows)."""
    return table[(table.cell == "no_loss") & table.variant.isin(PAPER_VARIANTS)]


def kept_greedy(table: pd.DataFrame) -> list[bool]:
    """Per no-loss cell: a speedup above 1x that keeps every one of the large model's own greedy
    tokens (``agree_tokens`` 1). The stand-in references' metric beside it is the paper's; this is
    the quality axis that is not noise here (a cell with no setting fails)."""
    return [bool(r.speedup is not None and r.speedup > 1.0 and r.agree_tokens is not None
                 and r.agree_tokens >= 1.0) for r in no_loss_cells(table).itertuples()]


def noise_note(table: pd.DataFrame) -> str | None:
    """Where a "no loss" rests on the stand-in references' noise: the no-loss cells whose setting
    changes the large model's own greedy output (``agree_tokens`` below 1) yet scores no lower on
    the references. None when no cell does."""
    cells = [f"{r.task}/{r.variant} {r.setting} (agree_tokens {r.agree_tokens:.3f})"
             for r in no_loss_cells(table).itertuples()
             if r.setting != "none" and r.agree_tokens is not None and r.agree_tokens < 1.0]
    if not cells:
        return None
    return ("no loss on the stand-in references only, inside their noise: " + ", ".join(cells)
            + " change the large model's own greedy output")


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


def oracle_table(runs: dict[tuple[str, str], list[dict]], metric_of) -> pd.DataFrame:
    """Figure 2's points: per (task, variant) oracle run, :func:`bild.analysis.oracle_points` with
    the task's corpus metric (``metric_of(task)``), labelled with task and variant."""
    return pd.concat([oracle_points(recs, metric_of(t)).assign(task=t, variant=v)
                      for (t, v), recs in sorted(runs.items())], ignore_index=True)


def oracle_reached(points: pd.DataFrame) -> dict[tuple[str, str], float | None]:
    """Per (task, variant): the smallest engagement at which the oracle reaches the large model's
    quality (None: no threshold of the grid does)."""
    return {(t, v): oracle_match(g) for (t, v), g in points.groupby(["task", "variant"])}


def chosen_settings(sweeps: dict[tuple[str, str], list[dict]], metric_of) -> dict:
    """Per (task, variant) sweep: (:func:`bild.analysis.chosen_setting` of its points, vanilla's
    quality): the appendix figures' setting at roughly the large model's quality."""
    out = {}
    for (t, v), recs in sorted(sweeps.items()):
        pts = sweep_points(recs, metric_of(t))
        out[t, v] = (chosen_setting(pts), float(pts.loc[pts.decoder == "vanilla", "quality"].iloc[0]))
    return out


def chosen_changes_output(chosen: dict) -> str | None:
    """The chosen settings (:func:`chosen_settings`) that change the large model's own greedy
    output (``agree_tokens`` below 1), named with their agreement: chosen as "roughly the large
    model's quality" on the reference metric alone. None when every chosen setting keeps it."""
    cells = [f"{t}/{v} {best['decoder']} (agree_tokens {best['agree_tokens']:.3f})"
             for (t, v), (cell_best, _) in chosen.items() if cell_best is not None
             for best in [cell_best[1]] if best.get("agree_tokens") is not None and best["agree_tokens"] < 1.0]
    if not cells:
        return None
    return ("chosen on the reference metric (the paper's criterion), yet changing the large model's own greedy "
            "output: " + ", ".join(cells))


def fig8_table(chosen: dict, sweeps: dict[tuple[str, str], list[dict]], models: list[dict], p8: dict) -> pd.DataFrame:
    """Figure 8: per (task, variant) at its chosen setting, FLOPs, MOPs and arithmetic intensity
    normalised to vanilla (:func:`bild.flops.normalized`) beside the measured speedup, and the
    paper's CNN/DM numbers (``p8``) as the last row."""
    rows = []
    for (t, v), (cell_best, q0) in chosen.items():
        row = {"task": t, "variant": v, "vanilla_quality": q0}
        if cell_best is None:
            rows.append({**row, "setting": "none (the sweep ran no BiLD grid setting)"})
            continue
        cell, best = cell_best
        large, small, seq2seq = model_shapes(models, t, v)
        c = normalized(sweeps[t, v], best["decoder"], large, small, seq2seq)
        rows.append({**row, "setting": f"{best['decoder']} ({cell})", "quality": best["quality"],
                     "agree_tokens": best.get("agree_tokens"), "flops": c["flops"],
                     "mops": c["mops"], "intensity": c["intensity"], "speedup": best["speedup"],
                     "intensity_vanilla": c["intensity_base"], "intensity_bild": c["intensity_abs"]})
    return pd.DataFrame(rows + [{"task": f"paper: {p8['dataset']} ({p8['stand_in']})", "variant": p8["variant"],
                                 "setting": f"roughly vanilla's quality; FLOPs {p8['flops']}", "mops": p8["mops"],
                                 "intensity": p8["intensity"], "speedup": p8["speedup"]}])


EXAMPLE_COLS = ["task", "variant", "setting", "question_id", "reference", "large", "small", "bild", "large_share"]


def examples_table(chosen: dict, sweeps: dict, oracles: dict, per_run: int) -> pd.DataFrame:
    """Figure 10: ``per_run`` example outputs per (task, variant) at its chosen setting
    (:func:`bild.examples.example_table`), in :data:`EXAMPLE_COLS`."""
    parts = []
    for (t, v), (cell_best, _) in chosen.items():
        if cell_best is None or (t, v) not in oracles:
            continue
        cell, best = cell_best
        ex = example_table(sweeps[t, v], oracles[t, v], best["decoder"], per_run)
        kept = best.get("agree_tokens")
        parts.append(ex.assign(task=t, variant=v, setting=f"{best['decoder']} ({cell}" + (
            f", agree_tokens {kept:.3f})" if kept is not None else ")")))
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["task", "variant", "setting"])
    return table.reindex(columns=EXAMPLE_COLS)


def within_one_rows(points: dict, tasks, paper: dict) -> list[dict]:
    """Figure 6: per task, the fastest early-exit BiLD setting within one quality point of the
    fine-tuned model alone, beside the paper's speedups for the datasets the task stands in for."""
    rows = []
    for t in tasks:
        g = points[t, "bild"]
        q0 = float(g.loc[g.decoder == "vanilla", "quality"].iloc[0])
        within = g[(g.decoder != "vanilla") & (g.quality >= q0 - 1)].sort_values("speedup", ascending=False)
        best = within.iloc[0] if len(within) else None
        rows.append({"task": t, "vanilla_quality": q0, "best_within_1": best.decoder if best is not None else "none",
                     "quality": best.quality if best is not None else None,
                     "speedup": best.speedup if best is not None else None,
                     "agree_tokens": best.agree_tokens if best is not None else None,
                     **{f"paper {ds} speedup": paper["within_speedup"][ds]
                        for ds, s in paper["stand_in"].items() if s == t}})
    return rows


def calm_gaps(points: dict, tasks, metric_of) -> pd.DataFrame:
    """Figure 7: per task, early-exit BiLD's quality minus CALM's at equal latency budgets
    (:func:`bild.analysis.quality_gap`), by the task's metric and by agreement with each model's
    own greedy tokens (``measure`` = ``agree_tokens``), with each model's vanilla value."""
    gaps = []
    for t in tasks:
        b, c = points[t, "bild"], points[t, "calm"]
        q_bild = float(b.loc[b.decoder == "vanilla", "quality"].iloc[0])
        q_calm = float(c.loc[c.decoder == "vanilla", "quality"].iloc[0])
        b, c = b[b.decoder != "vanilla"], c[c.decoder != "vanilla"]
        agree = quality_gap(b.assign(quality=b.agree_tokens), c.assign(quality=c.agree_tokens))
        gaps.append(quality_gap(b, c).assign(task=t, measure=metric_of(t), vanilla_bild=q_bild, vanilla_calm=q_calm))
        gaps.append(agree.assign(task=t, measure="agree_tokens", vanilla_bild=1.0, vanilla_calm=1.0))
    return pd.concat(gaps, ignore_index=True)


def reduced_rows(recs: list[dict], rv, metric: str, paper: dict) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    """Table 1's rows beyond the paper (profiles with ``bild.reduced_vocab``): from one sweep,
    the small model with its full head, its ``rv.keep``-token head and (``rv.compact_layers``)
    the compact model trained with it, each against that run's vanilla. Returns the rows and
    each part's sweep points (with ``quality_vs_large``)."""
    compact = f"_l{rv.compact_layers}v{rv.keep}" if rv.compact_layers else None
    both = {}
    for k, r in split_reduced(recs, rv.keep, compact=compact).items():
        g, large = sweep_points(r, metric), vs_large(r, metric)  # each part keeps the run's vanilla
        both[k] = g.assign(quality_vs_large=[large[d] for d in g.decoder])
    names = {"full": f"{rv.variant}, full head (reduced sweep's run)",
             "reduced": f"{rv.variant}, {rv.keep}-token head (beyond the paper)",
             "compact": f"{rv.variant}, {rv.compact_layers}-layer model trained with the {rv.keep}-token head (beyond the paper)"}
    rows = [row for k, g in both.items() for row in table1_rows(rv.task, names[k], g, recs, paper)]
    return rows, both


def reduced_meta(rv, rstats: dict, cstats: dict | None, match: str | None) -> dict:
    """The header lines of the reduced-vocabulary rows: what the head keeps and (``cstats``) the
    compact model's training, with whether the sweep decoded its weights (``match``)."""
    out = {"reduced vocabulary": (f"{rv.keep} of {rstats['vocab']} tokens kept (the most frequent {rstats['labels']} "
                                  f"labels of the small model's training data): {rstats['train_coverage']:.1%} of those "
                                  f"labels, {rstats['heldout_coverage']:.1%} of the held-out greedy tokens")}
    if cstats is not None:
        out["compact small model"] = (
            f"{cstats['layers']}-layer model trained with the {cstats['keep']}-token head ({cstats['steps']} steps, stopped: "
            f"{cstats['stopped']}): held-out top-1 agreement {cstats['final']['heldout_top1']:.3f}, "
            f"{(cstats['params_not_shared'] + cstats['head_params']) / 1e6:.1f} M parameters per step "
            f"(layers + head; the full 4-layer model's: see the reduced-vocabulary stats); the sweep decoded "
            f"these weights: {match}")  # no: retrained after the sweep, rerun it
    return out
