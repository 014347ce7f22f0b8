"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) on the tree loop.

A draft model proposes ``gamma`` tokens autoregressively on its own KV cache; the target
verifies the chain in one forward (a chain is a tree with one path) and keeps them by exact
match (temperature 0) or speculative sampling (temperature > 0), so the output has the
target's distribution exactly. :class:`AutoregressiveDraft` is the shared drafting
mechanics; :class:`ModelDraft` drafts with a separate causal LM (self-speculative decoding
subclasses it to draft with the target's own layers).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .. import acceptance as acc
from ..cache import crop_to, seq_length
from ..errors import UserError, check_range
from ..models import DTYPES, load_model
from .tree_loop import Proposal, Proposer, ProposerState, TreeDecoder, chain_tree


def resolve_draft(draft, target):
    """The ``draft`` option -> a causal LM sharing the target's vocabulary.

    Args:
        draft: a model object, or a registry name / hub id / folder for
            :func:`common.models.load_model` (loaded with the target's dtype and device).
    """
    if draft is None:
        raise UserError("this decoder needs a draft model; set option draft=<model name, folder or object>")
    if isinstance(draft, str):
        dtype = {v: k for k, v in DTYPES.items()}.get(target.dtype, "float32")
        draft, _ = load_model(draft, dtype=dtype, device=str(target.device))
    v_draft, v_target = draft.config.vocab_size, target.config.vocab_size
    if v_draft != v_target:
        raise UserError(f"draft vocabulary size {v_draft} differs from the target's {v_target}; "
                        "the draft must share the target's tokenizer")
    return draft


class AutoregressiveDraft(Proposer):
    """Drafts a chain of up to ``gamma`` tokens one forward at a time on a private cache.

    Subclasses provide :meth:`new_cache` and :meth:`forward`. After a step with ``a`` of
    ``g`` drafts accepted, the cached positions stay valid up to the root plus
    ``min(a, g-1)`` drafts (the last draft was never fed), so :meth:`update` only crops.
    """

    def __init__(self, gamma: int):
        self.gamma, self.cache, self._pending = gamma, self.new_cache(), None

    def new_cache(self):
        raise NotImplementedError

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Append ``[1, q]`` ids to the draft cache; return ``[V]`` logits of the last one."""
        raise NotImplementedError

    def propose(self, state: ProposerState) -> Proposal:
        g = max(0, min(self.gamma, state.remaining - 1))
        new = state.ids[:, seq_length(self.cache):]  # committed ids the draft has not seen yet
        tokens, q = [], []
        for _ in range(g):
            logits = self.forward(new)
            if state.temperature == 0:
                x = int(logits.argmax())
            else:
                q.append(acc.probs(logits, state.temperature))
                x = acc.sample(q[-1], state.generator)
            tokens.append(x)
            new = torch.tensor([[x]], device=state.ids.device)
        self._pending = (state.ids.shape[1], g)
        draft_probs = None if state.temperature == 0 else (torch.stack(q) if q else torch.empty(0, 0))
        return Proposal(chain_tree(g), torch.tensor(tokens, dtype=torch.long), draft_probs)

    def update(self, num_accepted: int) -> None:
        committed, g = self._pending
        if g:
            crop_to(self.cache, committed + min(num_accepted, g - 1))


class ModelDraft(AutoregressiveDraft):
    """Draft with a separate (smaller) causal LM."""

    def __init__(self, draft, gamma: int):
        self.draft = draft
        super().__init__(gamma)

    def new_cache(self):
        return DynamicCache(config=self.draft.config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.draft(input_ids=ids, past_key_values=self.cache, use_cache=True,
                          logits_to_keep=1).logits[0, -1]


class Speculative(TreeDecoder):
    """Draft-model speculative decoding; exact at every temperature."""

    name = "speculative"
    sampling = "speculative"

    @classmethod
    def options(cls) -> dict:
        return {"draft": None, "gamma": 4, **super().options()}

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        check_range("gamma", self.cfg["gamma"], 1)
        self.draft = resolve_draft(self.cfg["draft"], model)

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        return ModelDraft(self.draft, self.cfg["gamma"])
