"""Raw results as JSONL, written atomically so a half-written file never looks complete."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable

_UMASK = os.umask(0)   # read once at import (os.umask can only be read by setting it) ...
os.umask(_UMASK)       # ... and put back at once


class JsonlWriter:
    """Append records to a temporary file beside ``path``; :meth:`commit` renames it to ``path``.

    The temporary name is unique per writer (``<name>.<random>.partial``): two runs given the
    same ``path`` once shared one ``.partial`` and interleaved into a corrupt file. Now each
    writes its own, and ``os.replace`` makes the final file one writer's complete records
    (the last to commit wins). Used as a context manager: on an exception (SIGTERM included,
    under :func:`common.errors.cli_main`) the temporary file is removed.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Same folder as the target, so the final rename is atomic (same file system).
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".partial")
        self.tmp = Path(tmp)
        os.chmod(fd, 0o666 & ~_UMASK)  # mkstemp makes it 0600; results should be readable like any file
        self.fh = os.fdopen(fd, "w")

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()

    def commit(self) -> None:
        self.fh.close()
        os.replace(self.tmp, self.path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.commit()
        else:
            self.fh.close()
            self.tmp.unlink(missing_ok=True)


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    with JsonlWriter(path) as w:
        for r in records:
            w.write(r)


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
