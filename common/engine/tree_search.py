"""Sparse candidate trees from measured accuracies (Medusa / Sequoia style).

Given ``acc[d][r]``, the probability that the rank-``r`` candidate at depth ``d + 1`` is the
token the target would produce (measured on a validation set, e.g. the top-k accuracy of a
Medusa head, a prompt token or a FIRP prediction), and assuming independence across depths,
a node's probability of being accepted is the product of ``acc`` along its path, and the
expected accepted length of a tree is the sum of its nodes' probabilities (+1 for the bonus
token). Because every child is no likelier than its parent, adding nodes greedily by
path probability (a best-first search) gives the optimal tree of each size.
"""
from __future__ import annotations

import heapq

from ..errors import UserError


# Guess accuracy by distance and rank for a trained proposer with no measured table yet (a prior
# of the usual shape: each distance and rank less likely than the one before). Decoders build
# their default trees from it; trained checkpoints store their measured ``acc``.
PRIOR_ACC = [[0.5 / (r + 1) ** 1.5 for r in range(8)] for _ in range(8)]


def expected_accept_length(paths, acc) -> float:
    """Expected tokens committed per step (accepted candidates + the bonus token)."""
    total = 1.0
    for p in paths:
        prob = 1.0
        for d, r in enumerate(p):
            prob *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
        total += prob
    return total


def best_tree(acc, n_nodes: int) -> list[tuple[int, ...]]:
    """The ``n_nodes``-node tree (root included) of highest expected accepted length.

    Args:
        acc: ``acc[d][r]`` in [0, 1]; depth ``d = 0`` is the first future token.
        n_nodes: tree size including the root (Medusa's 63-node tree = 62 paths + root).
    Returns:
        the paths, parents before children.
    """
    if n_nodes < 1:
        raise UserError(f"n_nodes={n_nodes} is out of range; valid: >= 1")
    if not acc or any(not row for row in acc):
        raise UserError("accuracy table is empty; need acc[depth][rank] for at least one depth")
    if any(not 0 <= a <= 1 for row in acc for a in row):
        raise UserError("accuracies must lie in [0, 1]")
    heap = [(-acc[0][r], (r,)) for r in range(len(acc[0]))]
    heapq.heapify(heap)
    paths: list[tuple[int, ...]] = []
    while heap and len(paths) < n_nodes - 1:
        neg, p = heapq.heappop(heap)
        paths.append(p)
        d = len(p)
        if d < len(acc):
            for r in range(len(acc[d])):
                heapq.heappush(heap, (neg * acc[d][r], p + (r,)))
    return paths
