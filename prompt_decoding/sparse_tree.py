"""The dynamic sparse tree (section 4.2, Propositions 4.1-4.4) and its hardware-aware size.

The tree has ``m`` states: in state ``k`` the accepted node of the previous step carried ``k``
prompt tokens, so there are guesses for distances ``1..k`` and the candidate subtree
``C(T_k)`` is at most ``k`` deep. Every node of ``T_k`` (root and candidates) carries between 1
and ``m`` prompt tokens, and what the node that ends up accepted carries is the next state.

With ``acc[d][r]`` the measured probability that the rank-``r`` guess at distance ``d + 1`` is
right (independent across distances, as Medusa and Sequoia assume):

* ``f(T_k)`` (Prop. 4.1): expected accepted candidates, the sum over candidates of the product
  of ``acc`` along their path;
* ``P(c ends the step)``: the path to ``c`` accepted and none of ``c``'s children;
* ``p(s_i | s_k)`` = sum of ``P(c ends)`` over the nodes of ``T_k`` carrying ``i`` prompt tokens;
  ``F(T_k) = f(T_k) + sum_i p(s_i | s_k) f(T_i)`` (Prop. 4.2);
* removing one prompt token from a node ``c`` carrying ``i > 1`` changes ``F`` by
  ``P(c ends) * (f(T_i) - f(T_{i-1}))`` (Prop. 4.3; the paper writes ``p(c)``, the probability
  that the step ends at ``c``, which is what moves ``F``);
* ``R(T) = sum_i pi_i f(T_i)`` with ``pi`` the steady state of ``p(s_i | s_k)`` (Prop. 4.4);
  a step then commits ``R + 1`` tokens on average (the bonus token).

Construction for ``n_c`` candidates and ``n_p`` prompt tokens per state: the best candidate
tree of each depth (:func:`common.engine.tree_search.best_tree`), every node given ``m`` prompt tokens,
then tokens removed greedily by smallest loss until ``n_p`` remain (each node keeps >= 1).
For a total size ``n = n_c + 1 + n_p`` (verified positions), every split is tried and the best
``R`` kept; the hardware-aware size maximises ``(R(n) + 1) / (T(n) / T(1))`` over ``n`` with
``T`` the machine's cost curve (:mod:`common.harness.cost_curve`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.errors import UserError, check_range
from common.engine.tree_search import best_tree


def _prob(path, acc) -> float:
    p = 1.0
    for d, r in enumerate(path):
        p *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
    return p


@dataclass(frozen=True)
class StateTree:
    """``T_k``: candidate paths (root implicit, node ``i + 1`` = ``paths[i]``) and the prompt
    tokens each node carries (``carry[0]`` the root's)."""
    paths: tuple[tuple[int, ...], ...]
    carry: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.carry)

    @property
    def size(self) -> int:
        """Verified positions: root + candidates + prompt tokens (one EPT each)."""
        return 1 + len(self.paths) + self.prompt_tokens


def expected_candidates(paths, acc) -> float:
    """``f(T)`` of Prop. 4.1."""
    return sum(_prob(p, acc) for p in paths)


def end_probs(paths, acc) -> list[float]:
    """``P(the step ends at node c)`` for the root and each candidate (sums to 1)."""
    nodes = [()] + [tuple(p) for p in paths]
    reach = [_prob(p, acc) for p in nodes]
    children: dict[tuple, float] = {}
    for p, r in zip(nodes[1:], reach[1:]):
        children[p[:-1]] = children.get(p[:-1], 0.0) + r
    return [r - children.get(p, 0.0) for p, r in zip(nodes, reach)]


def transitions(trees: dict[int, StateTree], acc) -> np.ndarray:
    """``P[k-1, i-1] = p(s_i | s_k)`` for states ``1..m``."""
    m = len(trees)
    P = np.zeros((m, m))
    for k, t in trees.items():
        for c, pe in zip(t.carry, end_probs(t.paths, acc)):
            P[k - 1, c - 1] += pe
    return P


def steady_state(P: np.ndarray) -> np.ndarray:
    """The stationary distribution ``pi = pi P`` (the left eigenvector of eigenvalue 1)."""
    w, v = np.linalg.eig(P.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1.0))])
    return pi / pi.sum()


def amortized(trees: dict[int, StateTree], acc) -> float:
    """``R(T)`` of Prop. 4.4: expected accepted candidates per step in the steady state."""
    f = np.array([expected_candidates(trees[k].paths, acc) for k in sorted(trees)])
    return float(steady_state(transitions(trees, acc)) @ f)


def build(acc, m: int, n_c: int, n_p: int) -> dict[int, StateTree]:
    """The dynamic sparse tree with ``n_c`` candidates and ``n_p`` prompt tokens in every state
    (fewer where a shallow state's table has fewer candidates than ``n_c``).

    Args:
        acc: ``acc[d][r]`` for distances ``1..m`` at least.
        n_p: between ``n_c + 1`` (one per node) and ``m * (n_c + 1)`` (all of them).
    """
    check_range("m", m, 1)
    check_range("n_c", n_c, 0)
    if len(acc) < m:
        raise UserError(f"the accuracy table covers {len(acc)} distances; the tree needs {m}")
    if not n_c + 1 <= n_p <= m * (n_c + 1):
        raise UserError(f"n_p={n_p} is out of range for n_c={n_c}, m={m}; valid: {n_c + 1}..{m * (n_c + 1)}")
    cands = {k: tuple(best_tree(acc[:k], n_c + 1)) for k in range(1, m + 1)}
    f = {k: expected_candidates(cands[k], acc) for k in cands}
    f[0] = 0.0
    trees = {}
    for k, paths in cands.items():
        ends = end_probs(paths, acc)
        carry = [m] * (len(paths) + 1)
        # a shallow state may have fewer candidates than n_c (the table's ranks run out): it
        # keeps what its nodes can carry
        for _ in range(m * len(carry) - max(min(n_p, m * len(carry)), len(carry))):
            # the removal that loses least: P(c ends) * (f(T_i) - f(T_{i-1})), i = c's carry now
            c = min((i for i in range(len(carry)) if carry[i] > 1),
                    key=lambda i: (ends[i] * (f[carry[i]] - f[carry[i] - 1]), -i))
            carry[c] -= 1
        trees[k] = StateTree(paths, tuple(carry))
    return trees


def static(acc, m: int, n_c: int) -> dict[int, StateTree]:
    """The static tree of the comparison: every node carries all ``m`` prompt tokens."""
    return build(acc, m, n_c, m * (n_c + 1))


def best_split(acc, m: int, size: int) -> tuple[dict[int, StateTree], float]:
    """The dynamic tree of ``size`` verified positions (root + candidates + prompt tokens)
    with the highest ``R``, over every split; returns ``(trees, R)``."""
    best = None
    for n_c in range(0, size):
        n_p = size - 1 - n_c
        if not n_c + 1 <= n_p <= m * (n_c + 1):
            continue
        trees = build(acc, m, n_c, n_p)
        r = amortized(trees, acc)
        if best is None or r > best[1]:
            best = (trees, r)
    if best is None:
        raise UserError(f"no dynamic tree has {size} positions with m={m}; valid: sizes >= 2")
    return best


def hardware_size(acc, m: int, sizes, cost) -> dict:
    """The size maximising ``tau(n) / (T(n) / T(1))`` (section 4.2, hardware awareness).

    Args:
        sizes: candidate sizes ``n`` (verified positions).
        cost: ``n -> T(n) / T(1)`` (:func:`common.cost.cost_of` over the machine's curve).
    Returns:
        ``{"size", "tau", "cost", "speedup", "table": [{"size", "tau", "cost", "speedup"}, ...]}``.
    """
    table = []
    for n in sizes:
        _, r = best_split(acc, m, n)
        table.append({"size": n, "tau": r + 1.0, "cost": cost(n), "speedup": (r + 1.0) / cost(n)})
    best = max(table, key=lambda row: row["speedup"])
    return {**best, "table": table}


def random_tree(acc, m: int, size: int, seed: int = 0) -> dict[int, StateTree]:
    """The random tree of the comparison (Figure 8 (a)): in each state the dynamic tree's
    numbers of candidates and prompt tokens, but candidates grown at random (a random rank
    under a random node, prefix-closed, ranks below the table's width) and prompt tokens
    allotted at random (each node keeps one)."""
    trees, _ = best_split(acc, m, size)
    rng = np.random.default_rng(seed)
    width = len(acc[0])
    out = {}
    for k, t in trees.items():
        n_c, n_p = len(t.paths), t.prompt_tokens
        paths: list[tuple[int, ...]] = []
        for _ in range(100 * (n_c + 1)):
            if len(paths) == n_c:
                break
            parents = [()] + [p for p in paths if len(p) < k]
            child = parents[int(rng.integers(len(parents)))] + (int(rng.integers(width)),)
            if child not in paths:
                paths.append(child)
        carry = [1] * (len(paths) + 1)
        for _ in range(min(n_p, m * len(carry)) - len(carry)):
            open_ = [i for i, c in enumerate(carry) if c < m]
            carry[open_[int(rng.integers(len(open_)))]] += 1
        out[k] = StateTree(tuple(sorted(paths, key=lambda p: (len(p), p))), tuple(carry))
    return out
