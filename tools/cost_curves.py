"""Keep the cost curve of a host whose benchmark records stay committed, before another host remeasures it.

Rule ``cost_curve`` measures T(q) on the machine it runs on and writes one file,
``<results root>/cross/raw/cost_curve.jsonl``. A benchmark record is read only against a curve
of its own hardware (``common.cost.cost_of``), so when the rule reruns on a new host the
records of the old one would lose their limit columns, or (prompt decoding's hardware-aware
tree size) stop rendering. ``keep`` copies each device's records of the current file to
``cross/raw/cost_curves/<host>.jsonl``; the artifacts read those beside the rule's own file,
which wins for a device both hold (``common.cost.read_cost_curves``):

    python tools/cost_curves.py keep          # before rerunning cost_curve on another host
    python tools/cost_curves.py list          # the curves kept, with T(8)/T(1) of each path
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.errors import UserError, cli_main  # noqa: E402
from common.paths import atomic_write  # noqa: E402
from common.records import read_jsonl  # noqa: E402


def host_slug(device: str) -> str:
    """A file name for a record's ``device`` line: lower case, runs of anything but letters,
    digits and dots made one ``-`` (``cpu: AMD EPYC (family 26 model 2) (2 threads), torch
    2.13.0+cpu`` -> ``cpu-amd-epyc-family-26-model-2-2-threads-torch-2.13.0-cpu``)."""
    return re.sub(r"[^a-z0-9.]+", "-", device.lower()).strip("-.")


def keep(results_root: Path) -> list[Path]:
    """Copy each device's records of ``cross/raw/cost_curve.jsonl`` to ``cross/raw/cost_curves/``
    (replacing that host's earlier copy: the rule's file is its latest measurement)."""
    src = results_root / "cross" / "raw" / "cost_curve.jsonl"
    if not src.is_file():
        raise UserError(f"{src} does not exist: run rule cost_curve first (nothing to keep)")
    records = read_jsonl(src)
    if not records or any(not r.get("device") for r in records):
        raise UserError(f"{src} has no records, or records without a device: not a cost curve")
    out = []
    for device in dict.fromkeys(r["device"] for r in records):
        dst = results_root / "cross" / "raw" / "cost_curves" / f"{host_slug(device)}.jsonl"
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r) + "\n" for r in records if r["device"] == device)
        atomic_write(dst, lambda tmp, text=text: tmp.write_text(text))
        print(f"kept {device} -> {dst}")
        out.append(dst)
    return out


def listing(results_root: Path) -> list[str]:
    """One line per curve the artifacts read: its file, device, code version and T(8)/T(1) per path."""
    raw = results_root / "cross" / "raw"
    lines = []
    for p in [raw / "cost_curve.jsonl", *sorted((raw / "cost_curves").glob("*.jsonl"))]:
        records = read_jsonl(p) if p.is_file() else []
        for device in dict.fromkeys(r.get("device") for r in records):
            recs = [r for r in records if r.get("device") == device]
            at8 = ", ".join(f"{r.get('forward_path', 'stock')} T(8)/T(1) {r['ratio']:.2f}"
                            for r in sorted(recs, key=lambda r: r.get("forward_path", "stock")) if int(r["q"]) == 8)
            codes = "/".join(sorted({str(r.get("code_version")) for r in recs}))
            lines.append(f"{p.relative_to(results_root)}: {device} (code {codes}): {at8 or 'no q=8'}")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["keep", "list"])
    ap.add_argument("--results-root", type=Path, default=ROOT / "results",
                    help="the profile's results root (default: results)")
    a = ap.parse_args(argv)
    if a.cmd == "keep":
        keep(a.results_root)
    else:
        print("\n".join(listing(a.results_root)) or "no cost curve")


if __name__ == "__main__":
    cli_main(main)
