"""Where things live on disk (the repository root and the git-ignored cache), and writing
there atomically.

A bottom-layer module (no torch, no transformers): records, the model registry, trainers and
the workflow all name these folders, so they live apart from model loading.
"""
from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Callable

from .errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent


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
