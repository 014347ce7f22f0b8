"""The cross-method tables (``cross.*``, ``study.*``, ``components.fig``) from benchmark records,
trainings' statistics and learning curves.

Pure functions from records to the tables the notebooks (notebooks/src/cross.py, study.py,
components.py) write; a notebook loads its declared records, calls these, states the verdict
and draws the figure.
"""
from __future__ import annotations

import pandas as pd

from ..config import AA_LABEL
from .report import aa_spread, extra_memory, host_caveat, hosts, limits, stats_match, step_times, summarize


# --- cross.table / cross.fig -------------------------------------------------------------------

def component_of(cfg: dict) -> str | None:
    """Which trained component a decoder's options name (Medusa heads, EAGLE's head or a draft model)."""
    return "medusa" if "heads" in cfg else "eagle" if "head" in cfg else "draft" if "draft" in cfg else None


def extras(group: str, recs: list[dict], decoder: str, stats: dict[str, dict], joins) -> tuple:
    """(extra parameters in millions, training seconds, training hardware, whether the benchmark
    decoded the weights that training wrote) of a decoder's component: a joined group's
    (``joins``: the paper packages' groups) is its package's, named in ``stats`` by group."""
    if decoder == "vanilla":
        return 0.0, None, None, None
    cfg = next(r.get("decoder_config", {}) for r in recs if r["decoder"] == decoder)
    c = group if group in joins else component_of(cfg)
    if c is None:
        return 0.0, None, None, None
    if c not in stats:
        raise FileNotFoundError(f"{decoder} uses trained {c} but no {c}_stats.json is among the declared inputs")
    s = stats[c]
    return (s["params"] / 1e6, s["train_wall_s"], s.get("hardware"),
            stats_match(s, [r for r in recs if r["decoder"] == decoder]))


def ran_on(recs: list[dict]) -> str:
    """The machine a group's benchmark ran on, named as :func:`.report.hosts` names it (device
    and torch version, as every verdict's host caveat does); a group whose own records span
    several hosts gets :func:`.report.host_caveat`'s words, since its speedups (each a ratio to
    the group's vanilla) then measure the machines too."""
    return host_caveat(recs) or next(iter(hosts(recs)), "unknown")


def cross_rows(groups: dict[str, list[dict]], stats: dict[str, dict], joins, curve) -> pd.DataFrame:
    """cross.table's rows: every group's summary with the trained components' costs, the
    machine it ran on, extra memory per call, the hardware limits (its host's cost ``curve``)
    and where a step's time goes."""
    rows = []
    for g, recs in groups.items():
        t = summarize(recs)
        t.insert(0, "group", g)
        ex = [extras(g, recs, d, stats, joins) for d in t.decoder]
        t["extra_params_m"] = [e[0] for e in ex]
        t["train_wall_s"] = pd.Series([e[1] for e in ex], dtype=object)  # blank, not nan, when untrained
        t["trained_on"] = pd.Series([e[2] for e in ex], dtype=object)
        t["same_weights"] = pd.Series([e[3] for e in ex], dtype=object)
        t["ran_on"] = ran_on(recs)
        mem = extra_memory(recs)  # blank for a group whose records predate per-call growth
        t["extra_mem_mib"] = pd.Series([mem.get(d) for d in t.decoder], dtype=object)
        t = t.merge(limits(recs, curve), on="decoder", how="left").merge(step_times(recs), on="decoder", how="left")
        rows.append(t)
    return pd.concat(rows, ignore_index=True)


# --- study.* -------------------------------------------------------------------------------------

def per_category(records: list[dict], categories: list[str]) -> pd.DataFrame:
    """Long table: one row per (category, decoder) with speedup, interval, tau and identity; the
    category's A/A spread beside it; then the overall rows. ``lossless``: identical to vanilla
    on every prompt of the study (a lossy method that happens to match on one category's
    prompts is still lossy there)."""
    rows = []
    for cat in [*categories, "overall"]:
        recs = records if cat == "overall" else [r for r in records if r["category"] == cat]
        t = summarize(recs)
        t.insert(0, "category", cat)
        t["aa_spread"] = aa_spread(recs)
        rows.append(t[t.decoder != "vanilla"])
    out = pd.concat(rows, ignore_index=True)
    overall = out[out.category == "overall"]
    exact = {d: s.split("/")[0] == s.split("/")[1] for d, s in zip(overall.decoder, overall.identical_to_vanilla)}
    out["lossless"] = out.decoder.map(exact)
    return out


def fastest_lines(long: pd.DataFrame) -> list[str]:
    """Per category of :func:`per_category`'s table: the fastest lossless method, its speedup and
    its margin over the next one, against the category's A/A spread (a margin within it is a tie)."""
    lines = []
    for cat, t in long[(long.decoder != AA_LABEL) & long.lossless].groupby("category", sort=False):
        t = t.sort_values("speedup", ascending=False)
        first = t.iloc[0]
        spread = first.aa_spread
        if len(t) > 1:
            second = t.iloc[1]
            margin = first.speedup - second.speedup
            tie = spread is not None and not pd.isna(spread) and margin <= spread * first.speedup
            lines.append(f"{cat}: fastest lossless {first.decoder} {first.speedup:.2f}x, ahead of {second.decoder} "
                         f"by {margin:.2f}" + (" (within the A/A spread: a tie)" if tie else "")
                         + ("" if pd.isna(spread) else f", A/A spread {100 * spread:.1f}%"))
        else:
            lines.append(f"{cat}: only lossless method {first.decoder} {first.speedup:.2f}x")
    return lines


# --- components.fig ------------------------------------------------------------------------------

def top1(v):
    """A held-out top-1 entry: Medusa's is one per head (the first head's is watched), the others' one number."""
    return v[0] if isinstance(v, list) else v


def curve_rows(curves: dict[str, pd.DataFrame], stats: dict[str, dict], key, data_of) -> pd.DataFrame:
    """One row per trained component: the budget it took (steps, examples, wall time), its
    training tokens and the held-out top-1 untrained, at its best evaluation, at the end and of
    the weights it publishes (``chosen_step``: the best evaluation it restored; else the last);
    ``data``: "as above" where it trained on the teacher cache ``key``, else ``data_of`` its own."""
    rows = []
    for name, c in curves.items():
        s = stats[name]
        t = c.heldout_top1.map(top1)
        kept = t[c.step == s["chosen_step"]] if s.get("chosen_step") is not None else t.iloc[-1:]
        rows.append({"component": name, "steps": int(c.step.iloc[-1]), "examples_seen": int(c.examples_seen.iloc[-1]),
                     "train_tokens": s.get("train_tokens"),
                     "evaluations": len(c), "train_wall_s": round(float(c.wall_s.iloc[-1]), 1),
                     "stopped": s["stopped"], "top1_untrained": t.iloc[0], "top1_best": t.max(),
                     "top1_final": t.iloc[-1], "top1_kept": kept.iloc[-1] if len(kept) else t.iloc[-1],
                     "heldout_loss_final": top1(c.heldout_loss.iloc[-1]),
                     "watched": {"medusa": "head-1 top-1", "eagle": "first-token top-1"}.get(name, "top-1 agreement"),
                     "data": "as above" if s.get("teacher") == key else data_of(s.get("teacher"))})
    return pd.DataFrame(rows)
