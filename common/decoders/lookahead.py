"""Decoder ``lookahead`` (Fu et al., 2024, "Break the Sequential Dependency of LLM Inference
Using Lookahead Decoding"): Jacobi iteration in a 2-D window, an n-gram pool, and a
verification branch, all in one target forward. Training-free.

Written on the shared tree loop from the paper and the authors' public code
(hao-ai-lab/LookaheadDecoding, ``lade/decoding.py``: ``jacobi_greedy_search_multilevel``,
``update_token_map``; ``lade/models/modeling_llama.py``: ``j_make_causal_mask_multilevel``).

**The window.** ``N - 1`` rows of ``W`` columns. Row ``r`` column ``c`` sits at position
``root + c + r`` (``root``: the position of the last committed token, the tree's node 0, which
is row 0 column 0). Row 0 is the current guess of the ``W`` next positions, row ``r`` the
``r``-th Jacobi iterate one position further on. A window cell attends to the cached context,
to row 0's columns ``<= c`` (a causal sequence starting at the root) and to the cells of
column ``c`` in rows ``1..r`` (its own trajectory): the authors' mask. The window enters the
verification forward as an :class:`~common.engine.forward.Injection` at layer 0 (its tokens'
embeddings); tree nodes never attend to injected positions, so the verified logits are exactly
those of decoding the tree alone, and the window's positions leave the cache after the step.

**The pool.** After a step, the last row's greedy predictions ``O[c]`` (for position
``root + c + N - 1``) close one n-gram per column: ``(R_0[c], R_1[c], .., R_{N-2}[c], O[c])``,
stored under its first token ``R_0[c]`` (at most ``guesses`` per key, least recently added
dropped first, as ``update_token_map`` keeps them). The window then slides by one position (as
the authors' ``ALWAYS_FWD_ONE``): row 0 becomes ``[new root] + R_1[1:]``, row ``r`` becomes
``R_{r+1}``, the last row ``O``. While fewer than ``N - 1`` rows exist (the first ``N - 2``
steps) the window instead grows a row (``O`` shifted by one column) and every row drops its
first column; row 0 therefore starts ``W + N - 2`` wide, filled with tokens copied at random
from the prompt (the authors' ``copy_from`` initialisation, seeded here).

**The verification branch.** The pool's n-grams keyed by the root (the newest committed
token), up to ``guesses`` of them, each ``N - 1`` tokens long. The authors verify them as
separate chains; here they are merged into a token trie (shared prefixes verified once, same
accepted path), verified by the tree loop with greedy acceptance: exactly vanilla's tokens.

Cost per step: ``W (N - 1) - 1`` window positions + the trie's nodes, every one through all
layers (reported as ``injected`` and ``proposed`` per step for the limit column).
"""
from __future__ import annotations

import random
from functools import lru_cache

import torch

from ..errors import UserError
from ..engine.forward import Injection, embed
from ..engine.tree import TreeBuffers, build_tree
from .base import Option
from .tree_loop import Proposal, Proposer, ProposerState, StepResult, TreeDecoder


# -- token tries (shared with REST) -----------------------------------------------------------
@lru_cache(maxsize=4096)
def _rank_tree(rank_paths: tuple) -> TreeBuffers:
    """CPU buffers of a rank tree, cached: the same shapes recur step after step."""
    return build_tree(rank_paths)


def token_trie(paths, max_depth: int | None = None) -> tuple[TreeBuffers, list[int]]:
    """Merge token sequences (each a continuation of the root) into a trie.

    Args:
        paths: iterable of token-id sequences; duplicates and shared prefixes merge.
        max_depth: cut every sequence to this many tokens (None: no cut).
    Returns:
        ``(tree on the CPU, [n-1] tokens of nodes 1..n-1 in tree order)``; a tree of the root
        alone when ``paths`` holds nothing. Siblings are ranked by first appearance.
    """
    children: dict[tuple, dict[int, int]] = {(): {}}   # rank path -> {token: child rank}
    node_token: dict[tuple, int] = {}
    for seq in paths:
        prefix: tuple = ()
        for tok in list(seq)[:max_depth]:
            kids = children[prefix]
            if tok not in kids:
                kids[tok] = len(kids)
                node = prefix + (kids[tok],)
                children[node], node_token[node] = {}, int(tok)
            prefix = prefix + (kids[tok],)
    tree = _rank_tree(tuple(sorted(node_token, key=lambda p: (len(p), p))))
    return tree, [node_token[p] for p in tree.paths]


# -- the window -------------------------------------------------------------------------------
def window_allow(rows: int, width: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention among the window's cells and their position offsets from the root.

    Cells are numbered row-major, cell ``(0, 0)`` (the root) first. Cell ``(r, c)`` sees row
    0's columns ``<= c`` and rows ``1..r`` of its own column.

    Returns:
        ``([rows*width, rows*width] bool allow, [rows*width] long offsets c + r)``.
    """
    r = torch.arange(rows, device=device).repeat_interleave(width)   # row of each cell
    c = torch.arange(width, device=device).repeat(rows)              # column of each cell
    allow = ((r[None, :] == 0) & (c[None, :] <= c[:, None])) | \
            ((c[None, :] == c[:, None]) & (r[None, :] >= 1) & (r[None, :] <= r[:, None]))
    return allow, c + r


class LookaheadProposer(Proposer):
    """The window, the pool and the verification trie of one ``generate`` call."""

    def __init__(self, model, prompt: list[int], window: int, ngram: int, guesses: int, seed: int,
                 pool_from_prompt: bool):
        self.model, self.W, self.N, self.G = model, window, ngram, guesses
        self.dev = model.device
        rng = random.Random(seed)
        # row 0 without its root column: W - 1 cells + N - 2 the warm-up steps trim away
        self.rows: list[list[int]] = [[rng.choice(prompt) for _ in range(window + ngram - 3)]]
        self.pool: dict[int, list[tuple]] = {}
        if pool_from_prompt:  # the authors' POOL_FROM_PROMPT option (off by default there too)
            for i in range(len(prompt) - ngram + 1):
                self._add(prompt[i], tuple(prompt[i + 1:i + ngram]))
        self.n_hits = self.n_guessed = 0

    def _add(self, key: int, gram: tuple) -> None:
        """Insert an n-gram tail under its first token; an existing one moves to the newest end."""
        grams = self.pool.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)
        elif len(grams) >= self.G:
            grams.pop(0)
        grams.append(gram)

    def propose(self, state: ProposerState) -> Proposal:
        root = state.tokens[-1]
        self.root = root
        depth = max(0, min(self.N - 1, state.remaining - 1))
        grams = self.pool.get(root, []) if len(self.rows) == self.N - 1 else []  # the authors verify once warm
        tree, toks = token_trie(grams, depth)
        tree = tree.to(self.dev)
        # window cells after the root, row-major (cell (0, 0) is tree node 0)
        width = len(self.rows[0]) + 1
        cells = torch.tensor([t for row in self.rows for t in row], dtype=torch.long, device=self.dev)
        allow, offsets = window_allow(len(self.rows), width, self.dev)
        n, e = tree.size, cells.numel()
        # present at layer 0: the n tree nodes; the window sees only the root among them
        inj_allow = torch.zeros(e, n + e, dtype=torch.bool, device=self.dev)
        inj_allow[:, 0] = allow[1:, 0]
        inj_allow[:, n:] = allow[1:, 1:]
        past = state.prompt.shape[1] + len(state.tokens) - 1   # the root's position
        inj = Injection(0, embed(self.model, cells[None])[0], past + offsets[1:], inj_allow)
        self.n_guessed += len(grams)
        return Proposal(tree, torch.tensor(toks, dtype=torch.long, device=self.dev), injections=[inj])

    def update(self, result: StepResult) -> None:
        width = len(self.rows[0]) + 1
        k = len(self.rows)
        # final states of the last row's cells: the root's is the tree node 0's
        last = result.verified.extra_hidden[(k - 1) * width - 1:k * width - 1] if k > 1 else \
            torch.cat([result.verified.hidden[:1], result.verified.extra_hidden[:width - 1]])
        out = self.model.lm_head(last).argmax(-1).tolist()     # O[c]: position root + c + k
        if result.accepted:
            self.n_hits += 1
        row0 = [self.root] + self.rows[0]
        if k == self.N - 1:
            for c in range(width):
                self._add(row0[c], tuple(self.rows[r][c] for r in range(1, k)) + (out[c],))
            # slide by one position: row r+1 becomes row r, the new root takes row 0's column 0
            self.rows = ([self.rows[1][1:]] if k > 1 else [out[1:]]) + self.rows[2:] + ([out] if k > 1 else [])
        else:
            # warm-up: every row drops its first column (one position on), the new row is O
            self.rows = [row0[2:]] + [row[1:] for row in self.rows[1:]] + [out[1:]]

    def stats(self) -> dict:
        return {"lookahead_steps_hit": self.n_hits, "lookahead_guesses": self.n_guessed}

    def propose_fields(self, propose_s: list[float]) -> dict:
        return {"lookahead_build_s": sum(propose_s)}


class Lookahead(TreeDecoder):
    """Decoder ``lookahead``: window ``window`` (W), n-gram size ``ngram`` (N), at most
    ``guesses`` (G) n-grams verified per step. The authors' MT-Bench run (Llama-2-7B-chat,
    ``applications/run_mtbench.sh``) uses W=15, N=5, G=15: the defaults here."""

    name = "lookahead"
    # the verification branch's n-grams are deterministic candidates (no draft distribution):
    # at temperature > 0 the target samples and the walk follows them
    acceptance_rules = ("greedy", "target_sampling")
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "window": Option(15, (int,), lo=1, hi=256),
                "ngram": Option(5, (int,), lo=2, hi=16), "guesses": Option(15, (int,), lo=1, hi=256),
                "pool_from_prompt": Option(False, (bool,))}

    @classmethod
    def test_configs(cls, model, workdir):
        # small windows for the tiny model; N=2 has no warm-up, N=4 exercises it; a prompt-filled
        # pool makes guesses hit from the first step
        return [{"window": 3, "ngram": 2, "guesses": 2}, {"window": 4, "ngram": 4, "guesses": 3},
                {"window": 2, "ngram": 3, "guesses": 4, "pool_from_prompt": True}]

    def make_proposer(self, input_ids):
        W, N = self.cfg["window"], self.cfg["ngram"]
        prompt = input_ids[0].tolist()
        limit = getattr(self.model.config, "max_position_embeddings", None)
        # the window's farthest cell sits W + N - 3 positions after the root (the warm-up row 0
        # is W + N - 2 wide); it must fit the context from the first step on
        reach = len(prompt) + W + N - 2
        if limit is not None and reach > limit:
            raise UserError(f"lookahead window={W} ngram={N} reaches position {reach - 1} after a "
                            f"{len(prompt)}-token prompt, beyond the model's context of {limit}; valid: "
                            f"window + ngram <= {limit - len(prompt) + 2} for this prompt")
        return LookaheadProposer(self.model, prompt, W, N, self.cfg["guesses"], int(self.cfg["seed"]),
                                 self.cfg["pool_from_prompt"])
