"""Parallel prompt decoding on the shared tree loop: decoder ``prompt_decoding``.

Each step is one target forward (:meth:`common.engine.target.Target.verify`) over

* the candidate tree: the root (the last committed token) and candidates drawn from the
  guesses the prompt tokens made in the previous step, arranged as a sparse tree;
* the prompt tokens attached to every tree node, entering as input embeddings
  (:class:`common.engine.forward.Injection` at layer 0): node ``c``'s prompt token ``j`` sits at
  ``c``'s position + ``j`` + 1 and attends to ``c``, its ancestors and, among its own EPTs, as
  the EPT mask says (:func:`prompt_decoding.prompt_tokens.ept_allow`). Tree nodes never attend to
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
from common.engine.forward import Injection
from common.training.loop import fingerprint, load_trained, save_trained
from common.engine.tree import TreeBuffers, build_tree, resolve_tree
from common.engine.tree_search import PRIOR_ACC

from .prompt_tokens import MASKS, Extras, PromptTokens
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


def load_prompt_tokens(decoder, model, train_cmd: str = "python -m prompt_decoding.train"
                       ) -> tuple[PromptTokens, dict[int, StateTree]]:
    """The prompt tokens of ``decoder.cfg["prompt_tokens"]`` (a training's folder), checked to
    be trained for ``model`` (the decoder's target, or the draft that runs them), and the
    tree of every state for the decoder's ``tree`` and ``shape`` options."""
    def meta_for(meta):  # how they were trained (distill, cuts, ...) is not checked against the model
        m, n, mask = int(meta.get("m", 0)), int(meta.get("n", 0)), meta.get("mask")
        if mask not in MASKS:
            return {"mask": f"one of {MASKS}"}
        return {**meta, **prompts_meta(model, m, n, mask, Extras.from_meta(meta))}
    _, state = decoder.trained_component("prompt_tokens", "prompts.pt", train_cmd, meta_for)
    meta = state["identity"]["meta"]
    m, n, mask, extras = meta["m"], meta["n"], meta["mask"], Extras.from_meta(meta)
    if extras.prefix or extras.exits > 1:
        raise UserError(f"prompt tokens at {decoder.cfg['prompt_tokens']} were trained with "
                        f"{'prefix tuning' if extras.prefix else 'a multi-exit ensemble'}, an accuracy ablation "
                        "(the paper's Appendix B); valid for decoding: checkpoints without prefix or exits "
                        "(average or learned EPT weights, with or without a custom head)")
    prompts = new_prompts(model, m, n, mask, extras=extras)
    load_trained(prompts, state)
    return prompts, make_trees(decoder.cfg["tree"], decoder.cfg["shape"], state.get("acc") or PRIOR_ACC, m)


def make_trees(tree, shape: str, acc, m: int) -> dict[int, StateTree]:
    """One tree per state ``1..m`` (the accepted node's prompt tokens = guesses available):
    ``tree`` a size in verified positions (the dynamic sparse tree, or the largest static one
    within it, for the accuracies ``acc``) or a tree file (static)."""
    tree = resolve_tree(tree, m, f"what the {m} prompt tokens can guess")
    if not isinstance(tree, int):  # a tree file's paths
        paths = tree
        return {k: StateTree(tuple(p for p in paths if len(p) <= k), (m,) * (1 + sum(len(p) <= k for p in paths)))
                for k in range(1, m + 1)}
    if shape == "static":  # the largest static tree within the size
        n_c = max(0, tree // (m + 1) - 1)  # (n_c + 1) nodes, each itself + m prompt tokens
        return static(acc, m, n_c)
    return best_split(acc, m, tree)[0]


class PromptProposer(Proposer):
    """Candidates from the previous step's prompt-token guesses, on the tree of the current
    state (how many prompt tokens the accepted node carried); prompt tokens on every node.

    The guesses are read out lazily: :meth:`update` keeps the final states of the accepted
    node's prompt tokens (``source``) and :meth:`propose` turns them into top-k guesses, so a
    caller that moves the sequence elsewhere (``pd_speculative``'s draft after the target
    rejects) points :meth:`resume` at another node's prompt tokens and no readout is wasted.
    """

    def __init__(self, target, prompts: PromptTokens, trees: dict[int, StateTree], device):
        self.target, self.prompts, self.trees, self.device = target, prompts, trees, device
        self.width = max((r for t in trees.values() for p in t.paths for r in p), default=0) + 1
        self.source: torch.Tensor | None = None   # [k*n, H] states of the prompt tokens guessing below the next root
        self.carry: list[int] = []
        self.head_rows = 0

    def guesses(self, state: ProposerState) -> torch.Tensor:
        """``[k, width]`` top-``width`` guesses for depths ``1..k`` below the root, from the
        prompt-token states ``source`` (called only when it is set)."""
        self.head_rows += self.source.shape[0]
        logits = self.prompts.readout(self.source, self.target.model.lm_head)     # [k, V]
        return logits.topk(self.width, dim=-1).indices

    def propose(self, state: ProposerState) -> Proposal:
        k = 0 if self.source is None else self.source.shape[0] // self.prompts.n   # guessed distances
        depth = min(k, max(state.remaining - 1, 0))
        t = self.trees[k] if k else StateTree((), (self.prompts.m,))  # no guesses: the root alone
        tree, self.carry = _tree(t.paths, t.carry, depth)
        tree = tree.to(self.device)
        # read the guesses out only when candidates use them (not for a root-only tree)
        tokens = (candidates_from_topk(tree, self.guesses(state)) if tree.size > 1
                  else torch.zeros(0, dtype=torch.long, device=self.device))
        inj = node_prompt_injection(tree, self.prompts, self.carry, self.target.length)
        return Proposal(tree, tokens, injections=[inj])

    def node_rows(self, result: StepResult, node: int) -> torch.Tensor:
        """``[carry*n, H]`` final states of the prompt tokens tree node ``node`` carried in the
        step of ``result`` (they guess the tokens after the one following ``node``)."""
        start, count = block_rows(self.carry, self.prompts.n, node)
        return result.verified.extra_hidden[start:start + count]

    def resume(self, rows: torch.Tensor | None) -> None:
        """Guess below the next root from these prompt-token states (:meth:`node_rows` of the
        node just before it); None: no guesses, the next tree is the root alone."""
        self.source = rows

    def update(self, result: StepResult) -> None:
        self.resume(self.node_rows(result, int(result.path[-1])))

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
    # the paper samples with Medusa's typical acceptance (lossy), kept by name (acceptance=typical);
    # the prompt tokens' top-k tree is fixed before verification, so target_sampling is exact
    default_sampling = "target_sampling"

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
        self.prompts, self.trees = load_prompt_tokens(self, model)

    def make_proposer(self, input_ids):
        return PromptProposer(self.target, self.prompts, self.trees, self.device)
