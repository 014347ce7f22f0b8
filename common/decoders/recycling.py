"""Decoder ``recycling`` (Luo et al., 2024, "Turning Trash into Treasure: Accelerating Inference
of Large Language Models with Token Recycling", arXiv 2408.08696). Training-free.

Written on the shared tree loop from the paper and the authors' public code
(Luowaterbi/TokenRecycling, ``model/recycling/tree_template_.py``: the tree template "2.2.2").

**The matrix.** ``M``: ``[V, k]`` token ids, row ``x`` the top-``k`` successors the target
predicted the last time ``x`` was a node of a verified tree (k = 8 in the paper, < 2 MB). It
starts at zero (every row "token 0", as the paper's) and, by default, **persists across
prompts** (the paper's hot start: the matrix is inherited from the previous query;
``hot_start: false`` zeroes it for every prompt).

**Retrieval.** A static, imbalanced tree template (paths of sibling ranks) is filled
breadth-first from the root, the last committed token: the children of a node with token
``x`` at ranks ``r`` are ``M[x, r]``, one gather per depth for the whole layer (the paper's
Algorithm 1). The paper's template has 80 nodes in 6 layers; ``tree`` picks a size of this
machine's liking: the first ``tree`` nodes of the template ordered by ``sum(rank + 1)`` along
the path (a child always after its parent, so each cut is a tree; this order is ours, the
paper gives only the 80-node template), or a tree JSON file.

**Update.** After verification, every node ``x_i`` of the tree (root included) gets
``M[x_i] = topk(logits_i, k)``: the target's predictions at **all** verified positions, accepted
or not. A token that occurs twice in the tree keeps its last node's row (the paper's ablation:
"last occurrence" gives the highest accepted length; its CUDA scatter leaves the choice open).
The tree loop verifies with a lazy LM head (only the rows greedy acceptance reads), so the
proposer applies the head to every node's final state itself (``target.head_rows``); the
accepted path's rows are computed twice (see the note on a loop hook in the report).

Greedy acceptance: exactly vanilla's tokens. Stats: ``recycling_matrix_bytes`` (the matrix's
memory) and ``recycling_rows`` (rows written so far, across prompts with the hot start).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError
from ..engine.tree import TreeBuffers, build_tree, load_tree, save_tree
from .base import Option
from .tree_loop import Proposal, Proposer, ProposerState, StepResult, TreeDecoder, tree_option

# The authors' template "2.2.2" (80 nodes; 8, 21, 25, 15, 8, 3 per depth), paths of sibling ranks.
PAPER_TREE: tuple[tuple[int, ...], ...] = tuple(tuple(p) for p in (
    [0], [1], [2], [3], [4], [5], [6], [7],
    [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3],
    [2, 0], [2, 1], [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0],
    [0, 1, 1], [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0],
    [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1],
    [0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0],
    [3, 0, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
    [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0]))
TREE_SIZES = (8, 16, 24, 32, 48, 64, 80)   # nodes below the root; 80 = the paper's whole template


def template(size: int) -> tuple[tuple[int, ...], ...]:
    """The first ``size`` paths of the paper's template, ordered by ``sum(rank + 1)`` (then
    depth, then the paths themselves): a prefix-closed cut, since a child's key exceeds its
    parent's."""
    order = sorted(PAPER_TREE, key=lambda p: (sum(r + 1 for r in p), len(p), p))
    return tuple(order[:size])


class AdjacencyMatrix:
    """Each token's top-``k`` successors, as last predicted by the target.

    Attributes:
        m: ``[V, k]`` int32 token ids (row ``x``: the successors of ``x``, best first).
        written: ``[V]`` bool, rows updated at least once.
    """

    def __init__(self, vocab: int, k: int, device):
        self.m = torch.zeros(vocab, k, dtype=torch.int32, device=device)
        self.written = torch.zeros(vocab, dtype=torch.bool, device=device)

    @property
    def k(self) -> int:
        return self.m.shape[1]

    @property
    def nbytes(self) -> int:
        return self.m.numel() * self.m.element_size()

    def reset(self) -> None:
        self.m.zero_()
        self.written.zero_()

    def update(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """``M[tokens[i]] = topk(logits[i])``; a repeated token keeps its last row.

        Args:
            tokens: ``[n]`` long, the verified nodes' tokens.
            logits: ``[n, V]`` the target's logits at those nodes (what follows each).
        """
        last = {t: i for i, t in enumerate(tokens.tolist())}   # later occurrences overwrite
        rows = torch.tensor(list(last.values()), dtype=torch.long, device=logits.device)
        keys = torch.tensor(list(last), dtype=torch.long, device=self.m.device)
        top = logits[rows].topk(self.k, dim=-1).indices        # [u, k]
        self.m[keys] = top.to(self.m.device, torch.int32)
        self.written[keys] = True

    def expand(self, root: int, plan: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Fill a tree breadth-first (the paper's Algorithm 1).

        Args:
            plan: per depth ``d = 1..D``: ``([n_d] long position of each node's parent among
                depth ``d-1``'s nodes, [n_d] long its rank)``, nodes in tree order.
        Returns:
            ``[n-1]`` long tokens of nodes ``1..n-1`` in tree order.
        """
        layer = torch.tensor([root], dtype=torch.long, device=self.m.device)
        out = []
        for parent, rank in plan:
            layer = self.m[layer[parent], rank].long()   # one gather per depth
            out.append(layer)
        return torch.cat(out) if out else layer.new_zeros(0)


def expansion_plan(tree: TreeBuffers, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per depth, each node's parent position among the previous depth's nodes and its rank
    (``tree``'s nodes are sorted by depth, so each depth's nodes are a contiguous run)."""
    depth, parents, rank = tree.depth.tolist(), tree.parents.tolist(), tree.rank.tolist()
    pos_in_layer = {0: 0}
    plan, counts = [], {}
    for i in range(1, tree.size):
        pos_in_layer[i] = counts.get(depth[i], 0)
        counts[depth[i]] = pos_in_layer[i] + 1
    for d in range(1, (max(depth) if depth else 0) + 1):
        nodes = [i for i in range(1, tree.size) if depth[i] == d]
        plan.append((torch.tensor([pos_in_layer[parents[i]] for i in nodes], dtype=torch.long, device=device),
                     torch.tensor([rank[i] for i in nodes], dtype=torch.long, device=device)))
    return plan


class RecyclingProposer(Proposer):
    """The template filled from the matrix; after each step the matrix takes every node's top-k."""

    def __init__(self, matrix: AdjacencyMatrix, paths: tuple, target):
        self.matrix, self.paths, self.target = matrix, paths, target
        self.dev = target.device
        self._trees: dict[int, tuple] = {}   # depth cap -> (tree on the device, plan)
        self.tree_tokens: torch.Tensor | None = None

    def _tree(self, cap: int):
        if cap not in self._trees:
            kept = [p for p in self.paths if len(p) <= cap]
            tree = build_tree(kept).to(self.dev)
            self._trees[cap] = (tree, expansion_plan(tree, self.dev))
        return self._trees[cap]

    def propose(self, state: ProposerState) -> Proposal:
        tree, plan = self._tree(max(0, state.remaining - 1))
        root = state.tokens[-1]
        toks = self.matrix.expand(root, plan)
        self.tree_tokens = torch.cat([torch.tensor([root], dtype=torch.long, device=self.dev), toks])
        return Proposal(tree, toks)

    def update(self, result: StepResult) -> None:
        # the target's predictions at every verified node, accepted or not
        nodes = torch.arange(result.proposal.tree.size, device=self.dev)
        self.matrix.update(self.tree_tokens, self.target.head_rows(result.verified, nodes))

    def stats(self) -> dict:
        return {"recycling_matrix_bytes": self.matrix.nbytes,
                "recycling_rows": int(self.matrix.written.sum())}


class Recycling(TreeDecoder):
    """Decoder ``recycling``: ``tree`` (a template size, see :data:`TREE_SIZES`, or a tree JSON
    file whose ranks are below ``k``), ``k`` successors a token, ``hot_start`` (keep the matrix
    across prompts, the paper's default)."""

    name = "recycling"
    acceptance_rules = ("greedy", "target_sampling")   # a deterministic tree, no draft distribution
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "tree": tree_option(80, sizes=TREE_SIZES),
                "k": Option(8, (int,), lo=1, hi=64), "hot_start": Option(True, (bool,))}

    @classmethod
    def test_configs(cls, model, workdir):
        # the paper's tree, a small cut, and a cold matrix with k=2 on a file tree
        folder = Path(workdir) / "recycling"
        folder.mkdir(parents=True, exist_ok=True)
        save_tree(folder / "tree.json", [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])
        return [{}, {"tree": 16}, {"tree": str(folder / "tree.json"), "k": 2, "hot_start": False}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        t, k = self.cfg["tree"], self.cfg["k"]
        self.paths = template(t) if isinstance(t, int) else load_tree(Path(t)).paths
        worst = max((r for p in self.paths for r in p), default=0)
        if worst >= k:
            raise UserError(f"recycling tree ranks reach {worst}, but the matrix keeps k={k} successors a token; "
                            f"valid: k >= {worst + 1} for this tree")
        # rows for every id the head can predict or the prompt can hold
        vocab = max(int(model.config.vocab_size), int(model.lm_head.weight.shape[0]))
        self.matrix = AdjacencyMatrix(vocab, k, self.device)

    def make_proposer(self, input_ids):
        if not self.cfg["hot_start"]:
            self.matrix.reset()
        return RecyclingProposer(self.matrix, self.paths, self.target)
