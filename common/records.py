"""Raw results as JSONL, written atomically so a half-written file never looks complete.

Records under ``results/`` are what the tables rest on, so they must come from code someone can
check out: a writer aimed there refuses a tree whose tracked code differs from its commit (one
``error:`` line naming the files; :func:`traced_path`). An exploratory run sets
``REPRO_EXPLORATORY=1``: its records go to ``.cache/exploratory/<the same path>`` instead, and
stay out of the tables.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

from .errors import UserError
from .paths import atomic_write, cache_root, load_or_error

REPO = Path(__file__).resolve().parent.parent
EXPLORATORY_ENV = "REPRO_EXPLORATORY"

_UMASK = os.umask(0)   # read once at import (os.umask can only be read by setting it) ...
os.umask(_UMASK)       # ... and put back at once


def uncommitted_code(root: Path | None = None) -> list[str] | None:
    """Tracked files outside ``results/`` that differ from the checked-out commit (staged or
    not); None where git cannot tell (no git, not a checkout: a copy of the tree sent elsewhere)."""
    root = Path(root or REPO)
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
                             cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    # porcelain v1: two status letters, a space, the path ("old -> new" for a rename)
    return [line[3:].split(" -> ")[-1] for line in out.stdout.splitlines() if line.strip()]


def traced_path(path: Path) -> Path:
    """Where a raw record meant for ``path`` is written.

    Outside ``<repo>/results/``: ``path``. Inside it, only from a tree whose tracked code is
    committed (``code_version`` then names a commit anyone can check out); otherwise a
    :class:`~common.errors.UserError` naming the changed files, unless ``REPRO_EXPLORATORY=1``
    asks for an exploratory run, whose records go to ``<repo>/.cache/exploratory/results/<the
    rest of path>`` (said on stderr). ``CODE_VERSION`` set (a tree copied without git, which
    names its commit that way) skips the check.
    """
    path = Path(path)
    results = REPO / "results"
    try:
        rel = path.resolve().relative_to(results.resolve())
    except ValueError:
        return path
    if os.environ.get(EXPLORATORY_ENV) == "1":
        alt = REPO / ".cache" / "exploratory" / "results" / rel
        print(f"records: exploratory run ({EXPLORATORY_ENV}=1): writing {alt} instead of {path}", file=sys.stderr)
        return alt
    if os.environ.get("CODE_VERSION"):
        return path
    dirty = uncommitted_code(REPO)
    if dirty and _CLEAN_AT_START:
        # the process started on committed code (check_start): only a changed file it imported
        # since can make its records differ from that commit's; a doc edited beside the run cannot
        dirty = [f for f in dirty if f in _imported_files()]
    if dirty:
        shown = ", ".join(dirty[:10]) + (f" and {len(dirty) - 10} more" if len(dirty) > 10 else "")
        raise UserError(f"refusing to write {path}: tracked code has uncommitted changes ({shown}), so no commit "
                        f"would reproduce these records; commit them first, or set {EXPLORATORY_ENV}=1 for an "
                        f"exploratory run (records go under .cache/exploratory/)")
    return path


_CLEAN_AT_START = False  # set by check_start: this process loaded committed code


def check_start(*paths: Path | None) -> None:
    """At a run's start, before hours of work: the refusal :func:`traced_path` would give when
    the records ``paths`` (None: not written) are written, given now; and, when the tracked code
    is committed now, a note that this process's code is that commit's, so an edit made beside
    the run to a file it never imported no longer refuses its records at the end."""
    global _CLEAN_AT_START
    quiet = os.environ.get(EXPLORATORY_ENV) == "1"  # traced_path says where exploratory records go, when they are written
    for path in paths:
        if path is not None and not quiet:
            traced_path(Path(path))
    _CLEAN_AT_START = uncommitted_code(REPO) == []


def _imported_files() -> set[str]:
    """This process's imported modules' files inside the repository, relative to it (POSIX)."""
    root, out = REPO.resolve(), set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f:
            try:
                out.add(Path(f).resolve().relative_to(root).as_posix())
            except ValueError:
                pass
    return out


class JsonlWriter:
    """Append records to a temporary file beside ``path``; :meth:`commit` renames it to ``path``.

    The temporary name is unique per writer (``<name>.<random>.partial``): two runs given the
    same ``path`` once shared one ``.partial`` and interleaved into a corrupt file. Now each
    writes its own, and ``os.replace`` makes the final file one writer's complete records
    (the last to commit wins). Used as a context manager: on an exception (SIGTERM included,
    under :func:`common.errors.cli_main`) the temporary file is removed.
    """

    def __init__(self, path: Path):
        self.path = traced_path(Path(path))  # records under results/ only from committed code
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


def write_json(path: Path, obj) -> None:
    """``obj`` as indented JSON at ``path``, written atomically (under ``results/``, only from
    committed code: :func:`traced_path`)."""
    path = traced_path(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1)))


def read_jsonl(path: Path, fix: str = "rerun what wrote it (records are written whole: this one was cut or "
                                     "edited since)") -> list[dict]:
    """The records of a JSONL file, one dict per non-blank line. A missing file, a line that is
    not a JSON object, or bytes that are not text are one UserError naming the file, the line
    and ``fix``."""
    def load(p: Path) -> list[dict]:
        out = []
        with open(p, "rb") as fh:  # decoded line by line, so bytes that are no text name their line too
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line.decode("utf-8"))
                except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                    raise ValueError(f"line {n}: {e}") from e
                if not isinstance(rec, dict):
                    raise ValueError(f"line {n} is a {type(rec).__name__}, not a JSON object")
                out.append(rec)
        return out
    return load_or_error(path, load, "records file", fix)


def settings_diff(old, new, limit: int = 3) -> str:
    """The first ``limit`` keys on which two settings mappings differ, ``key: old -> new`` with
    long values cut, and how many more: an error line names what changed, not both mappings."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return "not a settings mapping"
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]

    def short(v) -> str:
        text = json.dumps(v, sort_keys=True, default=str)
        return text if len(text) <= 40 else text[:37] + "..."
    shown = ", ".join(f"{k}: {short(old.get(k))} -> {short(new.get(k))}" for k in keys[:limit])
    return shown + (f", and {len(keys) - limit} more" if len(keys) > limit else "")


class ResumeLog:
    """A run's completed units of work, so an interrupted run continues where it stopped.

    A JSONL file: a header ``{"identity": ...}`` (what the run computes: its arguments), then
    one line per completed unit ``{"key": ..., "records": [...]}``, each flushed and synced as
    the unit completes. :meth:`load` returns the completed units; a run with another identity
    is refused (mixing two settings in one result would be silent and wrong), a torn last line
    (killed while writing) is dropped. :meth:`remove` deletes the log once the final result
    has been written.
    """

    def __init__(self, path: Path, identity: dict):
        self.path, self.identity = Path(path), json.loads(json.dumps(identity))  # as JSON reads it back

    @classmethod
    def for_output(cls, out, identity: dict) -> "ResumeLog":
        """The log of a run writing ``out``: ``<cache>/resume/<sha1(abs out)[:12]>_<name>``, one per
        final path, outside ``results/`` (nothing partial at a final path); ``identity`` gains ``out``."""
        out = str(Path(out).resolve())
        path = cache_root() / "resume" / f"{hashlib.sha1(out.encode()).hexdigest()[:12]}_{Path(out).name}"
        return cls(path, {**identity, "out": out})

    @staticmethod
    def read(path: Path) -> tuple[dict | None, dict]:
        """``(identity, {key: records})`` of a log as it stands, without starting or checking it
        (``(None, {})`` where there is none, or only a header torn by a kill); a torn last line
        is left out. Anything else that does not parse (bytes that are no text, a bad header, a
        bad line before the last) is damage, not a kill: one UserError naming the log."""
        path = Path(path)
        if not path.is_file():
            return None, {}

        def load(p: Path) -> tuple[dict | None, dict]:
            text = p.read_bytes().decode("utf-8")
            lines = text.splitlines()
            # only the last line can be torn (each unit is written whole, then synced), and a torn
            # line lacks its newline
            torn = len(lines) if lines and not text.endswith("\n") else None
            units = []
            for n, line in enumerate(lines, 1):
                try:
                    unit = json.loads(line)
                    ok = isinstance(unit, dict) and ("identity" in unit if n == 1 else {"key", "records"} <= unit.keys())
                except ValueError:
                    ok = False
                if not ok:
                    if n == torn:
                        break  # killed mid-write: that unit is simply redone
                    raise ValueError(f"line {n} is no {'header' if n == 1 else 'unit'} of a resume log")
                units.append(unit)
            if not units:
                return None, {}
            return units[0]["identity"], {u["key"]: u["records"] for u in units[1:]}
        return load_or_error(path, load, "resume log",
                             "delete it to start afresh (the units it held are computed again)")

    def load(self) -> dict:
        """``{key: records}`` of the completed units (empty for a fresh run); starts the log."""
        identity, done = self.read(self.path)
        if identity is not None and identity != self.identity:  # None: no log, or no complete line in it
            changed = settings_diff(identity, self.identity)
            raise UserError(f"{self.path} holds a partial run with other settings ({changed}); "
                            f"delete it to start afresh, or rerun with those settings to resume it")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w") as fh:  # rewritten clean (a torn tail removed)
            fh.write(json.dumps({"identity": self.identity}) + "\n")
            fh.writelines(json.dumps({"key": k, "records": r}) + "\n" for k, r in done.items())
        return done

    def append(self, key, records: list[dict]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"key": key, "records": records}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


# Files of a component folder that no decoder reads: a training's run state (``*.run``), the
# atomic writers' temporaries, logs and curves, the training record. A kept copy
# (tools/keep_components.py) lacks or rewrites them, and must digest like the trained original.
NOT_DECODED = ("*.run", "*.partial", "*.jsonl", "stats.json")


def content_digest(path, without: tuple[str, ...] = ()) -> str:
    """A short digest of what a decoder loads from a trained component: ``sha256`` over the
    files under ``path`` (or ``path`` itself) in sorted order, each with its relative name, where a
    training checkpoint (``*.pt`` holding ``module``) counts by its published weights alone
    (name, dtype, shape and bytes of each tensor: the optimizer and restore_best's state that a
    kept copy drops do not count), any other file by its bytes, and the files no decoder reads
    (:data:`NOT_DECODED`) not at all; 16 hex digits.

    Benchmark records name a component by its cache path, and a later session may retrain it
    there (on another CPU a retraining is close but not bit-identical) or restore the kept copy:
    the digest says whether two records decoded with the same weights. ``without``: relative
    names of files to leave out as well (a folder's digest before a file was added to it)."""
    import torch  # here: records are read by notebooks that need no torch

    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not any(p.match(g) for g in NOT_DECODED)
                       and str(p.relative_to(path)) not in without)
    else:
        files = [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
        state = load_or_error(f, lambda p: torch.load(p, map_location="cpu", mmap=True, weights_only=False),
                              "checkpoint", "delete it and train it again") if f.suffix == ".pt" else None
        if isinstance(state, dict) and isinstance(state.get("module"), dict):
            for name, t in sorted(state["module"].items()):
                t = t.detach().contiguous()
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode() + b"\0")
                h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
            continue
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


# A benchmark record's sampling settings; records written before the fields existed are greedy.
GREEDY_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}


def sampling_of(record: dict) -> dict:
    """``{temperature, top_p, top_k, seed}`` a record decoded with (absent fields: greedy's)."""
    return {k: record.get(k, v) for k, v in GREEDY_SAMPLING.items()}
