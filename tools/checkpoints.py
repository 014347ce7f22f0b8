"""Keep the trained components a committed benchmark decoded with, and put them back.

A benchmark record is only as reproducible as the components it loaded. The trainings are
seeded, but a training stopped by its flat rule can stop at another step on other hardware
(the prompt tokens did: 600 steps on this CPU, 1000 on an H100), and a session's cache does
not outlive it. So the finished checkpoints behind committed benchmarks are kept in git,
without their optimizer state, under ``results/<package>/checkpoints/<profile>/``, mirroring
``.cache/components/<profile>/``:

    python tools/checkpoints.py keep firp firp_maps/main medusa   # cache -> results (stripped)
    python tools/checkpoints.py restore firp                      # results -> cache

A component that is a whole model (a folder ``model/`` written by ``save_pretrained``: the
distilled draft, BiLD's small models) is kept as the tensors that differ from the base model it
was cut from (``model/delta.safetensors``; the draft's 4 trained layers are 57 MB of its 170 MB,
the rest is the base's embedding) and a manifest naming the base and a digest of every tensor
taken from it (``model/delta.json``). ``restore`` rebuilds ``model.safetensors`` from the base
(converted first: ``python -m common.models convert <name>``) and refuses a base whose tensors differ from the digests.
The run state beside such a folder (``train.pt``, optimizer included) is not kept.

``restore`` never overwrites a checkpoint that is already in the cache, and gives the copies a
fresh time stamp, so that ``--rerun-triggers mtime`` finds them newer than the corpora. The
benchmark commands that read them (``snakemake -n -p`` prints each) can then run on their own;
Snakemake itself would retrain them where the cache lacks their upstream files (the teacher).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.errors import UserError  # noqa: E402
from common.models import cache_root, checkpoint_dir  # noqa: E402
from common.training import read_trained  # noqa: E402

RUN_STATE = ("optimizer", "scheduler")  # what only a resumed run reads
WEIGHTS = "model.safetensors"
DELTA, MANIFEST = "delta.safetensors", "delta.json"
DEFAULT_BASE = "smollm2-135m-instruct"  # the embedded profile's model (config/profiles/embedded.yaml)


def kept_dir(package: str, profile: str, root: Path = ROOT) -> Path:
    return root / "results" / package / "checkpoints" / profile


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (any dtype), with its dtype and shape."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}:{hashlib.sha256(raw).hexdigest()}"


def _base_weights(base: str) -> Path:
    path = checkpoint_dir(base) / WEIGHTS
    if not path.is_file():
        raise UserError(f"base model {base!r} is not converted ({path} missing); convert it first: "
                        f"python -m common.models convert {base} (or snakemake's rule prepare_model)")
    return path


def keep_model_folder(src: Path, dst: Path, base: str) -> None:
    """``src`` (a ``save_pretrained`` folder) -> ``dst``: its small files, and its weights as the
    tensors that differ from ``base``'s (same name, dtype, shape and values are taken from it)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    own = load_file(src / WEIGHTS)
    delta, from_base = {}, {}
    with safe_open(_base_weights(base), framework="pt") as ref:
        names = set(ref.keys())
        for k, t in own.items():
            r = ref.get_tensor(k) if k in names else None
            if r is not None and r.dtype == t.dtype and r.shape == t.shape and torch.equal(r, t):
                from_base[k] = digest(t)
            else:
                delta[k] = t
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copyfile(f, dst / f.name)
    tmp = dst / (DELTA + ".partial")
    save_file(delta, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, dst / DELTA)
    (dst / MANIFEST).write_text(json.dumps({"base": base, "from_base": from_base}, indent=1) + "\n")
    mib = (dst / DELTA).stat().st_size / 2**20
    print(f"kept {src} -> {dst} ({len(delta)} own tensors, {mib:.1f} MiB; {len(from_base)} from {base})")


def restore_model_folder(kept: Path, dst: Path) -> None:
    """Rebuild ``dst/model.safetensors`` from a kept folder and its base (digests checked)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    manifest = json.loads((kept / MANIFEST).read_text())
    full = load_file(kept / DELTA)
    with safe_open(_base_weights(manifest["base"]), framework="pt") as ref:
        names = set(ref.keys())
        for k, want in manifest["from_base"].items():
            t = ref.get_tensor(k) if k in names else None
            if t is None or digest(t) != want:
                raise UserError(f"{kept}: tensor {k} of base {manifest['base']!r} is not the one it was kept "
                                f"against ({'missing' if t is None else 'different values'}); valid: the base "
                                "model the component was trained from")
            full[k] = t
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(kept.iterdir()):
        if f.is_file() and f.name not in (DELTA, MANIFEST):
            shutil.copyfile(f, dst / f.name)
    tmp = dst / (WEIGHTS + ".partial")
    save_file(full, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, dst / WEIGHTS)
    os.utime(dst / "config.json")  # the rules declare config.json: newer than the weights it stands for
    print(f"restored {dst} ({len(full)} tensors)")


def keep(package: str, components: list[str], profile: str, root: Path = ROOT, base: str = DEFAULT_BASE) -> None:
    """Copy each component's finished ``*.pt`` (optimizer state dropped) and its ``*.json``; a
    component holding a ``model/`` folder keeps that folder as its difference from ``base``."""
    for comp in components:
        src = cache_root() / "components" / profile / comp
        dst = kept_dir(package, profile, root) / comp
        if (src / "model" / "config.json").is_file():
            keep_model_folder(src / "model", dst / "model", base)
            files = []
        else:
            files = sorted(src.glob("*.pt"))
            if not files:
                raise UserError(f"{src} holds no checkpoint (*.pt) and no model/ folder; train it first")
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
    folders = sorted(m.parent for m in base.rglob(MANIFEST))
    for kept in folders:
        dst = cache_root() / "components" / profile / kept.relative_to(base)
        if (dst / WEIGHTS).exists():
            print(f"kept in the cache already: {dst}")
        else:
            restore_model_folder(kept, dst)
    for f in sorted([*base.rglob("*.pt"), *base.rglob("*.json")]):
        if any(d in f.parents for d in folders):
            continue
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
    k.add_argument("--base", default=DEFAULT_BASE,
                   help="the converted model a model/ folder is kept as a difference from (default: %(default)s)")
    r = sub.add_parser("restore", help="results/<package>/checkpoints/<profile> -> cache")
    r.add_argument("package")
    for p in (k, r):
        p.add_argument("--profile", default="embedded")
    a = ap.parse_args(argv)
    try:
        keep(a.package, a.components, a.profile, base=a.base) if a.cmd == "keep" else restore(a.package, a.profile)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
