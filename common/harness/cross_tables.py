"""The cross-method tables (``cross.*``, ``study.*``, ``components.fig``) from benchmark records,
trainings' statistics and learning curves.

Pure functions from records to the tables the notebooks (notebooks/src/cross.py, study.py,
components.py) write; a notebook loads its declared records, calls these, states the verdict
and draws the figure.
"""
from __future__ import annotations

import pandas as pd

from pathlib import Path

from ..config import AA_LABEL, bench_decoders, labels_config
from ..errors import UserError
from ..records import read_jsonl
from .report import (aa_spread, check_decoders, extra_memory, host_caveat, hosts, limits, stats_match, step_times,
                     summarize)
from .specbench import category_of


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


def study_runs(paths, prefix: str, bench: dict, where: str, profile) -> dict[str, list[dict]]:
    """``{dataset: records}`` of the study runs among ``paths`` named ``<prefix><dataset>.jsonl``,
    each checked against the decoders (and their options) the config's benchmark entry ``bench``
    lists for that dataset, plus the A/A pair (``where`` names the entry in the error); every
    record gets Spec-Bench's ``category`` and a ``question_id`` made unique across datasets
    (``<dataset>/<id>``)."""
    runs = {}
    for p in sorted(Path(p) for p in paths if Path(p).name.startswith(prefix)):
        recs = read_jsonl(p)
        ds = p.stem.removeprefix(prefix)
        labels = [*bench_decoders(bench, ds), AA_LABEL]
        check_decoders(recs, labels, f"cross/raw/{p.name}", f"{where} (dataset {ds})", labels_config(profile, labels))
        for r in recs:
            r["category"] = category_of(r)
            r["question_id"] = f"{r['dataset']}/{r['question_id']}"
        runs[ds] = recs
    return runs


def sampled_rows(greedy: list[dict], sampled: list[dict]) -> pd.DataFrame:
    """The study at temperature > 0 beside greedy, one row per decoder (vanilla and its A/A pair
    left out), over the prompts the sampled runs decoded: speedup over the sampled vanilla with
    its 95% interval, τ, and the same decoder's greedy speedup and τ on those prompts
    (``question_id``s as the study makes them unique), ``tau_vs_greedy`` = τ / greedy τ (what
    EAGLE and Spec-Bench report beside sampled speedups). A decoder without greedy records on
    those prompts has its greedy columns empty.

    Returns:
        a DataFrame: decoder, prompts, speedup, speedup_lo, speedup_hi, tau, greedy_speedup,
        greedy_tau, tau_vs_greedy.
    """
    qids = {r["question_id"] for r in sampled}
    g = summarize([r for r in greedy if r["question_id"] in qids]).set_index("decoder")
    s = summarize(sampled)
    s = s[~s.decoder.isin(["vanilla", AA_LABEL])]
    out = pd.DataFrame({"decoder": s.decoder, "prompts": s.prompts, "speedup": s.speedup, "speedup_lo": s.speedup_lo,
                        "speedup_hi": s.speedup_hi, "tau": s.mean_accepted_length,
                        "greedy_speedup": s.decoder.map(g["speedup"]) if "speedup" in g else None,
                        "greedy_tau": s.decoder.map(g["mean_accepted_length"])})
    out["tau_vs_greedy"] = out.tau / out.greedy_tau
    return out.reset_index(drop=True)


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


# --- study.oracle / study.calibration ------------------------------------------------------------

POOL = "pool"  # the decoder that merges several proposers' candidates per step (common/decoders/pool.py)


def _by_prompt(runs: dict[str, list[dict]]) -> dict[tuple[str, str], dict[str, dict]]:
    """(run, question_id) -> {decoder label: record}: a prompt is always its own run's, so two
    runs that share question ids (each with its own vanilla) are never compared with each other."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for run, recs in runs.items():
        for r in recs:
            out.setdefault((run, str(r["question_id"])), {})[r["decoder"]] = r
    return out


def _speedup(prompts: list[dict[str, dict]], label: str, baseline: str = "vanilla") -> float | None:
    """``label``'s speedup over ``baseline`` on ``prompts`` as :func:`.report.summarize` computes it
    (a ratio of totals: new tokens over summed wall time, over the baseline's); None unless the
    label has a record on every one of them (a partial run is not compared with a whole one)."""
    if not prompts or any(label not in p or baseline not in p for p in prompts):
        return None
    rate = lambda lab: sum(p[lab]["new_tokens"] for p in prompts) / sum(p[lab]["wall_time"] for p in prompts)
    return rate(label) / rate(baseline)


def _oracle(prompts: list[dict[str, dict]], among, baseline: str = "vanilla") -> tuple[float, int, dict[str, int]]:
    """The per-prompt oracle over the labels ``among`` (a set, or None for every label but the
    baseline, its A/A pair and the pool's: the pool is what the oracle is measured against, and
    an oracle that may pick it could only tie it): on each prompt the least wall time among those whose tokens equal
    the baseline's there. Returns (speedup = the baseline's summed wall / the oracle's, the prompts
    where no candidate was lossless and the baseline's own time stands, how often each label won).
    The chosen outputs equal the baseline's, so this is also :func:`_speedup`'s ratio of totals."""
    base_wall = oracle_wall = 0.0
    fallback, wins = 0, {}
    for p in prompts:
        ref = p[baseline]
        cands = {lab: r for lab, r in p.items() if lab not in (baseline, AA_LABEL)
                 and (lab.split("@")[0] != POOL if among is None else lab in among) and r["tokens"] == ref["tokens"]}
        base_wall += ref["wall_time"]
        if cands:
            lab = min(cands, key=lambda k: cands[k]["wall_time"])
            oracle_wall += cands[lab]["wall_time"]
            wins[lab] = wins.get(lab, 0) + 1
        else:  # every method differs from greedy here: a lossless oracle can only decode greedily
            oracle_wall += ref["wall_time"]
            fallback += 1
    return base_wall / oracle_wall, fallback, wins


def _lossless_labels(by_prompt: dict, baseline: str = "vanilla") -> list[str]:
    """The methods (not the baseline nor its A/A pair) identical to the baseline on every prompt
    they ran, over every run: :func:`per_category`'s ``lossless``."""
    seen: dict[str, bool] = {}
    for p in by_prompt.values():
        for lab, r in p.items():
            if lab not in (baseline, AA_LABEL) and baseline in p:
                seen[lab] = seen.get(lab, True) and r["tokens"] == p[baseline]["tokens"]
    return [lab for lab, ok in seen.items() if ok]


def best_pair(runs: dict[str, list[dict]], exclude=(POOL,)) -> list[str]:
    """The two lossless methods with the highest overall speedup (every prompt of every run, each
    over its own run's vanilla), fastest first: the pair a two-method oracle chooses between. Labels
    of the decoders in ``exclude`` (the pool itself) are left out; fewer than two when fewer exist."""
    by_prompt = _by_prompt(runs)
    prompts = [p for p in by_prompt.values() if "vanilla" in p]
    sp = {lab: _speedup(prompts, lab) for lab in _lossless_labels(by_prompt) if lab.split("@")[0] not in exclude}
    return sorted((lab for lab, s in sp.items() if s is not None), key=lambda lab: -sp[lab])[:2]


def oracle_rows(runs: dict[str, list[dict]], categories: list[str] | None = None, pools: list[str] = (),
                pair: list[str] | None = None, absent: str = "not run") -> pd.DataFrame:
    """study.oracle's table: per category (records' ``category``, first-seen order unless
    ``categories``) and ``overall``, the best single lossless method and its speedup, the per-prompt
    oracle over the ``pair`` (default :func:`best_pair`: the two fastest overall), over every method
    (``oracle_all``, the pool excluded; at least the best single by construction: that one is a
    candidate on every prompt), and over vanilla and its A/A twin (``aa_oracle``: what choosing the
    faster of two identical runs gains from timing noise alone, the oracle's selection bias at its
    smallest); ``oracle_wins``:
    how many of the prompts each method wins in ``oracle_all`` (most first); ``no_lossless``: prompts
    where no method matched greedy. Then one column per label in ``pools``: its speedup, blank
    where it lacks a prompt of the category, ``absent`` in every row when no record has it.

    ``runs``: dataset -> that run's records (each with its own ``vanilla``); a prompt is compared
    only within its run, and a category sums over its prompts of every run (as
    :func:`per_category`'s ``overall`` does)."""
    by_prompt = _by_prompt(runs)
    prompts = {k: p for k, p in by_prompt.items() if "vanilla" in p}
    if not prompts:
        raise UserError("the study's records hold no vanilla record: no speedup to compute")
    first = {k: next(iter(p.values())) for k, p in prompts.items()}
    cats = categories if categories is not None else list(dict.fromkeys(r["category"] for r in first.values()))
    lossless = [lab for lab in _lossless_labels(by_prompt) if lab.split("@")[0] != POOL]
    pair = best_pair(runs) if pair is None else list(pair)
    ran = {lab for p in prompts.values() for lab in p}
    rows = []
    for cat in [*cats, "overall"]:
        ps = [p for k, p in prompts.items() if cat == "overall" or first[k]["category"] == cat]
        if not ps:
            continue
        singles = {lab: _speedup(ps, lab) for lab in lossless}
        singles = {lab: s for lab, s in singles.items() if s is not None}
        best = max(singles, key=singles.get) if singles else None
        two, _, _ = _oracle(ps, set(pair)) if len(pair) == 2 else (None, 0, {})
        every, fallback, wins = _oracle(ps, None)
        row = {"category": cat, "prompts": len(ps), "best_single": best,
               "best_single_speedup": singles.get(best), "oracle_two": two, "oracle_all": every,
               "aa_oracle": _aa_oracle(ps),
               "oracle_wins": ", ".join(f"{lab} {n}"
                                        for lab, n in sorted(wins.items(), key=lambda kv: -kv[1])),
               "no_lossless": fallback}
        for lab in pools:
            row[lab] = _speedup(ps, lab) if lab in ran else absent
        rows.append(row)
    return pd.DataFrame(rows)


def _aa_oracle(prompts: list[dict[str, dict]]) -> float | None:
    """Summed vanilla wall over the summed faster of vanilla and its A/A twin per prompt (None
    without the pair): the gain an oracle gets from noise alone when it picks between two runs of
    the same decoder."""
    if any(AA_LABEL not in p for p in prompts):
        return None
    base = sum(p["vanilla"]["wall_time"] for p in prompts)
    return base / sum(min(p["vanilla"]["wall_time"], p[AA_LABEL]["wall_time"]) for p in prompts)


def calibration_rows(runs: dict[str, list[dict]]) -> pd.DataFrame:
    """study.calibration's table: the pool's acceptance calibration over prompts, one row per
    (decoder label, source, depth) of the records' ``extra.pool_calibration`` (per call: nodes
    ``tested``, their mean ``predicted`` acceptance, the ``observed`` acceptance rate): ``tested``
    summed, ``predicted`` and ``observed`` as ``tested``-weighted means (pooled nodes, not a mean of
    per-prompt rates), ``gap`` = observed - predicted, and ``se``, the binomial standard error of
    the observed rate were the nodes independent draws at the predicted probability. Empty (same
    columns) when no record carries a calibration (no pool has run)."""
    acc: dict[tuple, list[float]] = {}
    for recs in runs.values():
        for r in recs:
            extra = r.get("extra") if isinstance(r.get("extra"), dict) else {}
            for c in extra.get("pool_calibration") or []:
                n = int(c["tested"])
                if n <= 0:
                    continue
                a = acc.setdefault((r["decoder"], str(c["source"]), int(c["depth"])), [0, 0.0, 0.0, 0])
                a[0] += n
                a[1] += n * float(c["predicted"])
                a[2] += n * float(c["observed"])
                a[3] += 1
    rows = []
    for (lab, src, depth), (n, pred, obs, calls) in sorted(acc.items()):
        p, o = pred / n, obs / n
        rows.append({"decoder": lab, "source": src, "depth": depth, "calls": calls, "tested": n, "predicted": p,
                     "observed": o, "gap": o - p, "se": (p * (1 - p) / n) ** 0.5})
    return pd.DataFrame(rows, columns=["decoder", "source", "depth", "calls", "tested", "predicted", "observed",
                                       "gap", "se"])


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
