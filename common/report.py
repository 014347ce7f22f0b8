"""From raw benchmark records to summary tables (used by ``common.bench`` and the notebooks).

Which averages: ``tokens_per_s`` is a ratio of totals (every new token of a decoder over its
summed wall time), so prompts with long answers weigh more than a mean of per-prompt rates
would let them; ``speedup`` is that ratio over vanilla's on the same prompts in the same run.
``mean_accepted_length`` is likewise total new tokens over total target forwards (steps).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

# What summarize reads from every record.
BENCH_FIELDS = {"question_id", "decoder", "tokens", "new_tokens", "steps", "wall_time", "peak_mem_bytes"}


def summarize(records: list[dict], baseline: str = "vanilla") -> pd.DataFrame:
    """One row per decoder: prompts, tokens/s, speedup, mean accepted length, peak memory,
    and whether every output equals the baseline's on the same prompt."""
    df = pd.DataFrame(records)
    base = df[df.decoder == baseline].set_index("question_id")["tokens"] if baseline in set(df.decoder) else None
    rows = []
    for name, g in df.groupby("decoder", sort=False):
        row = {
            "decoder": name,
            "prompts": len(g),
            "new_tokens": int(g.new_tokens.sum()),
            "tokens_per_s": g.new_tokens.sum() / g.wall_time.sum(),
            "mean_accepted_length": g.new_tokens.sum() / g.steps.sum(),
            "peak_mem_mib": g.peak_mem_bytes.max() / 2**20,
        }
        if base is not None:
            same = [t == base.get(q) for q, t in zip(g.question_id, g.tokens)]
            row["identical_to_vanilla"] = f"{sum(same)}/{len(same)}"
        rows.append(row)
    out = pd.DataFrame(rows)
    if base is not None:
        out["speedup"] = out.tokens_per_s / out.loc[out.decoder == baseline, "tokens_per_s"].iloc[0]
    return out


def cost_of(curve: list[dict], forward_path: str = "fast"):
    """``q -> T(q) / T(1)`` from :mod:`common.cost` records of one forward path: linear in
    ``q`` between measured points (beyond the last, along the last segment)."""
    pts = sorted((int(r["q"]), float(r["ms"])) for r in curve if r.get("forward_path", "stock") == forward_path)
    if not pts or pts[0][0] != 1:
        raise ValueError(f"the cost curve has no q=1 record for forward path {forward_path!r}")
    t1 = pts[0][1]

    def ratio(q: float) -> float:
        if len(pts) == 1:
            return 1.0
        for (qa, ta), (qb, tb) in zip(pts, pts[1:]):
            if q <= qb or (qb, tb) == pts[-1]:
                return (ta + (q - qa) * (tb - ta) / (qb - qa)) / t1
        raise AssertionError
    return ratio


def limits(records: list[dict], curve: list[dict], baseline: str = "vanilla") -> pd.DataFrame:
    """The hardware limit of each tree-verified decoder, beside what it reached.

    ``step_cost`` is the mean over its verification steps (the prefill excluded) of
    ``T(q) / T(1)`` on the machine's cost curve, ``q`` being the step's verified positions
    (proposed tokens + the root + injected positions, in full-forward equivalents); ``limit = tau * T(1) / T(step)`` with ``tau`` its mean accepted
    length: the speedup it would reach if a step cost only its verification forward. ``pct_of_limit``
    = measured speedup / limit: below 100% is the price of proposing (drafts, heads) and of
    everything around the forward. Decoders that record no per-step proposals (``vanilla``:
    limit 1; transformers' own, pipelined workers) get blanks.
    """
    df = pd.DataFrame(records)
    paths = set(df.get("forward_path", pd.Series(["stock"])).fillna("stock"))
    if len(paths) != 1:
        raise ValueError(f"records of several forward paths ({sorted(paths)}) cannot share one cost curve")
    ratio = cost_of(curve, paths.pop())
    summary = summarize(records, baseline).set_index("decoder")
    rows = []
    for name, g in df.groupby("decoder", sort=False):
        proposed = [r.get("proposed") for r in g.extra] if "extra" in g else [None]
        if name == baseline:
            cost = 1.0
        elif all(p is not None for p in proposed):
            # p[0] is the prefill; positions injected into the forward (prompt tokens, pseudo
            # states, recorded in full-forward equivalents) count with the tree's
            injected = [r.get("injected") or [0.0] * len(p) for r, p in zip(g.extra, proposed)]
            qs = [n + 1 + x for p, inj in zip(proposed, injected) for n, x in zip(p[1:], inj[1:])]
            cost = sum(map(ratio, qs)) / len(qs) if qs else float("nan")
        else:
            rows.append({"decoder": name, "step_cost": None, "limit": None, "pct_of_limit": None})
            continue
        tau = summary.loc[name, "mean_accepted_length"]
        limit = tau / cost
        rows.append({"decoder": name, "step_cost": cost, "limit": limit,
                     "pct_of_limit": 100 * summary.loc[name, "speedup"] / limit})
    return pd.DataFrame(rows)


def provenance(records: list[dict]) -> dict:
    """Model, data, profile and hardware named by the records (each must be unique)."""
    df = pd.DataFrame(records)
    keys = ["model", "dataset", "profile", "device", "dtype", "max_new_tokens", "code_version"]
    return {k: ", ".join(sorted(map(str, df[k].unique()))) for k in keys if k in df}


def share(flags: Iterable[bool]) -> str:
    """'7/9' for a list of comparisons that should each hold."""
    flags = [bool(f) for f in flags if f is not None and not (isinstance(f, float) and np.isnan(f))]
    return f"{sum(flags)}/{len(flags)}"


def trend(what: str, ours: Iterable[bool], paper: Iterable[bool] | None = None) -> str:
    """One computed line: how often a comparison holds in the paper's numbers and in ours
    (``paper`` None: the paper states it as a claim, with no numbers to count)."""
    ours = share(ours)
    n_o, d_o = map(int, ours.split("/"))
    verdict = ("holds" if n_o == d_o else "mostly holds" if 2 * n_o > d_o else "does not hold") if d_o else "untested"
    if paper is None:
        return f"{what}: ours {ours} -> the paper's claim {verdict} here"
    paper = share(paper)
    n_p, d_p = map(int, paper.split("/"))
    return f"{what}: paper {paper}, ours {ours} -> the paper's trend {verdict} here" + (
        "" if n_p == d_p else " (the paper itself has exceptions)")


def write_table(df: pd.DataFrame, artifact_id: str, out_dir: Path, meta: dict, floatfmt: str = ".3f") -> None:
    """Write ``tables/<id>.csv`` and ``tables/<id>.md``; the markdown names its provenance."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / f"{artifact_id}.csv", index=False)
    head = "\n".join(f"- **{k}**: {v}" for k, v in meta.items())
    md = f"# {artifact_id}\n\n{head}\n\n{df.to_markdown(index=False, floatfmt=floatfmt)}\n"
    (out_dir / f"{artifact_id}.md").write_text(md)


def main(argv=None) -> None:
    """``python -m common.report RECORDS.jsonl ...``: the summary table of benchmark records."""
    from .checks import ArgumentParser
    from .errors import UserError
    from .records import read_jsonl

    ap = ArgumentParser(prog="python -m common.report",
                        description="summary per decoder of common.bench records (tokens/s, speedup, "
                                    "mean accepted length, peak memory, identical to the baseline)")
    ap.add_argument("records", nargs="+", type=Path, help="JSONL files written by common.bench")
    ap.add_argument("--baseline", default="vanilla", help="decoder the speedup is relative to")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table with provenance")
    a = ap.parse_args(argv)
    records = []
    for path in a.records:
        if not path.is_file():
            raise UserError(f"{path} is not a file; valid: a JSONL file written by common.bench")
        try:
            records += read_jsonl(path)
        except ValueError as e:
            raise UserError(f"{path} is not JSONL ({e})") from None
    missing = sorted(BENCH_FIELDS - set().union(*map(set, records))) if records else sorted(BENCH_FIELDS)
    if missing:
        raise UserError(f"{', '.join(map(str, a.records))}: no common.bench records (missing "
                        f"{', '.join(missing)}); valid: files written by python -m common.bench")
    decoders = list(dict.fromkeys(r["decoder"] for r in records))
    if a.baseline not in decoders:  # summarize would just drop the speedup column
        raise UserError(f"--baseline {a.baseline!r} is not a decoder of these records; valid: {', '.join(decoders)}")
    df = summarize(records, a.baseline)
    if a.markdown:
        print("\n".join(f"- **{k}**: {v}" for k, v in provenance(records).items()) + "\n")
        print(df.to_markdown(index=False, floatfmt=".3f"))
    else:
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    from .errors import cli_main

    cli_main(main)
