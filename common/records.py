"""Raw results as JSONL, written atomically so a half-written file never looks complete."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable


class JsonlWriter:
    """Append records to ``path.partial``; :meth:`commit` renames it to ``path``.

    Used as a context manager: on an exception the partial file is removed.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(self.path.name + ".partial")
        self.fh = open(self.tmp, "w")

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
