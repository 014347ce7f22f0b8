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


SCHEDULES = ("constant", "heuristic")
# Drafting options (and defaults) of every AutoregressiveDraft decoder; see that class.
DRAFT_OPTIONS = {"gamma": 4, "schedule": "constant", "confidence": 0.0}


def draft_options(cfg: dict) -> dict:
    """Validate a decoder's drafting options; return them as AutoregressiveDraft keywords."""
    check_range("gamma", cfg["gamma"], 1)
    if cfg["schedule"] not in SCHEDULES:
        raise UserError(f"schedule={cfg['schedule']!r} is invalid; valid: {', '.join(SCHEDULES)}")
    check_range("confidence", cfg["confidence"], 0.0, 1.0)
    return {k: cfg[k] for k in DRAFT_OPTIONS}


class AutoregressiveDraft(Proposer):
    """Drafts a chain of up to ``gamma`` tokens one forward at a time on a private cache.

    Subclasses provide :meth:`new_cache` and :meth:`forward`. After a step with ``a`` of
    ``g`` drafts accepted, the cached positions stay valid up to the root plus
    ``min(a, g-1)`` drafts (the last draft was never fed), so :meth:`update` only crops.

    Two knobs shorten wasted drafting; neither touches exactness (the verifier decides):

    * ``confidence``: stop the chain after a drafted token whose draft probability is below
      it (the token itself is still proposed; transformers' ``assistant_confidence_threshold``,
      and BiLD's fallback rule on the small model's confidence). 0 disables it.
    * ``schedule="heuristic"``: transformers' assisted-generation schedule; the draft length
      grows by 2 after a step that accepted all ``gamma`` drafts and shrinks by 1 (to at
      least 1) otherwise. It starts at ``gamma`` on every ``generate`` call (one proposer
      per call), so results do not depend on which prompts ran before.
    """

    def __init__(self, gamma: int, schedule: str = "constant", confidence: float = 0.0):
        self.gamma, self.schedule, self.confidence = gamma, schedule, confidence
        self.cache, self._pending = self.new_cache(), None

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
            if self.confidence and self._prob(logits, x, q, state.temperature) < self.confidence:
                break
            new = torch.tensor([[x]], device=state.ids.device)
        g = len(tokens)
        self._pending = (state.ids.shape[1], g)
        draft_probs = None if state.temperature == 0 else (torch.stack(q) if q else torch.empty(0, 0))
        return Proposal(chain_tree(g), torch.tensor(tokens, dtype=torch.long), draft_probs)

    @staticmethod
    def _prob(logits: torch.Tensor, x: int, q: list, temperature: float) -> float:
        """The draft's probability of its own token ``x`` (at the sampling temperature)."""
        return float(q[-1][x]) if temperature else float(torch.softmax(logits.float(), -1)[x])

    def update(self, num_accepted: int) -> None:
        committed, g = self._pending
        if g:
            crop_to(self.cache, committed + min(num_accepted, g - 1))
        if self.schedule == "heuristic":
            # As transformers does: compare with the scheduled length, not with the drafted
            # one, so a chain cut short by ``confidence`` or by ``remaining`` counts as a miss.
            self.gamma = self.gamma + 2 if num_accepted == self.gamma else max(1, self.gamma - 1)


class ModelDraft(AutoregressiveDraft):
    """Draft with a separate (smaller) causal LM."""

    def __init__(self, draft, gamma: int, schedule: str = "constant", confidence: float = 0.0):
        self.draft = draft
        super().__init__(gamma, schedule, confidence)

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
        return {"draft": None, **DRAFT_OPTIONS, **super().options()}

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.drafting = draft_options(self.cfg)
        self.draft = resolve_draft(self.cfg["draft"], model)

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        return ModelDraft(self.draft, **self.drafting)
