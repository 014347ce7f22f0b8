"""Where things live on disk (the repository root and the git-ignored cache), and writing
there atomically.

A bottom-layer module (no torch, no transformers): records, the model registry, trainers and
the workflow all name these folders, so they live apart from model loading.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, TypeVar

from .errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
REASON_CHARS = 64  # of a library's own message: enough to tell truncation from garbage, short enough for one line


def cache_root() -> Path:
    """Git-ignored folder for converted checkpoints, trained components and resume logs
    (``REPRO_CACHE_DIR`` moves it, e.g. for tests)."""
    return Path(os.environ.get("REPRO_CACHE_DIR", REPO_ROOT / ".cache"))


def checkpoint_dir(name: str) -> Path:
    """The folder a converted registry model ``name`` is saved in."""
    return cache_root() / "models" / name


def atomic_write(path: Path, write: Callable[[Path], None], keep: str = "the files already finished") -> None:
    """Write ``path`` through ``write(tmp)`` on a temporary file beside it, then rename, so a
    reader (or a resumed run) sees the old file or the whole new one, never part of one. A full
    disk is one UserError saying that ``keep`` stay valid; nothing is left at ``path``'s side."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"disk full while writing {path}; {keep} stay valid, free space and run again "
                            "to continue") from e
        raise


def file_sha256(path: Path) -> str:
    """The SHA-256 (hex) of a file's bytes, read in 1 MiB blocks (shards, kept weights)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_or_error(path, load: Callable[[Path], T], what: str, fix: str) -> T:
    """``load(path)``, with a missing, truncated or garbage file as one :class:`UserError` line.

    Every reader of a file this repository writes (checkpoints, datastores, shards, records)
    goes through here: the libraries' own failures on a damaged file (torch: ``RuntimeError``
    or ``UnpicklingError``, numpy: ``ValueError``, json: ``JSONDecodeError``, safetensors:
    ``SafetensorError``, ...) are tracebacks the user cannot act on. Here each becomes
    ``"<what> <path> is damaged or unreadable (<its reason, shortened>); <fix>"``; a UserError that ``load``
    raises itself (its own checks of the content) passes unchanged.

    Args:
        load: reads the file (a library's loader, plus any check of what it returned).
        what: what the file is, for the message ("EAGLE head checkpoint", "records file").
        fix: what to do, e.g. "delete it and rebuild it: python -m ...".
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} {path} does not exist; {fix}")
    try:
        return load(path)
    except UserError:
        raise
    except Exception as e:  # the loaders' failures on damaged bytes have no common base class
        raise UserError(f"{what} {path} is damaged or unreadable ({short_reason(e)}); {fix}") from e


def short_reason(e: BaseException) -> str:
    """``"<type>: <first line of the message>"``, at most :data:`REASON_CHARS` characters."""
    text = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def load_json(path, what: str, fix: str, kind: type = dict):
    """A JSON file whose top level is a ``kind`` (an object by default), through
    :func:`load_or_error`: invalid JSON, bytes that are not text, or another top level are
    one UserError naming ``path`` and ``fix``."""
    def load(p: Path):
        obj = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(obj, kind):
            raise ValueError(f"its top level is a {type(obj).__name__}, not a {kind.__name__}")
        return obj
    return load_or_error(path, load, what, fix)
