"""Where things live on disk: the repository root and the git-ignored cache.

A bottom-layer module (no torch, no transformers): records, the model registry, trainers and
the workflow all name these folders, so they live apart from model loading.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """Git-ignored folder for converted checkpoints, trained components and resume logs
    (``REPRO_CACHE_DIR`` moves it, e.g. for tests)."""
    return Path(os.environ.get("REPRO_CACHE_DIR", REPO_ROOT / ".cache"))


def checkpoint_dir(name: str) -> Path:
    """The folder a converted registry model ``name`` is saved in."""
    return cache_root() / "models" / name
