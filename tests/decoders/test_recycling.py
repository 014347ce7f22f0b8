"""Token Recycling: the template cuts, the matrix update from given logits, the BFS fill, the
hot start, bad options."""
from collections import Counter

import pytest
import torch

from common.decoders import get_decoder
from common.decoders.recycling import (PAPER_TREE, TREE_SIZES, AdjacencyMatrix, RecyclingProposer,
                                       expansion_plan, template)
from common.decoders.tree_loop import ProposerState
from common.engine.tree import build_tree
from common.errors import UserError


def test_paper_template_and_its_cuts():
    assert len(set(PAPER_TREE)) == 80
    assert sorted(Counter(map(len, PAPER_TREE)).items()) == [(1, 8), (2, 21), (3, 25), (4, 15), (5, 8), (6, 3)]
    assert set(template(80)) == set(PAPER_TREE)
    for size in TREE_SIZES:
        cut = template(size)
        assert len(cut) == size and all(p[:-1] in cut or len(p) == 1 for p in cut)   # prefix-closed
        build_tree(cut)
    assert set(template(8)) < set(template(16))


def test_update_takes_every_nodes_topk_and_the_last_occurrence():
    m = AdjacencyMatrix(10, 2, "cpu")
    logits = torch.tensor([[0, 5, 4, 0, 0, 0, 0, 0, 0, 0],     # node 0: token 3 -> (1, 2)
                           [9, 0, 0, 0, 0, 0, 0, 0, 8, 0],     # node 1: token 7 -> (0, 8)
                           [0, 0, 0, 0, 0, 1, 0, 3, 0, 0]],    # node 2: token 3 again -> (7, 5)
                          dtype=torch.float)
    m.update(torch.tensor([3, 7, 3]), logits)
    assert m.m[3].tolist() == [7, 5] and m.m[7].tolist() == [0, 8]
    assert m.written.nonzero().flatten().tolist() == [3, 7]
    assert m.m[4].tolist() == [0, 0]   # untouched rows stay zero (the paper's initialisation)
    assert m.nbytes == 10 * 2 * 4


def test_expand_fills_the_tree_breadth_first():
    m = AdjacencyMatrix(10, 3, "cpu")
    m.m[1] = torch.tensor([2, 3, 4], dtype=torch.int32)
    m.m[2] = torch.tensor([5, 6, 7], dtype=torch.int32)
    m.m[3] = torch.tensor([8, 9, 1], dtype=torch.int32)
    m.m[5] = torch.tensor([1, 1, 1], dtype=torch.int32)
    tree = build_tree([(0,), (1,), (2,), (0, 0), (0, 2), (1, 1), (0, 0, 0)])
    toks = m.expand(1, expansion_plan(tree, "cpu")).tolist()
    want = {(0,): 2, (1,): 3, (2,): 4, (0, 0): 5, (0, 2): 7, (1, 1): 9, (0, 0, 0): 1}
    assert toks == [want[p] for p in tree.paths]


def test_proposer_recycles_a_steps_predictions(chaotic_llama):
    """After one verified step, the next tree below the same root reads what the target predicted."""
    dec = get_decoder("recycling", chaotic_llama, tree=16)
    ids = torch.tensor([[1, 5, 6, 7]])
    out = dec.generate(ids, 12)
    assert out.stats["recycling_rows"] > 0 and out.stats["recycling_matrix_bytes"] == dec.matrix.nbytes
    root = out.tokens[-1]
    written = dec.matrix.written.clone()
    prop = RecyclingProposer(dec.matrix, dec.paths, dec.target)
    p = prop.propose(ProposerState(ids, out.tokens, None, 50, 0.0, None))
    first = p.tokens[:int((p.tree.depth == 1).sum())].tolist()
    assert first == dec.matrix.m[root, :len(first)].tolist()
    # hot start (default): the next prompt starts from this matrix; hot_start=False zeroes it
    dec.make_proposer(ids)
    assert torch.equal(dec.matrix.written, written)
    cold = get_decoder("recycling", chaotic_llama, tree=16, hot_start=False)
    cold.generate(ids, 12)
    cold.make_proposer(ids)
    assert not cold.matrix.written.any()


@pytest.mark.parametrize("cfg", [{"tree": 17}, {"tree": 0}, {"k": 0}, {"k": 4}, {"hot_start": "yes"},
                                 {"tree": "/nonexistent.json"}])
def test_bad_options_are_one_error(chaotic_llama, cfg):
    with pytest.raises(UserError):
        get_decoder("recycling", chaotic_llama, **cfg)
