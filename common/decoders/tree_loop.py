"""Generic tree verification: Medusa's four phases around a pluggable proposer.

Each step: ``generate_candidates`` (the proposer builds a token tree below the root, the last
committed token) -> ``tree_decoding`` (one target forward over the tree with its ancestor
mask and positions) -> ``evaluate_posterior`` (pick the accepted path and the next token) ->
``update_inputs_and_kv`` (keep the accepted path in the KV cache, append the next token).

Proposers are separate from the verifier (transformers' candidate-generator split): a draft
model, the target skipping layers, Medusa heads or prompt lookup all hand a
:class:`Proposal` to the same loop, which hands back what they need to propose again.

Cache invariant: the target cache holds every committed token except the newest one, which
is the next tree's root (node 0) and is processed by the next tree forward.

Temperature 0 commits exactly the target's greedy tokens. At temperature > 0 the rule is
``sampling``: ``"speculative"`` (chain proposals carrying their draft probabilities; exact in
distribution) or ``"typical"`` (Medusa's typical acceptance; not exact).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers import DynamicCache

from .. import acceptance as acc
from ..cache import accept_path, crop_to
from ..errors import check_range
from ..forward import tree_forward
from ..tree import TreeBuffers, build_tree, chain_paths
from .base import DecodeOutput, Decoder


@dataclass
class ProposerState:
    """What a proposer sees before each step.

    Attributes:
        ids: ``[1, S]`` committed ids, prompt included; ``ids[0, -1]`` is the next tree's root.
        hidden: ``[1, k, H]`` target last hidden states (after the final norm, the LM head's
            input) at the ``k`` positions the last target forward committed: the prompt after
            the prefill, the accepted path (root first) after a step. ``hidden[:, -1]`` is the
            state that produced the root. ``None`` unless the proposer sets ``needs_hidden``.
        remaining: new tokens still allowed, the root's successors included; a proposal
            deeper than ``remaining - 1`` is wasted (the step adds one token of its own).
        temperature: the decoder's sampling temperature (0 = greedy).
        generator: the decoder's seeded RNG; proposers that sample must draw from it.
    """
    ids: torch.Tensor
    hidden: torch.Tensor | None
    remaining: int
    temperature: float
    generator: torch.Generator | None


@dataclass
class Proposal:
    """A candidate tree below the root.

    Attributes:
        tree: the tree's buffers (node 0 = root).
        tokens: ``[n-1]`` long, tokens of nodes ``1..n-1`` in tree order (the root is known).
        draft_probs: ``[n-1, V]`` distribution each node's token was drawn from; required by
            ``sampling = "speculative"`` (chains only), ignored otherwise.
    """
    tree: TreeBuffers
    tokens: torch.Tensor
    draft_probs: torch.Tensor | None = None


class Proposer:
    """Interface of a candidate source. One instance serves one ``generate`` call."""

    needs_hidden = False  # ask the verifier for target hidden states (Medusa, FIRP, PPD)

    def propose(self, state: ProposerState) -> Proposal:
        raise NotImplementedError

    def update(self, num_accepted: int) -> None:
        """Told after each step how many proposed tokens (root excluded) were accepted."""


@lru_cache(maxsize=64)
def chain_tree(length: int) -> TreeBuffers:
    """Buffers of the chain of ``length`` nodes below the root, built once per length."""
    return build_tree(chain_paths(length))


def candidates_from_topk(tree: TreeBuffers, topk: torch.Tensor) -> torch.Tensor:
    """Node tokens of a rank tree from per-depth top-k lists (Medusa heads, prompt tokens).

    Args:
        topk: ``[D, K]`` long, ``topk[d-1]`` the candidates for depth ``d`` in rank order.
    Returns:
        ``[n-1]`` tokens of nodes ``1..n-1``: node ``(r_1, .., r_d)`` gets ``topk[d-1, r_d]``.
    """
    return topk[tree.depth[1:] - 1, tree.rank[1:]]


class TreeDecoder(Decoder):
    """Base class of tree-verified decoders; subclasses implement :meth:`make_proposer`."""

    name = "tree"
    lossless = True  # at temperature 0
    sampling = "typical"  # rule at temperature > 0: "typical" or "speculative"

    @classmethod
    def options(cls) -> dict:
        return {"temperature": 0.0, "seed": 0}

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        check_range("temperature", self.cfg["temperature"], 0)

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        raise NotImplementedError

    # -- the four phases -------------------------------------------------------------------
    def generate_candidates(self, proposer: Proposer, state: ProposerState) -> tuple[Proposal, torch.Tensor]:
        """Ask the proposer for a tree; returns it and its ``[n]`` node tokens, root first."""
        proposal = proposer.propose(state)
        assert proposal.tokens.numel() == proposal.tree.size - 1, "one token per non-root node"
        return proposal, torch.cat([state.ids[0, -1:], proposal.tokens.to(state.ids.device)])

    def tree_decoding(self, tree_tokens: torch.Tensor, tree: TreeBuffers, cache,
                      want_hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One target forward over the tree; returns ``[n, V]`` logits and ``[n, H]`` hidden
        states (final, normed) or None."""
        out = tree_forward(self.model, tree_tokens[None], cache, tree.ancestor_mask, tree.depth,
                           output_hidden_states=want_hidden)
        return out.logits[0], (out.hidden_states[-1][0] if want_hidden else None)

    def evaluate_posterior(self, proposal: Proposal, tree_tokens: torch.Tensor,
                           logits: torch.Tensor, gen: torch.Generator | None) -> tuple[torch.Tensor, int]:
        """Pick the accepted path and the next token.

        Returns:
            ``([a+1] accepted node indices, root first; next token id)``.
        """
        t, retrieve = self.cfg["temperature"], proposal.tree.retrieve_indices
        if t == 0:
            row, a = acc.greedy_accept(tree_tokens, logits, retrieve)
        elif self.sampling == "speculative":
            assert retrieve.shape[0] == 1 and proposal.draft_probs is not None, \
                "speculative sampling needs a chain proposal with its draft probabilities"
            path = retrieve[0]
            a, nxt = acc.speculative_accept(proposal.tokens, acc.probs(logits[path], t),
                                            proposal.draft_probs, gen)
            return path[: a + 1], nxt
        else:
            row, a = acc.typical_accept(tree_tokens, logits, retrieve, t)
        path = retrieve[row, : a + 1]
        return path, self.next_token(logits[path[-1]], gen)

    def update_inputs_and_kv(self, cache, prefix_len: int, path: torch.Tensor,
                             tree_tokens: torch.Tensor, nxt: int) -> list[int]:
        """Keep the accepted path in the cache; return the new committed tokens."""
        if torch.equal(path, torch.arange(path.numel())):
            crop_to(cache, prefix_len + path.numel())  # a prefix of the node order: no copy needed
        else:
            accept_path(cache, prefix_len, path)
        return tree_tokens[path[1:]].tolist() + [nxt]

    # -- the loop ----------------------------------------------------------------------------
    def next_token(self, logits: torch.Tensor, gen: torch.Generator | None) -> int:
        """The token after ``[V]`` logits outside speculative acceptance (prefill, bonus)."""
        t = self.cfg["temperature"]
        if t == 0:
            return int(logits.argmax())
        if self.sampling == "typical":
            return acc.typical_sample(logits, t, gen)
        return acc.sample(acc.probs(logits, t), gen)

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        gen = torch.Generator(device=input_ids.device).manual_seed(int(self.cfg["seed"]))
        proposer = self.make_proposer(input_ids)
        want_hidden = proposer.needs_hidden
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                         logits_to_keep=1, output_hidden_states=want_hidden)
        tokens = [self.next_token(out.logits[0, -1], gen)]
        hidden = out.hidden_states[-1] if want_hidden else None
        accept_lengths = [1]  # the prefill is step 1 (Spec-Bench)
        tokens, done = self.truncate(tokens, max_new_tokens)
        while not done:
            ids = torch.cat([input_ids, torch.tensor([tokens], device=input_ids.device)], dim=1)
            state = ProposerState(ids, hidden, max_new_tokens - len(tokens), self.cfg["temperature"], gen)
            proposal, tree_tokens = self.generate_candidates(proposer, state)
            prefix_len = cache.get_seq_length()
            logits, tree_hidden = self.tree_decoding(tree_tokens, proposal.tree, cache, want_hidden)
            path, nxt = self.evaluate_posterior(proposal, tree_tokens, logits, gen)
            new = self.update_inputs_and_kv(cache, prefix_len, path, tree_tokens, nxt)
            proposer.update(path.numel() - 1)
            hidden = tree_hidden[path][None] if want_hidden else None
            before = len(tokens)
            tokens, done = self.truncate(tokens + new, max_new_tokens)
            accept_lengths.append(len(tokens) - before)
        return DecodeOutput(tokens, {"steps": len(accept_lengths), "accept_lengths": accept_lengths})
