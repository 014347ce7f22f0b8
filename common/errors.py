"""One error type for bad user input, and the CLI wrapper that turns it into one line.

Every entry point (``python -m ...``, Snakemake rule scripts) runs under :func:`cli_main`,
so an unknown model, dataset, decoder, profile or an out-of-range setting ends with a single
``error: ...`` line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import signal
import sys
import threading
from typing import Callable, Iterable


class UserError(Exception):
    """Bad input from the user: says what is wrong and what would be valid."""


def unknown(kind: str, name: str, valid: Iterable[str]) -> UserError:
    """Build the standard 'unknown X' error naming the valid choices."""
    return UserError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")


def check_range(name: str, value, lo=None, hi=None) -> None:
    """Raise UserError unless lo <= value <= hi (either bound may be None)."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise UserError(f"{name}={value} is out of range; valid: {bounds}")


def exit_on_sigterm():
    """Turn SIGTERM into ``SystemExit(143)`` so ``finally`` blocks and context managers run.

    Python's default SIGTERM action ends the process at once: temporary files, worker pools
    and their rendezvous folders were left behind. Only the main thread may install handlers,
    and a handler someone else installed is kept. Returns the handler replaced (to restore),
    or None when nothing was installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return None
    signal.signal(signal.SIGTERM, _raise_exit)
    return previous


def _raise_exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def check_layers(layers, depth: int | None = None, name: str = "layer", lo: int = 1) -> None:
    """Raise UserError unless every layer is an int in ``lo..depth-1`` (an exit strictly inside
    the model by default). ``depth=None`` checks only the type and the lower bound."""
    for layer in layers:
        if not isinstance(layer, int) or isinstance(layer, bool) or layer < lo or \
                (depth is not None and layer >= depth):
            hi = "d-1" if depth is None else depth - 1
            has = "" if depth is None else f" (model has {depth})"
            raise UserError(f"{name}={layer!r} is outside the model's layers; valid: {lo}..{hi}{has}")


def cli_main(fn: Callable[[], None]) -> None:
    """Run ``fn``; on UserError print one line and exit 2. SIGTERM unwinds (cleans up) first."""
    previous = exit_on_sigterm()
    try:
        fn()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        if previous is not None:  # called in-process (tests): leave the caller's handler as it was
            signal.signal(signal.SIGTERM, previous)
