"""Token trees as data (Medusa's vocabulary).

A tree is a list of *paths*; a path is a tuple of top-k ranks, one per depth, e.g. ``(0, 1)``
is "the rank-1 candidate at depth 2 below the rank-0 candidate at depth 1". Node 0 is the
root: the last committed token, whose logits are computed in the same forward. Every path's
parent (the path without its last element) must also be in the tree.

:func:`build_tree` turns paths into the buffers that the verifier needs, built once per tree:
the ancestor mask, depths (position offsets), parents and retrieve indices (one row per
root-to-leaf path). :func:`attention_mask_4d` turns the ancestor mask into the additive 4D
float mask transformers passes through untouched (see ``shared/notes/transformers-5.23.md``
section 4: it must cover past + q columns, and be float 0 / finfo.min, not bool).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import UserError


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
    parents = torch.full((n,), -1, dtype=torch.long)
    depth = torch.zeros(n, dtype=torch.long)
    rank = torch.zeros(n, dtype=torch.long)
    mask = torch.eye(n, dtype=torch.bool)
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
    retrieve = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long)
    return TreeBuffers(tuple(ps), parents, depth, rank, mask, retrieve)


def chain_paths(length: int) -> list[tuple[int, ...]]:
    """The linear tree of ``length`` top-1 candidates (speculative decoding's chain)."""
    return [(0,) * d for d in range(1, length + 1)]


def attention_mask_4d(allow: torch.Tensor, past_len: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask for ``q`` new tokens after ``past_len`` cached ones.

    Args:
        allow: ``[q, q]`` bool, which new token may attend which (causal or ancestor mask).
        past_len: cached positions, all visible to every new token.
    Returns:
        ``[1, 1, q, past_len + q]`` tensor of 0 (attend) / ``finfo(dtype).min`` (masked).
    """
    q = allow.shape[0]
    full = torch.ones(q, past_len + q, dtype=torch.bool, device=allow.device)
    full[:, past_len:] = allow
    out = torch.zeros(full.shape, dtype=dtype, device=allow.device)
    return out.masked_fill_(~full, torch.finfo(dtype).min)[None, None]


def causal_allow(q: int, device=None) -> torch.Tensor:
    """``[q, q]`` lower-triangular bool mask (a chain is a tree with one path)."""
    return torch.ones(q, q, dtype=torch.bool, device=device).tril_()


def save_tree(path: Path, paths, **stats) -> None:
    """Store a tree as JSON: its paths plus the statistics it was built from."""
    build_tree(paths)  # validate before writing anything
    Path(path).write_text(json.dumps({"paths": [list(p) for p in paths], **stats}, indent=1))


def load_tree(path: Path) -> TreeBuffers:
    """Load a tree written by :func:`save_tree` (or any JSON with a ``paths`` list)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"tree file {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_text())
        return build_tree(data["paths"])
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"tree file {str(p)!r} is malformed ({e}); expected {{'paths': [[0], [0, 1], ...]}}")
