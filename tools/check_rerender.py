"""Re-render every artifact from the committed raw records and fail on any change in a table.

    .venv/bin/python tools/check_rerender.py             # snakemake -j2 all --forceall, then compare
    .venv/bin/python tools/check_rerender.py --cores 4

A table (``results/<package>/tables/<id>.{md,csv}``, and ``results/SUMMARY.md`` made from them) must be exactly what the workflow makes
from the raw records next to it: a table left over from older records, or from an older
notebook, is the drift this check exists to catch. It snapshots every table, re-renders every
artifact (without ``rerun=true``, so no experiment runs: the raw records are inputs), and
compares. The data behind each figure is its table: every artifact that draws a figure writes
one (checked here too), so the PNG bytes (which depend on fonts and the matplotlib version)
and the executed notebooks (timestamps, kernel metadata) are left out of the comparison.

CSV cells compare as numbers where both sides parse as numbers, to a relative 1e-9: the last
bits of a float sum may differ between CPUs, a changed table differs in far more. Markdown
compares line by line. Exit status 1 and one ``error:`` line (then the differences) on any
change; the re-rendered files stay in place, so ``git diff results/`` shows them.
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
REL_TOL = 1e-9


def snapshot(results: Path) -> dict[str, str]:
    """Every table under ``results`` (``<package>/tables/*.md|csv``) and the summary made from
    them (``SUMMARY.md``): path relative to ``results`` -> text."""
    files = [p for p in sorted(results.glob("*/tables/*")) if p.suffix in (".md", ".csv")]
    files += [p for p in [results / "SUMMARY.md"] if p.is_file()]
    return {str(p.relative_to(results)): p.read_text() for p in files}


def _same_cell(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) and math.isnan(y):
        return True
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=1e-12)


def csv_differences(name: str, old: str, new: str, limit: int = 5) -> list[str]:
    """Cells of two CSV texts that differ (numbers to a relative 1e-9), at most ``limit`` named."""
    a, b = list(csv.reader(io.StringIO(old))), list(csv.reader(io.StringIO(new)))
    if a[:1] != b[:1]:
        return [f"{name}: columns {a[:1]} -> {b[:1]}"]
    if len(a) != len(b):
        return [f"{name}: {len(a) - 1} rows -> {len(b) - 1}"]
    out = []
    header = a[0] if a else []
    for i, (ra, rb) in enumerate(zip(a[1:], b[1:]), start=1):
        for j, (x, y) in enumerate(zip(ra, rb)):
            if not _same_cell(x, y):
                col = header[j] if j < len(header) else j
                out.append(f"{name}: row {i}, column {col!r}: {x!r} -> {y!r}")
    more = len(out) - limit
    return out[:limit] + ([f"{name}: ... and {more} more cells"] if more > 0 else [])


def md_differences(name: str, old: str, new: str, limit: int = 5) -> list[str]:
    """Lines of two markdown tables that differ."""
    a, b = old.splitlines(), new.splitlines()
    out = [f"{name}: line {i + 1}: {x!r} -> {y!r}" for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) != len(b):
        out.append(f"{name}: {len(a)} lines -> {len(b)}")
    more = len(out) - limit
    return out[:limit] + ([f"{name}: ... and {more} more lines"] if more > 0 else [])


def table_differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What a re-render changed: tables gone, tables new, and changed cells or lines."""
    out = [f"{p}: no longer written by the re-render" for p in sorted(set(before) - set(after))]
    out += [f"{p}: written by the re-render but not committed" for p in sorted(set(after) - set(before))]
    for p in sorted(set(before) & set(after)):
        if before[p] != after[p]:
            diff = csv_differences if p.endswith(".csv") else md_differences
            out += diff(p, before[p], after[p])
    return out


def figures_without_table(artifacts: dict) -> list[str]:
    """Artifact ids that draw a figure but write no table (their data would go unchecked)."""
    return [aid for aid, spec in artifacts.items() if "figure" in spec["outputs"] and "table" not in spec["outputs"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/check_rerender.py", description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=2, help="snakemake -j (default 2)")
    ap.add_argument("--results", type=Path, default=ROOT / "results", help="results root of the embedded profile")
    a = ap.parse_args(argv)
    artifacts = yaml.safe_load((ROOT / "config" / "artifacts.yaml").read_text())
    bare = figures_without_table(artifacts)
    if bare:
        print(f"error: figures without a table (their data is unchecked): {', '.join(bare)}", file=sys.stderr)
        return 1
    before = snapshot(a.results)
    t0 = time.monotonic()
    # --forceall: a fresh clone's mtimes say nothing about which render is stale; rerun stays
    # false, so the raw records are inputs and no experiment can run.
    cmd = [str(Path(sys.executable).parent / "snakemake"), f"-j{a.cores}", "all", "--forceall", "--quiet", "rules"]
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        print(f"error: the re-render failed ({' '.join(cmd)} exited {proc.returncode}; logs under .cache/logs/)",
              file=sys.stderr)
        return 1
    diffs = table_differences(before, snapshot(a.results))
    took = time.monotonic() - t0
    if diffs:
        print(f"error: re-rendering from the committed raw records changed {len({d.split(':')[0] for d in diffs})} "
              f"table file(s); commit the re-rendered tables (git diff {a.results})", file=sys.stderr)
        print("\n".join(diffs), file=sys.stderr)
        return 1
    print(f"re-render check: {len(before)} table files unchanged ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
