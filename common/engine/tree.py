"""Token trees as data (Medusa's vocabulary).

A tree is a list of *paths*; a path is a tuple of top-k ranks, one per depth, e.g. ``(0, 1)``
is "the rank-1 candidate at depth 2 below the rank-0 candidate at depth 1". Node 0 is the
root: the last committed token, whose logits are computed in the same forward. Every path's
parent (the path without its last element) must also be in the tree.

:func:`build_tree` turns paths into the buffers that the verifier needs, built once per tree:
the ancestor mask, depths (position offsets), parents and retrieve indices (one row per
root-to-leaf path). Buffers are built on the CPU and moved once to the model's device with
:meth:`TreeBuffers.to`; :func:`common.engine.forward.attention_mask_4d` turns the ancestor mask into
the attention mask of the verification forward.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from ..errors import UserError
from ..paths import load_or_error


@dataclass(frozen=True)
class TreeBuffers:
    """Buffers for one tree of ``n`` nodes (root included).

    Attributes:
        paths: the sorted non-root paths; node ``i+1`` is ``paths[i]``.
        parents: ``[n]`` long, parent node index, -1 for the root.
        depth: ``[n]`` long, 0 for the root; also the position offset of each node.
        rank: ``[n]`` long, top-k rank of each node among its siblings' candidates (root 0).
        ancestor_mask: ``[n, n]`` bool, ``[i, j]`` True iff j is i or an ancestor of i.
        retrieve_indices: ``[n_leaves, max_depth + 1]`` long node indices of each
            root-to-leaf path, right-padded with -1.
    """

    paths: tuple[tuple[int, ...], ...]
    parents: torch.Tensor
    depth: torch.Tensor
    rank: torch.Tensor
    ancestor_mask: torch.Tensor
    retrieve_indices: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.parents.numel())

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @property
    def device(self) -> torch.device:
        return self.parents.device

    @property
    def is_chain(self) -> bool:
        """True when the nodes form one path (every node is its predecessor's child)."""
        return bool((self.parents[1:] == torch.arange(self.size - 1, device=self.device)).all())

    def to(self, device) -> "TreeBuffers":
        """The same tree with its tensors on ``device`` (``self`` when already there)."""
        if torch.device(device) == self.device:
            return self
        return TreeBuffers(**{f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                              for f in fields(self)})


def build_tree(paths, max_nodes: int | None = None) -> TreeBuffers:
    """Build :class:`TreeBuffers` from candidate paths.

    Args:
        paths: iterable of tuples/lists of non-negative ranks (the root is implicit).
        max_nodes: optional cap on the node count (e.g. the context left); exceeding it is
            an error rather than a silent truncation.
    """
    ps = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
    if any(len(p) == 0 for p in ps):
        raise UserError("a tree path is empty; paths are non-empty tuples of ranks")
    if any(r < 0 for p in ps for r in p):
        raise UserError("a tree path has a negative rank; ranks are >= 0")
    index = {(): 0}
    for i, p in enumerate(ps):
        if p[:-1] not in index:
            raise UserError(f"tree path {list(p)} has no parent {list(p[:-1])} in the tree")
        index[p] = i + 1
    n = len(ps) + 1
    if max_nodes is not None and n > max_nodes:
        raise UserError(f"tree has {n} nodes but at most {max_nodes} fit; use a smaller tree")
    # Built on the CPU whatever the default device (Python-side loops); moved once with .to().
    cpu = torch.device("cpu")
    parents = torch.full((n,), -1, dtype=torch.long, device=cpu)
    depth = torch.zeros(n, dtype=torch.long, device=cpu)
    rank = torch.zeros(n, dtype=torch.long, device=cpu)
    mask = torch.eye(n, dtype=torch.bool, device=cpu)
    for p, i in index.items():
        if not p:
            continue
        parents[i], depth[i], rank[i] = index[p[:-1]], len(p), p[-1]
        mask[i] |= mask[index[p[:-1]]]  # parents come first in the sort, so their row is done
    children = set(parents.tolist())
    leaves = [i for i in range(n) if i not in children]
    rows = []
    for leaf in leaves:
        chain, j = [], leaf
        while j >= 0:
            chain.append(j)
            j = int(parents[j])
        rows.append(chain[::-1])
    width = max(len(r) for r in rows)
    retrieve = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long, device=cpu)
    return TreeBuffers(tuple(ps), parents, depth, rank, mask, retrieve)


def chain_paths(length: int) -> list[tuple[int, ...]]:
    """The linear tree of ``length`` top-1 candidates (speculative decoding's chain)."""
    return [(0,) * d for d in range(1, length + 1)]


def save_tree(path: Path, paths, **stats) -> None:
    """Store a tree as JSON: its paths plus the statistics it was built from."""
    build_tree(paths)  # validate before writing anything
    Path(path).write_text(json.dumps({"paths": [list(p) for p in paths], **stats}, indent=1))


def load_tree(path: Path) -> TreeBuffers:
    """Load a tree written by :func:`save_tree` (or any JSON with a ``paths`` list)."""
    def load(p: Path) -> TreeBuffers:
        data = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("paths"), list):
            raise ValueError("no 'paths' list")
        try:
            return build_tree(data["paths"])
        except UserError as e:  # a path list that is no tree: name the file it came from
            raise UserError(f"tree file {p}: {e}") from e
    return load_or_error(path, load, "tree file",
                         "a missing or malformed tree comes from its trainer: train again; valid: JSON {'paths': [[0], [0, 1], ...]}")


def resolve_tree(value, max_depth: int, what: str, stored: Path | None = None) -> int | tuple[tuple[int, ...], ...]:
    """A tree decoder's ``tree`` option, resolved once for every decoder.

    Args:
        value: a size (int) or a tree file (str / Path).
        max_depth: the deepest path the decoder can fill (heads, prediction steps, prompt tokens).
        what: the limit in words, for the error, e.g. ``"the 3 Medusa heads"``.
        stored: a folder of stored trees ``tree_<size>.json``: a size then names one of them.
            Without it a size is the decoder's own to build (returned as is).
    Returns:
        the size (an int), or the tree's paths (a tuple of rank tuples) from its file,
        no deeper than ``max_depth``.
    """
    if isinstance(value, int) and stored is None:
        return value
    src = Path(stored) / f"tree_{value}.json" if isinstance(value, int) else Path(value)
    paths = tuple(tuple(p) for p in load_tree(src).paths)
    if max(map(len, paths), default=0) > max_depth:
        raise UserError(f"tree {src} is {max(map(len, paths))} deep, deeper than {what} ({max_depth}); "
                        "valid: a tree no deeper than that")
    return paths
