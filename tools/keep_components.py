"""Keep the trained components a committed benchmark decoded with, and put them back.

A benchmark record is only as reproducible as the components it loaded. The trainings are
seeded, but a training stopped by its flat rule can stop at another step on other hardware
(the prompt tokens did: 600 steps on this CPU, 1000 on an H100), and a session's cache does
not outlive it. So the finished checkpoints behind committed benchmarks are kept in git,
without their optimizer state, under ``results/<package>/checkpoints/<profile>/``, mirroring
``.cache/components/<profile>/``:

    python tools/keep_components.py keep cross firp_maps/main medusa   # cache -> results (stripped)
    python tools/keep_components.py restore cross                      # results -> cache

A whole-model component (a folder with ``model/model.safetensors``: the distilled draft, BiLD's
small models) is kept as its ``model/`` folder without the tensors it shares with the base model
(the target's embedding: :mod:`common.weights_delta`), in parts of at most ``--part-mib`` MiB (16: the
largest file a device call brings back, so a model trained on a lent GPU is kept the same way), and
rebuilt byte for byte on restore from the converted base model (``.cache/models/<base>/``, made by
rule ``prepare_model``); its training checkpoint (``train.pt``, the whole module and optimizer) is
not kept: no decoder reads it.

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
from common.assets.models import cache_root, checkpoint_dir  # noqa: E402
from common.records import content_digest  # noqa: E402
from common.training.loop import read_trained  # noqa: E402
from common.weights_delta import DELTA, MODEL_FILE, join, manifest_path, parts_of, read_manifest, split  # noqa: E402

# what only a resumed run reads: the optimizer's state, and (restore_best) the best evaluation's
# weights and the last step's, which a finished checkpoint's "module" already publishes one of
RUN_STATE = ("optimizer", "scheduler", "best", "last_module")
# the largest kept file of a whole model: a device call brings back files of at most 16 MiB (the
# pieces tools/device/jobs.py returns, PIECE_MIB, which passes its own size to keep)
PART_MIB = 16


def kept_dir(package: str, profile: str, root: Path = ROOT) -> Path:
    return root / "results" / package / "checkpoints" / profile


def base_model(profile: str) -> str:
    from common.config import load_profile
    return load_profile(None, profile).model


def keep_model(src: Path, dst: Path, base: str, part_mib: float = PART_MIB) -> None:
    """Keep ``src/model/`` at ``dst/model/``: every file but the weights verbatim, the weights as
    their delta against ``base``'s converted checkpoint, in parts of at most ``part_mib`` MiB; the
    folder is swapped in whole."""
    model, base_file = src / "model", checkpoint_dir(base) / MODEL_FILE
    if not base_file.is_file():
        raise UserError(f"{base_file} is missing: the base model {base} is not converted; valid: run rule "
                        f"prepare_model first, or --base naming the model {src.name} was cut from")
    tmp = dst / "model.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in sorted(model.rglob("*")):
        if f.is_file() and f.name != MODEL_FILE and not f.name.endswith(".partial"):
            (tmp / f.relative_to(model)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, tmp / f.relative_to(model))
    # the folder's digest as records name it: the kept copy (a delta) cannot be digested like the original
    m = split(model / MODEL_FILE, base_file, tmp / DELTA, base, extra={"folder_digest": content_digest(model)},
              part_bytes=int(part_mib * 2**20))
    shutil.rmtree(dst / "model", ignore_errors=True)
    os.replace(tmp, dst / "model")
    own = m["delta"]["bytes"] if "parts" in m else (dst / "model" / DELTA).stat().st_size
    pieces = f" in {len(m['parts'])} parts" if "parts" in m else ""
    print(f"kept {model} -> {dst / 'model'} ({own / 2**20:.1f} MiB{pieces} of {m['bytes'] / 2**20:.1f} MiB of weights; "
          f"{len(m['from_base'])} tensors from {base})")
    for f in sorted(src.glob("*.json")):
        shutil.copyfile(f, dst / f.name)


def keep(package: str, components: list[str], profile: str, root: Path = ROOT, base: str | None = None,
         part_mib: float = PART_MIB) -> None:
    """Copy each component's finished ``*.pt`` (optimizer state dropped) and its ``*.json``; a
    whole-model component's ``model/`` folder as :func:`keep_model` keeps it."""
    for comp in components:
        src = cache_root() / "components" / profile / comp
        if (src / "model" / MODEL_FILE).is_file():
            keep_model(src, kept_dir(package, profile, root) / comp, base or base_model(profile), part_mib)
            continue
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
    # a kept model's weights: its manifest, beside the delta or its parts
    deltas = [m.with_name(DELTA) for m in sorted(base.rglob(DELTA + ".json"))]
    weights = {manifest_path(d) for d in deltas} | set(deltas) | {p for d in deltas for p in parts_of(d)}
    files = [f for f in sorted(base.rglob("*")) if f.is_file() and f not in weights and not f.name.endswith(".partial")]
    # a model folder's weights before its other files: its config.json is the rule's output, and
    # Snakemake must not find a folder with a config but no weights
    for f in deltas:
        dst = cache_root() / "components" / profile / f.relative_to(base).with_name(MODEL_FILE)
        if dst.exists():
            print(f"kept in the cache already: {dst}")
            continue
        name = read_manifest(manifest_path(f)).get("base")  # damaged: one error line naming it
        if not isinstance(name, str):
            raise UserError(f"kept-model manifest {manifest_path(f)} names no base model; restore it from git "
                            "or keep the model again (python tools/keep_components.py keep ...)")
        base_file = checkpoint_dir(name) / MODEL_FILE
        if not base_file.is_file():
            raise UserError(f"{base_file} is missing: {f.parent} is kept against the base model {name}; valid: "
                            f"convert it first (rule prepare_model)")
        join(f, base_file, dst)
        print(f"restored {dst} (rebuilt from {f.relative_to(root)} and {name})")
    for f in files:
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
    k.add_argument("--base", default=None, help="the model a whole-model component was cut from (default: the "
                   "profile's model)")
    k.add_argument("--part-mib", type=float, default=PART_MIB, help="a whole model's delta is kept in files of at "
                   "most this many MiB (default %(default)s: the largest file a device call brings back)")
    r = sub.add_parser("restore", help="results/<package>/checkpoints/<profile> -> cache")
    r.add_argument("package")
    for p in (k, r):
        p.add_argument("--profile", default="embedded")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "keep" and not a.part_mib > 0:
            raise UserError(f"--part-mib {a.part_mib} holds nothing; valid: a positive size in MiB")
        keep(a.package, a.components, a.profile, base=a.base, part_mib=a.part_mib) if a.cmd == "keep" else restore(a.package, a.profile)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
