"""Checkpoint identity: what a trained component is tied to, and reading a finished one.

A checkpoint written by :func:`common.training.loop.train` holds the module, its training state and
an ``identity`` (the config it was trained with, the caller's ``meta``, the number of
examples). This module is what every reader needs (decoders loading trained heads, tools,
tests) without the training loop: the base model's :func:`fingerprint`, where a run keeps its
state (:func:`run_path`), :func:`read_trained` / :func:`load_trained` (refusing unfinished
runs and other models) and :func:`save_trained` (an untrained component stored as finished).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from .checks import differences
from .errors import UserError
from .paths import atomic_write, load_or_error


def run_path(ckpt_path: Path) -> Path:
    """Where a run keeps its latest state: beside the final checkpoint, under a name no rule
    declares. Snakemake deletes a job's outputs when the job starts, so a training interrupted
    and rerun through the workflow still finds its state here and resumes; the final
    checkpoint is published (hard-linked) from it when the run ends."""
    ckpt_path = Path(ckpt_path)
    return ckpt_path.with_name(ckpt_path.name + ".run")


def publish(work: Path, ckpt_path: Path) -> None:
    """Make the finished run's state the final checkpoint, atomically (a hard link: no copy of
    what may be gigabytes of optimizer state; a copy where links are not possible)."""
    tmp = ckpt_path.with_name(ckpt_path.name + ".link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(work, tmp)
    except OSError:
        shutil.copyfile(work, tmp)
    os.replace(tmp, ckpt_path)


def fingerprint(model) -> dict:
    """What a trained component is tied to: a checkpoint made for another base model (name,
    depth, width or vocabulary) is refused when loaded."""
    c = model.config
    return {"base": Path(str(c.name_or_path)).name, "layers": c.num_hidden_layers,
            "hidden": c.hidden_size, "vocab": c.vocab_size}


def read_trained(ckpt_path: Path, hint: str = "train it first") -> dict:
    """The state of a finished checkpoint (``identity``, ``module``, ...), read once.

    A missing, unfinished, truncated or foreign file is one UserError naming it and, after
    ``hint`` (how to train it), what to do; nothing is loaded."""
    ckpt_path = Path(ckpt_path)
    if not ckpt_path.is_file() and run_path(ckpt_path).is_file():
        raise UserError(f"checkpoint {ckpt_path} is from an unfinished run ({run_path(ckpt_path)}); "
                        "rerun training to resume it")
    if not ckpt_path.is_file():
        raise UserError(f"checkpoint {ckpt_path} does not exist; {hint}")
    # mapped: callers often read only the metadata
    state = load_or_error(ckpt_path, lambda p: torch.load(p, weights_only=False, map_location="cpu", mmap=True),
                          "checkpoint", f"delete it, then {hint}")
    identity = state.get("identity") if isinstance(state, dict) else None
    if not isinstance(identity, dict) or "meta" not in identity or not isinstance(state.get("module"), dict):
        raise UserError(f"{ckpt_path} is not a checkpoint written by common.training.loop; delete it, then {hint}")
    if not state.get("done"):
        raise UserError(f"checkpoint {ckpt_path} is from an unfinished run; rerun training to resume it")
    return state


def check_meta(state: dict, want: dict, what: str, fix: str = "train one for this model") -> None:
    """Refuse a checkpoint state (:func:`read_trained`) made for another model or setting: one
    line naming ``what`` (e.g. "EAGLE head at DIR") and the keys that differ, never both
    identities whole (one with a teacher key runs past a thousand characters)."""
    meta = state["identity"]["meta"]
    if meta != want:
        found = meta if isinstance(meta, dict) else {"meta": meta}
        raise UserError(f"{what} was trained for another model or setting ({differences(found, want)}); {fix}")


def load_trained(module: torch.nn.Module, ckpt, meta: dict | None = None) -> dict:
    """Load a finished checkpoint (a path, or a state from :func:`read_trained`) into
    ``module``; returns its identity (config, meta). ``meta`` must match the stored one."""
    state = ckpt if isinstance(ckpt, dict) else read_trained(ckpt)
    where = "checkpoint" if isinstance(ckpt, dict) else f"checkpoint {ckpt}"
    if meta is not None:
        check_meta(state, meta, where)
    misfit = _misfit(module.state_dict(), state["module"])
    if misfit:  # load_state_dict would raise a page-long RuntimeError
        raise UserError(f"{where} holds weights that do not fit this {type(module).__name__} ({misfit}); "
                        "retrain it for this model")
    module.load_state_dict(state["module"])
    module.eval()
    return state["identity"]


def _misfit(have: dict, got: dict) -> str:
    """The first tensor a stored state dict lacks, adds or shapes otherwise ("" when it fits)."""
    for k, t in have.items():
        if k not in got:
            return f"no tensor {k!r}"
        if not isinstance(got[k], torch.Tensor) or tuple(got[k].shape) != tuple(t.shape):
            shape = list(got[k].shape) if isinstance(got[k], torch.Tensor) else type(got[k]).__name__
            return f"{k!r} is {shape}, not {list(t.shape)}"
    extra = [k for k in got if k not in have]
    return f"unexpected tensor {extra[0]!r}" if extra else ""


def save_trained(module: torch.nn.Module, ckpt_path: Path, meta: dict) -> None:
    """Store ``module`` as a finished checkpoint without training it (random components for
    tests of the decoders that load them)."""
    ckpt_path = Path(ckpt_path)
    ckpt_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(ckpt_path, lambda tmp: torch.save({"identity": {"config": None, "meta": meta, "n_examples": 0},
                                                    "module": module.state_dict(), "step": 0, "log": [], "done": True},
                                                   tmp))
