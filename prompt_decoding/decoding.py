"""Parallel prompt decoding on the shared tree loop: decoder ``prompt_decoding``.

Each step is one target forward (:meth:`common.target.Target.verify`) over

* the candidate tree: the root (the last committed token) and candidates drawn from the
  guesses the prompt tokens made in the previous step, arranged as a sparse tree;
* the prompt tokens attached to every tree node, entering as input embeddings
  (:class:`common.forward.Injection` at layer 0): node ``c``'s prompt token ``j`` sits at
  ``c``'s position + ``j`` + 1 and attends to ``c``, its ancestors and, among its own EPTs, as
  the EPT mask says (:func:`prompt_decoding.prompts.ept_allow`). Tree nodes never attend to
  prompt tokens, so the candidates' logits are the model's own and greedy acceptance is exact.

The rule accepts a path; the prompt tokens attached to its last node give the next step's
guesses (their EPT-averaged logits' top-k per distance), and their cache entries are dropped
with every other position off the accepted path. The first step after the prefill has no
guesses: its tree is the root alone, carrying the prompt tokens.

The tree changes with the state (how many prompt tokens the accepted node carried):
:mod:`prompt_decoding.sparse_tree` builds the paper's dynamic sparse tree (prompt tokens
allotted per node) or the static one (every node carries all ``m``) for the checkpoint's
measured guess accuracies; :mod:`prompt_decoding.train` trains the prompt tokens.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from common.decoders.base import Option
from common.decoders.tree_loop import (Proposal, Proposer, ProposerState, StepResult, TreeDecoder,
                                       candidates_from_topk, tree_option)
from common.errors import UserError
from common.forward import Injection
from common.training import fingerprint, load_trained, save_trained
from common.tree import TreeBuffers, build_tree, load_tree
from common.tree_search import PRIOR_ACC

from .prompts import MASKS, Extras, PromptTokens
from .sparse_tree import StateTree, best_split, static



def prompts_meta(model, m: int, n: int, mask: str, extras: Extras = Extras()) -> dict:
    """What a prompt-token checkpoint is tied to: the base model, its own shape, and the
    appendix options that differ from the paper's method."""
    return {**fingerprint(model), "m": m, "n": n, "mask": mask, **extras.meta()}


def new_prompts(model, m: int = 3, n: int = 1, mask: str = "ensemble", seed: int = 0,
                init: torch.Tensor | None = None, extras: Extras = Extras()) -> PromptTokens:
    """Untrained prompt tokens for ``model``, on its device and dtype (made on the CPU with a
    seeded generator first, whatever the default device); ``init``: see :class:`PromptTokens`.
    A custom head starts as a copy of the LM head; prefixes start from the keys and values the
    model computes for the last ``extras.prefix`` init embeddings (small random ones without)."""
    head_init = model.lm_head.weight.detach().float().cpu() if extras.head else None
    prefix_init = _prefix_init(model, init, extras.prefix, seed) if extras.prefix else None
    with torch.device("cpu"):
        p = PromptTokens(model.config.hidden_size, m, n, mask, init=None if init is None else init.cpu(), seed=seed,
                         extras=extras, head_init=head_init, prefix_init=prefix_init)
    return p.to(model.device, model.dtype)


@torch.no_grad()
def _prefix_init(model, init: torch.Tensor | None, p: int, seed: int) -> torch.Tensor:
    """``[d, 2, kv_heads, p, head_dim]`` starting keys/values of one prompt token's prefix."""
    if init is None:
        c = model.config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        shape = (c.num_hidden_layers, 2, getattr(c, "num_key_value_heads", None) or c.num_attention_heads, p, hd)
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02
    init = init.reshape(-1, init.shape[-1])
    cache = model(inputs_embeds=init[None].to(model.device, model.dtype), use_cache=True).past_key_values
    k = init.shape[0]
    take = (torch.arange(p) + k - p) % k                                  # the last p positions (cycled if k < p)
    return torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])[:, :, :, take].float().cpu()


def node_prompt_injection(tree: TreeBuffers, prompts: PromptTokens, carry: list[int], past: int) -> Injection:
    """The prompt tokens attached to the nodes of ``tree`` as one layer-0 injection.

    Args:
        carry: ``[n]`` prompt tokens node ``c`` carries (0..m); EPTs in order (node, j, i).
        past: cached positions before the root.
    Returns:
        an :class:`Injection` of ``sum(carry) * n`` positions: states ``[E, H]``, positions
        ``past + depth(c) + 1 + j``, and ``allow`` ``[E, N + E]`` (ancestors of ``c`` among the
        nodes; among the injected, the EPT mask within ``c``'s own block).
    """
    dev, n, N = tree.device, prompts.n, tree.size
    block = prompts.allow(dev)                                              # [m*n, m*n]
    E = sum(carry) * n
    allow = torch.zeros(E, N + E, dtype=torch.bool, device=dev)
    states, pos, start = [], [], 0
    for c in range(N):
        e = carry[c] * n
        if not e:
            continue
        allow[start:start + e, :N] = tree.ancestor_mask[c]                  # the node and its ancestors
        allow[start:start + e, N + start:N + start + e] = block[:e, :e]     # its own EPTs, as the mask says
        states.append(prompts.embeddings[:carry[c]].reshape(e, -1))
        pos.append(past + int(tree.depth[c]) + 1 + torch.arange(carry[c], device=dev).repeat_interleave(n))
        start += e
    return Injection(0, torch.cat(states), torch.cat(pos), allow)


def block_rows(carry: list[int], n: int, node: int) -> tuple[int, int]:
    """``(start, count)`` of node ``node``'s EPT rows among the injected positions."""
    start = sum(k * n for k in carry[:node])
    return start, carry[node] * n


@lru_cache(maxsize=256)
def _tree(paths: tuple, carry: tuple, depth: int) -> tuple[TreeBuffers, list[int]]:
    """The tree of ``paths`` cut at ``depth``, and each node's prompt tokens in its node order
    (``carry[0]`` the root's, ``carry[i + 1]`` that of ``paths[i]``)."""
    own = dict(zip([(), *paths], carry))
    tree = build_tree([p for p in paths if len(p) <= depth])
    return tree, [own[()]] + [own[tuple(p)] for p in tree.paths]


class PromptProposer(Proposer):
    """Candidates from the previous step's prompt-token guesses, on the tree of the current
    state (how many prompt tokens the accepted node carried); prompt tokens on every node."""

    def __init__(self, target, prompts: PromptTokens, trees: dict[int, StateTree], device):
        self.target, self.prompts, self.trees, self.device = target, prompts, trees, device
        self.width = max((r for t in trees.values() for p in t.paths for r in p), default=0) + 1
        self.guesses: torch.Tensor | None = None   # [k, width] top-k per distance
        self.carry: list[int] = []
        self.head_rows = 0

    def propose(self, state: ProposerState) -> Proposal:
        k = 0 if self.guesses is None else self.guesses.shape[0]
        depth = min(k, max(state.remaining - 1, 0))
        t = self.trees[k] if k else StateTree((), (self.prompts.m,))  # after the prefill: the root alone
        tree, self.carry = _tree(t.paths, t.carry, depth)
        tree = tree.to(self.device)
        tokens = (candidates_from_topk(tree, self.guesses[:, :self.width]) if tree.size > 1
                  else torch.zeros(0, dtype=torch.long, device=self.device))
        inj = node_prompt_injection(tree, self.prompts, self.carry, self.target.length)
        return Proposal(tree, tokens, injections=[inj])

    def update(self, result: StepResult) -> None:
        last = int(result.path[-1])
        start, count = block_rows(self.carry, self.prompts.n, last)
        hidden = result.verified.extra_hidden[start:start + count]             # [k*n, H]
        self.head_rows += count
        guesses = self.prompts.readout(hidden, self.target.model.lm_head)     # [k, V]
        self.guesses = guesses.topk(self.width, dim=-1).indices

    def stats(self) -> dict:
        return {"prompt_head_rows": self.head_rows}


SHAPES = ("dynamic", "static")


class PromptDecoding(TreeDecoder):
    """Decoder ``prompt_decoding``: prompt tokens from ``prompt_tokens`` (a folder written by
    the training, ``prompts.pt``); ``tree``: the verified positions per step (root, candidates
    and prompt tokens) of a ``shape="dynamic"`` sparse tree (section 4.2) or of a ``"static"``
    one (every node carries all ``m`` prompt tokens), built for the checkpoint's measured guess
    accuracies (a prior when it has none); or a tree file of candidate paths (static)."""

    name = "prompt_decoding"
    default_sampling = "typical"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "prompt_tokens": Option(None, (str, Path)),
                "tree": tree_option(24, 2, 512, "verified positions"),
                "shape": Option("dynamic", (str,), choices=SHAPES)}

    @classmethod
    def test_configs(cls, model, workdir):
        """Random prompt embeddings (scaled up, so they sway the guesses): exactness must not
        depend on what the prompt tokens propose. Each EPT mask, one and several EPTs."""
        out = []
        for m, n, mask in ((3, 1, "ensemble"), (2, 3, "ensemble"), (2, 2, "decoder"), (2, 2, "encoder")):
            folder = Path(workdir) / f"prompts_{m}_{n}_{mask}"
            p = new_prompts(model, m, n, mask, seed=m * 10 + n)
            with torch.no_grad():
                p.embeddings.mul_(50.0)
            save_trained(p, folder / "prompts.pt", prompts_meta(model, m, n, mask))
            out.append({"prompt_tokens": str(folder), "tree": 14})
        out.append({**out[0], "shape": "static"})
        return out

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        def meta_for(meta):  # how they were trained (distill, cuts, ...) is not checked against the model
            m, n, mask = int(meta.get("m", 0)), int(meta.get("n", 0)), meta.get("mask")
            if mask not in MASKS:
                return {"mask": f"one of {MASKS}"}
            return {**meta, **prompts_meta(model, m, n, mask, Extras.from_meta(meta))}
        _, state = self.trained_component("prompt_tokens", "prompts.pt", "python -m prompt_decoding.train", meta_for)
        meta = state["identity"]["meta"]
        m, n, mask, extras = meta["m"], meta["n"], meta["mask"], Extras.from_meta(meta)
        if extras.prefix or extras.exits > 1:
            raise UserError(f"prompt tokens at {self.cfg['prompt_tokens']} were trained with "
                            f"{'prefix tuning' if extras.prefix else 'a multi-exit ensemble'}, an accuracy ablation "
                            "(the paper's Appendix B); valid for decoding: checkpoints without prefix or exits "
                            "(average or learned EPT weights, with or without a custom head)")
        self.prompts = new_prompts(model, m, n, mask, extras=extras)
        load_trained(self.prompts, state)
        self.trees = self.make_trees(self.cfg["tree"], state.get("acc") or PRIOR_ACC, m)

    def make_trees(self, tree, acc, m: int) -> dict[int, StateTree]:
        """One tree per state ``1..m`` (the accepted node's prompt tokens = guesses available)."""
        if not isinstance(tree, int):
            paths = tuple(tuple(p) for p in load_tree(tree).paths)
            if max(map(len, paths), default=0) > m:
                raise UserError(f"tree {tree} is deeper than the {m} prompt tokens can guess")
            return {k: StateTree(tuple(p for p in paths if len(p) <= k), (m,) * (1 + sum(len(p) <= k for p in paths)))
                    for k in range(1, m + 1)}
        if self.cfg["shape"] == "static":  # the largest static tree within the size
            n_c = max(0, tree // (m + 1) - 1)  # (n_c + 1) nodes, each itself + m prompt tokens
            return static(acc, m, n_c)
        return best_split(acc, m, tree)[0]

    def make_proposer(self, input_ids):
        return PromptProposer(self.target, self.prompts, self.trees, self.device)
