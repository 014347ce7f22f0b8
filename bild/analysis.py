"""From BiLD sweep records (``common.harness.bench`` JSONL with text and references) to the paper's
figures and tables: quality against latency normalised to the large model (Figure 4), and
its summary (Table 1: best speedup with no quality loss, and within ~1 point); from oracle
records (:mod:`bild.oracle`) to Figure 2 (quality against the large model's engagement).

Latency is the mean wall time per prompt over the same prompts in the same run, divided by
``vanilla``'s (the large model alone); quality is the task's corpus metric over the outputs
(:mod:`common.metrics`); the fallback and rollback rates come from the decoder's stats.
"""
from __future__ import annotations

import re

import pandas as pd

from common.metrics import METRICS, agreement

LABEL = re.compile(r"^bild@fb(?P<fb>[0-9.]+)_rb(?P<rb>[0-9.]+|inf)$")


def sweep_points(records: list[dict], metric: str, baseline: str = "vanilla") -> pd.DataFrame:
    """One row per decoder of one sweep run.

    Returns:
        columns ``decoder, fallback_threshold, rollback_threshold, quality, latency`` (normalised
        to the baseline), ``speedup``, ``small_share`` (tokens the small model produced and kept),
        ``fallbacks_per_token``, ``rollbacks_per_token``, ``identical`` (share of outputs equal to the
        baseline's), ``agree_tokens`` and ``agree_prefix`` (mean share of the baseline's positions
        matched, anywhere and before the first difference: :func:`common.metrics.agreement`),
        ``prompts``. The baseline's row has latency 1.
    """
    df = pd.DataFrame(records)
    if baseline not in set(df.decoder):
        raise ValueError(f"the sweep has no {baseline!r} records: latency and quality need the large model alone")
    score = METRICS[metric]
    base = df[df.decoder == baseline].set_index("question_id")
    rows = []
    for name, g in df.groupby("decoder", sort=False):
        g = g.set_index("question_id").loc[base.index]  # the same prompts, in the same order
        m = LABEL.match(name)
        extra = g.get("extra", pd.Series([{}] * len(g), index=g.index))
        new = g.new_tokens.sum()
        src = [e.get("source") for e in extra]
        small = sum(s.count("small") for s in src if s) if all(src) else float("nan")
        rows.append({
            "decoder": name,
            "fallback_threshold": float(m["fb"]) if m else None,
            "rollback_threshold": float(m["rb"]) if m else None,
            "quality": score(list(g.text), list(g.reference)),
            "latency": g.wall_time.mean() / base.wall_time.mean(),
            "small_share": small / new if new else float("nan"),
            # from the stats of every decoder that counts them (the ablations too: no-rollback
            # still falls back); 0 for those that have none (vanilla, speculative)
            "fallbacks_per_token": sum(e.get("fallbacks", 0) for e in extra) / new if new else 0.0,
            "rollbacks_per_token": sum(e.get("rollbacks", 0) for e in extra) / new if new else 0.0,
            **_agreement(list(g.tokens), list(base.tokens)),
            "prompts": len(g),
        })
    out = pd.DataFrame(rows)
    out["speedup"] = 1.0 / out.latency
    return out


def _agreement(tokens: list, base: list) -> dict:
    # the second quality measure the issue asks for, agreement with the large model's own greedy
    # output: where the references are weak stand-ins (ShareGPT replies), it is the steadier one
    a = agreement(tokens, base)
    return {"identical": a["identical"], "agree_tokens": a["tokens"], "agree_prefix": a["prefix"]}


def best_settings(points: pd.DataFrame, tolerance: float = 1.0, baseline: str = "vanilla") -> dict:
    """Table 1's two cells: the fastest setting with quality >= the baseline's, and the fastest
    within ``tolerance`` points of it. Each ``{"decoder", "quality", "speedup"}`` or None."""
    q0 = float(points.loc[points.decoder == baseline, "quality"].iloc[0])
    cand = points[points.decoder != baseline]

    def fastest(ok):
        hit = cand[ok]
        if hit.empty:
            return None
        r = hit.sort_values(["speedup", "quality"], ascending=False).iloc[0]
        return {"decoder": r.decoder, "quality": float(r.quality), "speedup": float(r.speedup)}
    return {"baseline_quality": q0, "no_loss": fastest(cand.quality >= q0),
            "within": fastest(cand.quality >= q0 - tolerance)}


def split_reduced(records: list[dict], keep: int, baseline: str = "vanilla",
                  compact: str | None = None) -> dict[str, list[dict]]:
    """A reduced-vocabulary sweep's records (``bild.workflow.RuleParams.reduced_settings``) as
    sweeps sharing its baseline: ``{"full": the grid with the full head, "reduced": the labels
    ending ``_v<keep>``, "compact": those ending ``compact`` (when given and recorded)}``, the
    suffixes removed; each keeps the baseline's records."""
    base = [r for r in records if r["decoder"] == baseline]

    def ending(suffix):
        return [{**r, "decoder": r["decoder"].removesuffix(suffix)} for r in records
                if r["decoder"].endswith(suffix) and LABEL.match(r["decoder"].removesuffix(suffix))]
    out = {"full": base + [r for r in records if LABEL.match(r["decoder"])], "reduced": base + ending(f"_v{keep}")}
    if compact is not None and ending(compact):
        out["compact"] = base + ending(compact)
    return out


def oracle_points(records: list[dict], metric: str) -> pd.DataFrame:
    """One row per threshold of one oracle run (:mod:`bild.oracle`), ascending engagement.

    Returns:
        columns ``setting`` (``small``, ``oracle``, ``large``), ``threshold`` (None for the large
        model alone), ``quality`` (the corpus metric over all prompts), ``engaged`` (share of
        tokens where the large model's prediction was taken), ``changed`` (share where that
        changed the token), ``prompts``.
    """
    df = pd.DataFrame(records)
    score = METRICS[metric]
    key = df.threshold.fillna(float("inf"))
    rows = []
    for t, g in df.groupby(key, sort=True):
        g = g.sort_values("question_id")
        tokens = g.new_tokens.sum()
        rows.append({"setting": g.setting.iloc[0], "threshold": None if t == float("inf") else float(t),
                     "quality": score(list(g.text), list(g.reference)),
                     "engaged": g.engaged.sum() / tokens if tokens else float("nan"),
                     "changed": g.changed.sum() / tokens if tokens else float("nan"), "prompts": len(g)})
    counts = {r["prompts"] for r in rows}
    if len(counts) != 1:
        raise ValueError(f"thresholds cover different prompt counts {sorted(counts)}: an incomplete oracle run")
    return pd.DataFrame(rows)


def oracle_match(points: pd.DataFrame) -> float | None:
    """The smallest share of large-model engagement at which the oracle's quality reaches the
    large model's alone (section 3.1: about 20% in the paper); None when no threshold does."""
    q_large = float(points.loc[points.setting == "large", "quality"].iloc[0])
    hit = points[(points.setting != "large") & (points.quality >= q_large)]
    return None if hit.empty else float(hit.engaged.min())


def chosen_setting(points: pd.DataFrame, tolerance: float = 1.0) -> tuple[str, dict] | None:
    """The BiLD setting Figures 8 and 10 show: the one with roughly the large model's quality,
    Table 1's fastest without loss, else its fastest within ``tolerance`` points, else (cell
    ``closest``) the grid's best quality, the fastest of equals. Returns ``(cell, {"decoder",
    "quality", "speedup", "agree_tokens"})``; None only without any grid setting (ablations never
    count). The choice is the paper's, on the reference metric; ``agree_tokens`` (the share of the
    large model's own greedy tokens the setting keeps, None where the points lack it) says whether
    "roughly the large model's quality" also holds against its own output, which stand-in
    references' noise cannot decide."""
    grid = points[points.decoder.str.match(LABEL.pattern) | (points.decoder == "vanilla")]
    agree = grid.set_index("decoder").agree_tokens if "agree_tokens" in grid else None

    def with_agreement(b: dict) -> dict:
        return {**b, "agree_tokens": None if agree is None else float(agree[b["decoder"]])}
    best = best_settings(grid, tolerance)
    for cell in ("no_loss", "within"):
        if best[cell] is not None:
            return cell, with_agreement(best[cell])
    cand = grid[grid.decoder != "vanilla"]
    if cand.empty:
        return None
    r = cand.sort_values(["quality", "speedup"], ascending=False).iloc[0]
    return "closest", with_agreement({"decoder": r.decoder, "quality": float(r.quality), "speedup": float(r.speedup)})
CALM_LABEL = re.compile(r"^calm@l(?P<lam>[0-9.]+)_t(?P<tau>[0-9.]+)$")


def calm_points(records: list[dict], metric: str, baseline: str = "vanilla") -> pd.DataFrame:
    """One row per decoder of one CALM sweep run (Figure 7): :func:`sweep_points`' columns,
    with ``threshold`` (lambda) and ``tau`` from the ``calm@l<lambda>_t<tau>`` labels, and from
    the decoder's stats ``mean_exit_layer`` (layers run per token, over every token of every
    prompt; the prefill's token counts as the full depth) and ``early_exit_share`` (tokens that
    left before the last layer; NaN and 0 for decoders without exits, the baseline's)."""
    out = sweep_points(records, metric, baseline).drop(
        columns=["fallback_threshold", "rollback_threshold", "small_share", "fallbacks_per_token",
                 "rollbacks_per_token"])
    df = pd.DataFrame(records)
    lam, tau, depth, share = [], [], [], []
    for name in out.decoder:
        m = CALM_LABEL.match(name)
        lam.append(float(m["lam"]) if m else None)
        tau.append(float(m["tau"]) if m else None)
        extra = [e or {} for e in df.loc[df.decoder == name, "extra"]] if "extra" in df else []
        exits = [x for e in extra for x in e.get("exit_layers", [])]
        depth.append(sum(exits) / len(exits) if exits else float("nan"))
        share.append(sum(e.get("early_exits", 0) for e in extra) / len(exits) if exits else 0.0)
    return out.assign(threshold=lam, tau=tau, mean_exit_layer=depth, early_exit_share=share)


def frontier(points: pd.DataFrame, x: str = "latency", y: str = "quality") -> pd.DataFrame:
    """The points no other point beats on both axes (lower ``x``, higher ``y``), by ``x``:
    the trade-off curve a sweep draws."""
    pts = points.sort_values([x, y], ascending=[True, False])
    best, keep = float("-inf"), []
    for i, r in pts.iterrows():
        if r[y] > best:
            keep.append(i)
            best = r[y]
    return pts.loc[keep]


def quality_gap(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Both methods' best quality at equal latency budgets (Figure 7: a = early-exit BiLD,
    b = CALM): at the latency of every point on either trade-off curve (:func:`frontier`),
    each method's best quality at no more latency.

    Returns:
        columns ``latency, on`` (``"a"``, ``"b"`` or ``"both"``: whose curve has the point),
        ``quality_a, quality_b`` (NaN where that method has no point that fast) and
        ``gap = quality_a - quality_b``, by latency.
    """
    fa, fb = frontier(a), frontier(b)
    xa, xb = set(map(float, fa.latency)), set(map(float, fb.latency))
    on = {x: "both" if x in xa and x in xb else "a" if x in xa else "b" for x in xa | xb}

    def best(f, x):
        ok = f[f.latency <= x]
        return float(ok.quality.max()) if len(ok) else float("nan")
    rows = [{"latency": x, "on": on[x], "quality_a": best(fa, x), "quality_b": best(fb, x)} for x in sorted(on)]
    out = pd.DataFrame(rows, columns=["latency", "on", "quality_a", "quality_b"])
    return out.assign(gap=out.quality_a - out.quality_b)
