"""Keep the trained components a committed benchmark decoded with, and put them back.

A benchmark record is only as reproducible as the components it loaded. The trainings are
seeded, but a training stopped by its flat rule can stop at another step on other hardware
(the prompt tokens did: 600 steps on this CPU, 1000 on an H100), and a session's cache does
not outlive it. So the finished checkpoints behind committed benchmarks are kept in git,
without their optimizer state, under ``results/<package>/checkpoints/<profile>/``, mirroring
``.cache/components/<profile>/``:

    python tools/checkpoints.py keep cross firp_maps/main medusa   # cache -> results (stripped)
    python tools/checkpoints.py restore cross                      # results -> cache

``restore`` never overwrites a checkpoint that is already in the cache, and gives the copies a
fresh time stamp, so that ``--rerun-triggers mtime`` finds them newer than the corpora. The
benchmark commands that read them (``snakemake -n -p`` prints each) can then run on their own;
Snakemake itself would retrain them where the cache lacks their upstream files (the teacher).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.errors import UserError  # noqa: E402
from common.models import cache_root  # noqa: E402
from common.training import read_trained  # noqa: E402

# what only a resumed run reads: the optimizer's state, and (restore_best) the best evaluation's
# weights and the last step's, which a finished checkpoint's "module" already publishes one of
RUN_STATE = ("optimizer", "scheduler", "best", "last_module")


def kept_dir(package: str, profile: str, root: Path = ROOT) -> Path:
    return root / "results" / package / "checkpoints" / profile


def keep(package: str, components: list[str], profile: str, root: Path = ROOT) -> None:
    """Copy each component's finished ``*.pt`` (optimizer state dropped) and its ``*.json``."""
    for comp in components:
        src = cache_root() / "components" / profile / comp
        files = sorted(src.glob("*.pt"))
        if not files:
            raise UserError(f"{src} holds no checkpoint (*.pt); train it first")
        dst = kept_dir(package, profile, root) / comp
        dst.mkdir(parents=True, exist_ok=True)
        for f in files:
            state = dict(read_trained(f))  # refuses an unfinished run
            for k in RUN_STATE:
                state.pop(k, None)
            tmp = dst / (f.name + ".partial")
            torch.save(state, tmp)
            os.replace(tmp, dst / f.name)
            print(f"kept {f} -> {dst / f.name} ({(dst / f.name).stat().st_size / 2**20:.1f} MiB)")
        for f in sorted(src.glob("*.json")):  # what decoding reads beside it (Medusa's searched trees), stats
            shutil.copyfile(f, dst / f.name)


def restore(package: str, profile: str, root: Path = ROOT) -> None:
    base = kept_dir(package, profile, root)
    if not base.is_dir():
        raise UserError(f"{base} does not exist; valid: a package with kept checkpoints "
                        f"({', '.join(sorted(p.parent.parent.name for p in root.glob('results/*/checkpoints/*'))) or 'none'})")
    for f in sorted([*base.rglob("*.pt"), *base.rglob("*.json")]):
        dst = cache_root() / "components" / profile / f.relative_to(base)
        if dst.exists():
            print(f"kept in the cache already: {dst}")
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst.with_name(dst.name + ".partial"))
        os.replace(dst.with_name(dst.name + ".partial"), dst)
        print(f"restored {dst}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keep", help="cache -> results/<package>/checkpoints/<profile>")
    k.add_argument("package")
    k.add_argument("components", nargs="+", help="folders under .cache/components/<profile>/")
    r = sub.add_parser("restore", help="results/<package>/checkpoints/<profile> -> cache")
    r.add_argument("package")
    for p in (k, r):
        p.add_argument("--profile", default="embedded")
    a = ap.parse_args(argv)
    try:
        keep(a.package, a.components, a.profile) if a.cmd == "keep" else restore(a.package, a.profile)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
