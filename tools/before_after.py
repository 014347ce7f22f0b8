"""Before/after tables of two commits' records: what a retraining changed, from the records only.

    python tools/before_after.py BEFORE AFTER [--out note.md]

For every learning curve (``results/**/*_curve.jsonl``) that differs between the two commits:
the held-out top-1 of the weights it kept (the evaluation at its stats' ``chosen_step`` where
early stopping kept the best one, else the last; the first head's or first distance's where a
component predicts several; PPD's heads: their match rate), the examples and steps it trained
for, and why it stopped (its ``*_stats.json``). For every benchmark record file
(``results/**/raw/*.jsonl`` whose records carry ``common.harness.report.BENCH_FIELDS``) that differs:
each decoder's mean accepted length (tau) and speedup over ``vanilla`` in the same file, and
the device that ran each side (a speedup moves with the machine too). Both sides are read with ``git show`` so nothing in the working tree
is touched. A file absent at one commit leaves that side blank.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from common.harness.report import BENCH_FIELDS, summarize, to_markdown  # noqa: E402


REPO = ROOT  # the repository read (--repo; tests point it at a scratch one)


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


def show(rev: str, path: str) -> str | None:
    """The file's text at ``rev``, or None where it does not exist there."""
    out = git("show", f"{rev}:{path}")
    return out.stdout if out.returncode == 0 else None


def jsonl(text: str | None) -> list[dict]:
    return [] if text is None else [json.loads(line) for line in text.splitlines() if line.strip()]


def changed(before: str, after: str) -> list[str]:
    return sorted(p for p in git("diff", "--name-only", before, after, "--", "results").stdout.splitlines()
                  if p.endswith(".jsonl"))


def kept_top1(curve: list[dict], stats: dict) -> float | None:
    """The held-out top-1 of the evaluation whose weights the component kept (``chosen_step``
    of its stats; the last evaluation where there is none), the first head's where there are
    several."""
    if not curve:
        return None
    step = stats.get("chosen_step")
    row = next((r for r in curve if r.get("step") == step), curve[-1])
    v = row.get("heldout_top1", row.get("heldout_match"))
    return v[0] if isinstance(v, list) else v


def components(before: str, after: str, paths: list[str]) -> pd.DataFrame:
    rows = []
    for p in (p for p in paths if p.endswith("_curve.jsonl")):
        b, a = jsonl(show(before, p)), jsonl(show(after, p))
        if not (a and "step" in a[-1]) and not (b and "step" in b[-1]):
            continue  # not a learning curve (the cost curve)
        stats_path = p.removesuffix("_curve.jsonl") + "_stats.json"
        stats_b, stats = (json.loads(show(rev, stats_path) or "{}") for rev in (before, after))
        rows.append({"component": p.removeprefix("results/").removesuffix("_curve.jsonl"),
                     "top1_before": kept_top1(b, stats_b), "top1_after": kept_top1(a, stats),
                     "examples_before": b[-1].get("examples_seen") if b else None,
                     "examples_after": a[-1].get("examples_seen") if a else None,
                     "steps_after": a[-1].get("step") if a else None, "stopped_after": stats.get("stopped", "")})
    return pd.DataFrame(rows)


def benchmarks(before: str, after: str, paths: list[str]) -> pd.DataFrame:
    rows = []
    for p in (p for p in paths if not p.endswith("_curve.jsonl")):
        sides = {}
        for side, rev in (("before", before), ("after", after)):
            recs = jsonl(show(rev, p))
            if recs and BENCH_FIELDS <= set(recs[0]):
                s = summarize(recs).set_index("decoder")
                sides[side] = (s, recs[0].get("device", ""))
        if not sides:
            continue
        names = list(dict.fromkeys(d for s, _ in sides.values() for d in s.index))
        for d in names:
            row = {"records": p.removeprefix("results/"), "decoder": d}
            for side in ("before", "after"):
                s = sides.get(side, (None, ""))[0]
                has = s is not None and d in s.index
                row[f"tau_{side}"] = s.loc[d, "mean_accepted_length"] if has else None
                row[f"speedup_{side}"] = s.loc[d, "speedup"] if has and "speedup" in s else None
            row["device_before"] = sides.get("before", (None, ""))[1]
            row["device_after"] = sides.get("after", (None, ""))[1]
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out", type=Path, help="write the markdown here (default: stdout)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the repository to read (default: this one)")
    args = ap.parse_args(argv)
    global REPO
    REPO = args.repo
    for rev in (args.before, args.after):
        if git("rev-parse", "--verify", "-q", f"{rev}^{{commit}}").returncode:
            sys.exit(f"error: {rev!r} is not a commit of this repository; valid: a branch, tag or commit hash")
    paths = changed(args.before, args.after)
    text = (f"# Before ({args.before}) / after ({args.after})\n\n## Trained components: held-out top-1 "
            f"of the kept weights (chosen_step)\n\n{to_markdown(components(args.before, args.after, paths))}\n\n"
            f"## Benchmarks: mean accepted length and speedup over vanilla in the same run\n\n"
            f"{to_markdown(benchmarks(args.before, args.after, paths))}\n")
    if args.out:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)
    else:
        print(text)


if __name__ == "__main__":
    main()
