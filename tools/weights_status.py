"""Which committed benchmark records decoded weights their components no longer hold.

Records name a trained component by its cache path (``.cache/components/<profile>/medusa``), and a
later training overwrites that path: a benchmark run before a retraining keeps the old weights'
numbers under the same name. Each record also carries the content digest of what it loaded
(``components``, ``model_digest``; :func:`common.records.content_digest`). This tool compares them,
per record file and component path, with a reference (:func:`common.harness.report.weights_status`):

1. the cache's copy, where this machine's cache has the component;
2. else the weights its training's stats name (``weights_path``, ``weights_digest`` in
   ``results/<package>/raw/*_stats.json``: a fresh clone knows of a retraining without its weights);
3. else the copy kept in git (``results/<package>/checkpoints/<profile>/``, tools/keep_components.py);
4. else the weights of the record file committed last that decoded the path.

    python tools/weights_status.py [--profile embedded] [--all]

prints the stale (and unchecked) rows, or every row with ``--all``, and the record files to rerun.
A file added to a component's folder since (Medusa's ``draft_vocab.json``) changes its digest as
a retraining would; where the reference is a local copy, the tool digests it without each of its
files in turn, and a record that matches one of those decoded the same weights (``current``, with
a note). So does a REST datastore built before its meta dropped the build time: the tool digests
the folder with each committed meta of that kind in place. A reference taken from the newest
record cannot be checked that way.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.config import load_profile  # noqa: E402
from common.components.rest_datastore import META as DATASTORE_META, REBUILD  # noqa: E402
from common.errors import cli_main  # noqa: E402
from common.paths import load_json  # noqa: E402
from common.records import NOT_DECODED, content_digest, read_jsonl  # noqa: E402
from common.harness.report import decoded_components, weights_status  # noqa: E402
from common.weights_delta import kept_digest  # noqa: E402


def benchmark_runs(results: Path, root: Path = ROOT) -> dict[str, list[dict]]:
    """Every record file under ``results/<package>/raw/`` that names a trained component, by its
    path relative to ``root`` (a curve or a stats file names none and is left out)."""
    runs = {}
    for f in sorted(results.glob("*/raw/*.jsonl")):
        recs = [r for r in read_jsonl(f) if isinstance(r, dict)]
        if decoded_components(recs):
            runs[os.path.relpath(f, root)] = recs   # relpath: a results_root may lie outside the checkout
    return runs


def committed_at(files, root: Path = ROOT) -> dict[str, float]:
    """When each file was last committed (Unix seconds); files git does not know are left out."""
    out = {}
    for f in files:
        stamp = subprocess.run(["git", "log", "-1", "--format=%ct", "--", f], cwd=root, capture_output=True,
                               text=True).stdout.strip()
        if stamp:
            out[f] = float(stamp)
    return out


def trained_digests(results: Path, root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """``{path: (digest, where)}`` from the trainings' stats that name their weights
    (:func:`common.training.cli.component_main`); where two name one path, the one committed last."""
    out, when = {}, {}
    files = sorted(results.glob("*/raw/*_stats.json"))
    stamps = committed_at([os.path.relpath(f, root) for f in files], root)
    for f in files:
        # a damaged stats file would silently drop the digest it names: one error line instead
        stats = load_json(f, "training stats", "restore it from git (git checkout -- FILE) or train again")
        if not stats.get("weights_path") or not stats.get("weights_digest"):
            continue
        path, rel = os.path.normpath(stats["weights_path"]), os.path.relpath(f, root)
        if path not in out or stamps.get(rel, float("inf")) >= when[path]:
            out[path], when[path] = (stats["weights_digest"], f"stats {rel}"), stamps.get(rel, float("inf"))
    return out


def local_copy(path: str, profile: str, root: Path = ROOT) -> tuple[Path, str] | None:
    """Where this machine holds a component path's weights now: the cache's copy, else the one
    kept in git under ``results/*/checkpoints/<profile>/`` (the path below the cache's
    ``components/<profile>/``); None: neither."""
    if (root / path).exists():
        return root / path, "cache"
    parts = Path(path).parts
    rel = next((Path(*parts[i + 2:]) for i in range(len(parts) - 1) if parts[i:i + 2] == ("components", profile)), None)
    kept = sorted(root.glob(f"results/*/checkpoints/{profile}/{rel}")) if rel and rel.parts else []
    return (kept[0], f"kept {kept[0].relative_to(root)}") if kept else None


def earlier_digests(folder: Path) -> dict[str, str]:
    """``{digest of the folder without one of its files: why}``: what a record that decoded the
    folder before the file was added to it (Medusa's ``draft_vocab.json``) names."""
    if not folder.is_dir() or kept_digest(folder) != content_digest(folder):  # a kept delta: no files to leave out
        return {}
    files = [f for f in sorted(folder.rglob("*")) if f.is_file() and not any(f.match(g) for g in NOT_DECODED)]
    return {content_digest(folder, without=(str(f.relative_to(folder)),)):
            f"{f.relative_to(folder)} was added to the folder since" for f in files if len(files) > 1}


def committed_versions(pattern: str, root: Path = ROOT) -> list[bytes]:
    """The bytes of every committed version of the files matching ``pattern`` (a git pathspec
    glob relative to ``root``), newest first; none outside a git checkout."""
    log = subprocess.run(["git", "log", "--format=%H", "--name-only", "--", pattern], cwd=root,
                         capture_output=True, text=True).stdout.split()
    out, commit = [], None
    for word in log:
        if len(word) == 40 and all(c in "0123456789abcdef" for c in word):
            commit = word
            continue
        shown = subprocess.run(["git", "show", f"{commit}:{word}"], cwd=root, capture_output=True)
        if shown.returncode == 0 and shown.stdout not in out:
            out.append(shown.stdout)
    return out


def datastore_meta_digests(folder: Path, root: Path = ROOT) -> dict[str, str]:
    """``{digest: why}`` of a REST datastore folder as builders before ``0dc8821`` wrote it: their
    ``datastore.json`` carried the build time (``build_s``), so each rebuild of the same text had
    another digest. The rule's stats record (``results/*/raw/*datastore*_stats.json``) was the same
    JSON, so each committed version of it that matches this folder's meta but for ``build_s`` is a
    meta an older build of these arrays wrote: the folder's digest with it in place."""
    meta_path = folder / DATASTORE_META
    if not meta_path.is_file():
        return {}
    meta = load_json(meta_path, "REST datastore meta", REBUILD)
    out = {}
    for old in committed_versions("results/*/raw/*datastore*_stats.json", root):
        try:
            stats = json.loads(old)
        except ValueError:
            continue
        if not isinstance(stats, dict) or "build_s" not in stats or {k: v for k, v in stats.items() if k != "build_s"} != meta:
            continue
        with tempfile.TemporaryDirectory() as tmp:  # the folder with the old meta: links, no copies
            for f in folder.iterdir():
                if f.is_file() and f.name != meta_path.name:
                    (Path(tmp) / f.name).symlink_to(f.resolve())
            (Path(tmp) / meta_path.name).write_bytes(old)
            out[content_digest(Path(tmp))] = (f"datastore.json carried the build time then "
                                              f"(build_s {stats['build_s']}; the arrays are these)")
    return out


def status(profile: str, root: Path = ROOT) -> pd.DataFrame:
    """:func:`common.harness.report.weights_status` of every benchmark record file of ``profile``."""
    results = root / load_profile(None, profile).results_root
    runs = benchmark_runs(results, root)
    decoded: dict[str, set] = {}
    for recs in runs.values():
        for path, opts in decoded_components(recs).items():
            decoded.setdefault(path, set()).update(*opts.values())
    now, earlier = {}, {}
    trained = trained_digests(results, root)
    for path, digests in decoded.items():
        if (root / path).exists() or os.path.normpath(path) not in trained:
            copy = local_copy(path, profile, root)
        else:
            now[path], copy = trained[os.path.normpath(path)], None
        if copy is not None:
            now[path] = (kept_digest(copy[0]), copy[1])  # a kept model folder: the digest of what it rebuilds
            if digests - {now[path][0]}:  # only then can an added file explain a difference
                earlier[path] = {**earlier_digests(copy[0]), **datastore_meta_digests(copy[0], root)}
    return weights_status(runs, committed_at(runs, root), now, earlier)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="embedded", help="the profile whose records to check (default: embedded)")
    ap.add_argument("--all", action="store_true", help="print every row, not only the stale and unchecked ones")
    args = ap.parse_args(argv)
    table = status(args.profile)
    shown = (table if args.all else table[table.state != "current"]).copy()
    # a sweep names dozens of decoders: the first two say which component row it is
    shown["decoders"] = [d if d.count(",") < 2 else ", ".join(d.split(", ")[:2]) + f" (+{d.count(',') - 1})"
                         for d in shown.decoders]
    with pd.option_context("display.max_colwidth", 90, "display.width", 250):
        print(shown.drop(columns="path").to_string(index=False) if len(shown)
              else "every record decoded its components' reference weights")
    stale = sorted(set(table[table.state == "stale"].run))
    print(f"\n{len(table)} (record file, component) pairs: {int((table.state == 'current').sum())} current, "
          f"{len(table[table.state == 'stale'])} stale, {int((table.state == 'unchecked').sum())} unchecked")
    if stale:
        print("rerun (their benchmarks decoded older weights): " + ", ".join(stale))


if __name__ == "__main__":
    cli_main(main)
