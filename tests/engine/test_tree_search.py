"""Tree construction from accuracies: optimal by brute force on small cases, valid trees."""
import itertools

import pytest

from common.errors import UserError
from common.engine.tree import build_tree
from common.engine.tree_search import best_tree, expected_accept_length

ACC = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.15]]  # 3 + 9 + 18 = 30 possible paths


def all_paths(acc):
    out = []
    for d in range(1, len(acc) + 1):
        out += list(itertools.product(*[range(len(acc[i])) for i in range(d)]))
    return out


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_best_tree_is_optimal_among_valid_trees(n):
    tree = best_tree(ACC, n)
    build_tree(tree)  # every parent present
    assert len(tree) == n - 1
    best = 0.0
    for subset in itertools.combinations(all_paths(ACC), n - 1):
        s = set(subset)
        if all(p[:-1] in s or len(p) == 1 for p in s):
            best = max(best, expected_accept_length(subset, ACC))
    assert expected_accept_length(tree, ACC) == pytest.approx(best)


def test_bigger_trees_accept_more_and_bad_input():
    lengths = [expected_accept_length(best_tree(ACC, n), ACC) for n in (1, 5, 10, 20)]
    assert lengths == sorted(lengths) and lengths[0] == 1.0
    with pytest.raises(UserError):
        best_tree(ACC, 0)
    with pytest.raises(UserError):
        best_tree([[1.5]], 3)
