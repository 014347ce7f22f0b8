"""REST's datastore (He et al., 2023): token text with a suffix array, searched by exact match.

**Library.** The suffix array comes from ``pydivsufsort`` (libdivsufsort's bindings; a
manylinux wheel, maintained). The authors' own ``draftretriever`` (PyPI 0.1.1) installs here
but does not retrieve what REST describes: on a hand-made datastore its ``search`` returns
the continuations of the query's last two tokens whatever the query's length (``[0, 7, 8, 9]``
matched where only ``[8, 9]`` occurs) and continuations of token 0 where the text holds none,
and a one-token query aborts the process (a Rust panic). So the search, the counting and the
pruning below are written here after the authors' ``lib.rs`` (FasterDecoding/REST,
``DraftRetriever/src/lib.rs``): binary search of the suffixes that start with the query, the
``long`` tokens after each of the first ``k`` occurrences in suffix order, every continuation
prefix counted, the ``choices`` most frequent kept (a prefix is counted at least as often as
any of its extensions, so the kept set is a trie; ties go to the shallower, then the smaller
tokens, so retrieval is deterministic). One difference: sequences are separated by an id
outside the vocabulary, so a continuation never runs into the next reply (the authors'
writer concatenates them).

A datastore is a folder:

* ``tokens.npy`` - ``[T]`` int32, every sequence followed by the separator ``vocab_size``;
* ``suffixes.npy`` - ``[T]`` the suffix array of ``tokens`` (int32 or int64);
* ``datastore.json`` - what it holds and for which tokenizer: the tokenizer's identity
  (:func:`common.training.corpus.tokenizer_identity`, a hash of its vocabulary), its name and vocabulary
  size, the source, counts of sequences and tokens, the size on disk and the library. Written
  last (every file atomically), so a folder without it is an unfinished build. A decoder given
  a datastore of another tokenizer refuses it. Nothing in the folder depends on when or how
  fast it was built, so a rebuild of the same text is byte-identical (the same content digest);
  the build time goes to the stats (``--stats``) only. Folders built before that carried
  ``build_s`` in this file (tools/weights_status.py recognises them).

Command line (progress bar; size and build time printed and stored in the stats JSON)::

    python -m common.components.rest_datastore --model smollm2-135m-instruct --out DIR [--n N] [--stats FILE]
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..errors import UserError, cli_main
from ..paths import atomic_write, load_json, load_or_error

TOKENS, SUFFIXES, META = "tokens.npy", "suffixes.npy", "datastore.json"


REBUILD = "rebuild it: python -m common.components.rest_datastore --model NAME --out DIR"


def _load_array(path: Path) -> np.ndarray:
    """One of the folder's ``[T]`` integer arrays, memory-mapped; a truncated or foreign file
    (numpy's ValueError: mmap length, header, pickled data) is one UserError."""
    def load(p: Path) -> np.ndarray:
        a = np.load(p, mmap_mode="r")
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ValueError(f"a {a.ndim}-d {a.dtype} array, not [T] integers")
        return a
    return load_or_error(path, load, "REST datastore file", REBUILD)


def _save_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, array)
    atomic_write(path, write)


def build_datastore(sequences: Iterable[list[int]], out: Path, vocab_size: int, tokenizer_id: str,
                    tokenizer_name: str, source: str, total: int | None = None, progress: bool = False) -> dict:
    """Write a datastore of ``sequences`` (token-id lists) to folder ``out``.

    Args:
        vocab_size: ids must lie in ``[0, vocab_size)``; ``vocab_size`` itself separates sequences.
        tokenizer_id: identity of the tokenizer that made the ids; ``tokenizer_name``: its name.
        source: what the sequences are (stored, for the record).
        total: sequence count for the progress bar, when known.
    Returns:
        The meta stored in ``datastore.json``, plus ``build_s`` (seconds; not stored there).
    """
    from pydivsufsort import divsufsort
    from tqdm import tqdm

    from ..records import write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / META).unlink(missing_ok=True)  # the folder is unfinished until the new meta lands
    t0 = time.perf_counter()
    parts, n_seq = [], 0
    sep = np.array([vocab_size], dtype=np.int32)
    for seq in tqdm(sequences, total=total, unit="seq", desc="datastore: tokens", disable=not progress):
        a = np.asarray(seq, dtype=np.int64)
        if not a.size:
            continue
        bad = a[(a < 0) | (a >= vocab_size)]
        if bad.size:
            raise UserError(f"token id {int(bad[0])} is outside the vocabulary; valid: 0..{vocab_size - 1}")
        parts += [a.astype(np.int32), sep]
        n_seq += 1
    if not n_seq:
        raise UserError("the datastore would be empty; valid: at least one non-empty sequence")
    tokens = np.concatenate(parts)
    if progress:
        print(f"datastore: suffix array of {tokens.size} positions", flush=True)
    suffixes = divsufsort(tokens)
    _save_npy(out / TOKENS, tokens)
    _save_npy(out / SUFFIXES, suffixes)
    meta = {"tokenizer_id": tokenizer_id, "tokenizer": tokenizer_name, "vocab_size": int(vocab_size),
            "source": source, "sequences": n_seq, "tokens": int(tokens.size - n_seq),
            "size_bytes": (out / TOKENS).stat().st_size + (out / SUFFIXES).stat().st_size,
            "library": f"pydivsufsort {_version()}"}
    # The build time stays out of the meta: a decoder reads the meta, so records digest it
    # (common.records.content_digest), and a rebuild of the same text must digest the same.
    write_json(out / META, meta)
    return {**meta, "build_s": round(time.perf_counter() - t0, 3)}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pydivsufsort")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class Retrieved:
    """One retrieval: the kept continuation prefixes (a prefix-closed set, each a token list),
    and the suffix length that matched (0: none did)."""
    paths: list[list[int]]
    span: int


class Datastore:
    """An opened datastore: its meta, tokens and suffix array (memory-mapped)."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = Path(folder), meta
        self.tokens = _load_array(self.folder / TOKENS)
        self.suffixes = _load_array(self.folder / SUFFIXES)
        if self.tokens.shape != self.suffixes.shape:  # both [T]: one was cut or comes from another build
            raise UserError(f"REST datastore {self.folder}: {TOKENS} holds {self.tokens.size} positions, {SUFFIXES} "
                            f"{self.suffixes.size}; {REBUILD}")
        self.sep = int(meta["vocab_size"])

    def occurrences(self, query: list[int]) -> tuple[int, int]:
        """``[lo, hi)``: the suffix-array rows whose suffix starts with ``query``."""
        q = np.asarray(query, dtype=np.int64)
        n, L = self.suffixes.size, q.size

        def before(i: int, upper: bool) -> bool:  # suffix i sorts before q (upper: or starts with it)
            s = int(self.suffixes[i])
            head = self.tokens[s:s + L]
            diff = np.flatnonzero(head != q[:head.size])
            if diff.size:
                return bool(head[diff[0]] < q[diff[0]])
            return head.size < L or upper   # a proper prefix of q sorts before it

        def bound(upper: bool) -> int:
            lo, hi = 0, n
            while lo < hi:
                mid = (lo + hi) // 2
                if before(mid, upper):
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        return bound(False), bound(True)

    def search(self, context: list[int], max_span: int, min_span: int, num_draft: int,
               draft_len: int, matches: int) -> Retrieved:
        """The context's longest suffix (``max_span`` tokens down to ``min_span``) found in the
        datastore, and the most frequent continuations of its occurrences.

        Args:
            context: token ids, newest last (the root included).
            num_draft: at most this many trie nodes (the authors' ``choices``).
            draft_len: continuation tokens read after each occurrence (``long``).
            matches: occurrences read at most, the first in suffix order (``k``).
        Returns:
            :class:`Retrieved`; no paths when no suffix of ``min_span`` tokens or more occurs.
        """
        # an occurrence of a suffix holds one of every shorter suffix, so the spans that occur
        # are min_span..s*: s* is found by bisection (a few searches instead of one per length)
        found: dict[int, tuple[int, int]] = {}

        def occurs(span: int) -> bool:
            found[span] = self.occurrences(list(context[-span:]))
            return found[span][1] > found[span][0]
        a, b = min_span - 1, min(max_span, len(context))   # a: longest known to occur (or none yet)
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if occurs(mid) else (a, mid - 1)
        for span in range(a, min_span - 1, -1):
            lo, hi = found[span] if span in found else self.occurrences(list(context[-span:]))
            starts = np.asarray(self.suffixes[lo:min(hi, lo + matches)], dtype=np.int64) + span
            idx = starts[:, None] + np.arange(draft_len)                      # [m, draft_len]
            cont = np.asarray(self.tokens[np.minimum(idx, self.tokens.size - 1)], dtype=np.int64)
            cont[idx >= self.tokens.size] = self.sep
            valid = np.cumprod(cont != self.sep, axis=1).astype(bool)        # up to the separator
            paths = _most_frequent_prefixes(cont, valid, num_draft)
            if paths:
                return Retrieved(paths, span)
        return Retrieved([], 0)


def _most_frequent_prefixes(cont: np.ndarray, valid: np.ndarray, keep: int) -> list[list[int]]:
    """The ``keep`` most frequent prefixes of the rows of ``cont`` (``[m, D]``; ``valid`` marks
    each row's real tokens, a prefix of the row), ties to shallower then smaller tokens."""
    nodes, counts, depths = [], [], []
    for d in range(1, cont.shape[1] + 1):
        rows = cont[valid[:, d - 1], :d]
        if not rows.size:
            break
        uniq, cnt = np.unique(rows, axis=0, return_counts=True)   # lexicographic order
        nodes += [tuple(r) for r in uniq.tolist()]
        counts.append(cnt)
        depths.append(np.full(cnt.size, d))
    if not nodes:
        return []
    counts, depths = np.concatenate(counts), np.concatenate(depths)
    # stable sort on (-count, depth); within a depth np.unique already gave lexicographic order
    order = np.lexsort((np.arange(counts.size), depths, -counts))[:keep]
    return [list(nodes[i]) for i in sorted(order.tolist())]


def open_datastore(folder, tokenizer_id: str | None = None, vocab_size: int | None = None) -> Datastore:
    """Open a finished datastore, checked against the decoding tokenizer.

    Args:
        tokenizer_id: the decoding tokenizer's identity (None when no tokenizer is given: then
            only the vocabulary size is checked).
        vocab_size: the model's vocabulary; the datastore's must not exceed it.
    """
    folder = Path(folder)
    if not all((folder / f).is_file() for f in (META, TOKENS, SUFFIXES)):
        raise UserError(f"no finished REST datastore at {folder} (needs {META}, {TOKENS}, {SUFFIXES}); build one: "
                        "python -m common.components.rest_datastore --model NAME --out DIR")
    meta = load_json(folder / META, "REST datastore meta", REBUILD)
    if not isinstance(meta.get("vocab_size"), int) or isinstance(meta.get("vocab_size"), bool):
        raise UserError(f"REST datastore meta {folder / META} has no integer vocab_size; {REBUILD}")
    if tokenizer_id is not None and meta.get("tokenizer_id") != tokenizer_id:
        raise UserError(f"datastore {folder} was built with tokenizer {meta.get('tokenizer')!r} (id "
                        f"{str(meta.get('tokenizer_id'))[:12]}), not this model's tokenizer (id {tokenizer_id[:12]}); "
                        "valid: a datastore built for this tokenizer (python -m common.components.rest_datastore --model NAME)")
    if vocab_size is not None and int(meta.get("vocab_size", 0)) > vocab_size:
        raise UserError(f"datastore {folder} holds ids of a {meta.get('vocab_size')}-token vocabulary; this model "
                        f"has {vocab_size}; valid: a datastore built for this model's tokenizer")
    return Datastore(folder, meta)


# -- command line ------------------------------------------------------------------------------
def sharegpt_replies(n: int | None = None) -> list[str]:
    """The assistant (``gpt``) turns of the first ``n`` ShareGPT conversations (all if None)."""
    from ..assets.data import load_sharegpt_conversations

    convs = load_sharegpt_conversations()
    convs = convs if n is None else convs[:n]
    return [t["value"] for c in convs for t in c["conversations"]
            if t.get("from") == "gpt" and isinstance(t.get("value"), str) and t["value"].strip()]


def _main(argv: list[str] | None = None) -> None:
    from ..checks import ArgumentParser, check_positive_int
    from ..training.corpus import tokenizer_identity
    from ..records import write_json

    ap = ArgumentParser(prog="python -m common.components.rest_datastore", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="registry name, hub id or folder (its tokenizer is used)")
    ap.add_argument("--out", required=True, help="datastore folder")
    ap.add_argument("--n", type=int, default=None, help="first N ShareGPT conversations (default: all)")
    ap.add_argument("--stats", default=None, help="also write the stats JSON here (the rule's record)")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    if a.n is not None:
        check_positive_int("--n", a.n)
    from transformers import AutoTokenizer

    from ..assets.models import resolve
    try:
        tok = AutoTokenizer.from_pretrained(resolve(a.model))
    except OSError as e:
        raise UserError(f"no tokenizer for model {a.model!r}: {e}".splitlines()[0]) from e
    texts = sharegpt_replies(a.n)
    if not texts:
        raise UserError("ShareGPT gave no assistant replies; valid: --n >= 1")

    def batches(size: int = 256):  # the fast tokenizer encodes a batch in one call
        for i in range(0, len(texts), size):
            yield from tok(texts[i:i + size], add_special_tokens=False)["input_ids"]
    which = "all" if a.n is None else f"the first {a.n}"
    stats = build_datastore(batches(), Path(a.out), len(tok), tokenizer_identity(tok), a.model,
                            f"ShareGPT V3 assistant replies of {which} conversations",
                            total=len(texts), progress=not a.no_progress)
    if a.stats:
        write_json(Path(a.stats), stats)
    print(f"datastore {a.out}: {stats['sequences']} replies, {stats['tokens']} tokens, "
          f"{stats['size_bytes'] / 2**20:.1f} MiB, built in {stats['build_s']:.1f} s")


if __name__ == "__main__":
    cli_main(_main)
