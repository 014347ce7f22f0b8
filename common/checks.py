"""Checks every entry point runs on its arguments before anything heavy loads.

Each raises :class:`~common.errors.UserError` naming what is wrong and what is valid, so a bad
device, output path or count ends in one ``error:`` line (``cli_main``) instead of a traceback
after minutes of model loading.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from .errors import UserError


def check_positive_int(name: str, value) -> None:
    """``value`` must be an int >= 1 (``None`` means "not given" and passes)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name}={value!r} is out of range; valid: an integer >= 1")


def check_device(device: str) -> torch.device:
    """A torch device string that names a device this machine has; returns the device."""
    valid = "cpu, cuda, cuda:N, mps"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"invalid device {device!r}; valid: {valid}") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r}: CUDA is not available on this machine "
                            f"(torch {torch.__version__}); valid here: cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise UserError(f"device {device!r}: this machine has {count} CUDA device(s); "
                            f"valid: cuda:0..cuda:{count - 1}")
        return dev
    if dev.type == "mps" and torch.backends.mps.is_available():
        return dev
    raise UserError(f"device {device!r} is not available on this machine; valid: {valid} (where present)")


def check_out_path(path) -> Path:
    """An output file path: not a folder, its parent a writable folder or creatable in one.

    Nothing is created; the writer makes the parent later.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--out {path} is a folder; valid: a file path (e.g. {path / 'out.jsonl'})")
    parent = path.parent
    while not parent.exists():   # the nearest existing ancestor decides whether mkdir can work
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--out {path}: {parent} is a file, not a folder; valid: a path under a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {path}: folder {parent} is not writable; valid: a path in a writable folder")
    return path


USAGE_CHARS = 160  # the usage an error line carries whole; a longer one is named by its program only


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors follow the house rule: one ``error:`` line, exit 2.

    argparse prints the usage block and ``prog: error: ...`` itself; raising UserError instead
    lets :func:`common.errors.cli_main` print one line that still carries the usage.
    """

    def error(self, message: str):
        usage = " ".join(self.format_usage().split()[1:])  # one line, without "usage:"
        if len(usage) > USAGE_CHARS:  # a long option list would bury the message: --help shows it
            usage = f"{self.prog} ..."
        raise UserError(f"{message}; usage: {usage} (--help for details)")


def differences(found: dict, want: dict, limit: int = 3, value_chars: int = 40) -> str:
    """The keys whose values differ between two identities, as ``"key: <found> there, <want> here; ..."``.

    For refusals of a file made for another model or setting: a component's identity can hold a
    teacher cache's whole key (a thousand characters and more), so the line names the differing
    keys, each value shortened to ``value_chars``, at most ``limit`` of them, never both dicts.
    """
    def short(v) -> str:
        r = repr(v)
        return r if len(r) <= value_chars else r[:value_chars - 3] + "..."
    keys = [k for k in {**found, **want} if found.get(k, _ABSENT) != want.get(k, _ABSENT)]
    parts = [f"{k}: {short(found.get(k, _ABSENT))} there, {short(want.get(k, _ABSENT))} here" for k in keys[:limit]]
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return "; ".join(parts) + more


class _Absent:
    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()
