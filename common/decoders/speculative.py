"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) on the tree loop.

A draft model proposes ``gamma`` tokens autoregressively on its own KV cache; the target
verifies the chain in one forward (a chain is a tree with one path) and keeps them by exact
match (temperature 0) or speculative sampling (temperature > 0), so the output has the
target's distribution exactly. :class:`AutoregressiveDraft` is the shared drafting
mechanics, on a draft :class:`~common.engine.target.Target`: a separate model here, the target's own
layers in self-speculative decoding.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from ..engine import acceptance as acc
from ..errors import UserError
from ..assets.models import DTYPES, load_model
from ..engine.target import Target, make_target, model_kind
from .base import Option
from .tree_loop import Proposal, Proposer, ProposerState, StepResult, TreeDecoder, chain_tree


def resolve_draft(draft, target):
    """The ``draft`` option -> a model of the target's kind sharing its vocabulary.

    Args:
        draft: a model object, or a registry name / hub id / folder for
            :func:`common.assets.models.load_model` (loaded with the target's dtype and device).
    """
    if draft is None:
        raise UserError("this decoder needs a draft model; set option draft=<model name, folder or object>")
    if isinstance(draft, (str, Path)):
        dtype = {v: k for k, v in DTYPES.items()}.get(target.dtype, "float32")
        # the draft runs the same forward path as the target (a fair draft cost)
        draft, _ = load_model(str(draft), dtype=dtype, device=str(target.device),
                              fast=bool(getattr(target, "_fast_path", False)))
    if model_kind(draft) != model_kind(target):
        raise UserError(f"the draft is a {model_kind(draft)} model but the target is {model_kind(target)}; "
                        "valid: a draft of the same kind (causal with causal, encoder-decoder with encoder-decoder)")
    v_draft, v_target = draft.config.vocab_size, target.config.vocab_size
    if v_draft != v_target:
        raise UserError(f"draft vocabulary size {v_draft} differs from the target's {v_target}; "
                        "the draft must share the target's tokenizer")
    return draft


SCHEDULES = ("constant", "heuristic")
# Drafting options of every AutoregressiveDraft decoder (speculative, self_speculative; BiLD's
# small model reuses the confidence cut as its fallback rule); see that class.
DRAFT_OPTIONS = {"gamma": Option(4, (int,), lo=1), "schedule": Option("constant", (str,), choices=SCHEDULES),
                 "confidence": Option(0.0, (float,), lo=0.0, hi=1.0)}


def draft_options(cfg: dict) -> dict:
    """A decoder's (validated) drafting options as AutoregressiveDraft keywords."""
    return {k: cfg[k] for k in DRAFT_OPTIONS}


def perturbed_copy(model, scale: float = 0.002, seed: int = 7):
    """A copy of ``model`` with small random weight noise: a draft that agrees with the
    target for a few tokens at a time (for tests of draft-based decoders)."""
    near = copy.deepcopy(model)
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in near.parameters():
            p.add_((scale * torch.randn(p.shape, generator=g, device="cpu")).to(p.device, p.dtype))
    return near


class AutoregressiveDraft(Proposer):
    """Drafts a chain of up to ``gamma`` tokens one forward at a time on a draft
    :class:`~common.engine.target.Target` (a separate model, or the target skipping layers).

    After a step with ``a`` of ``g`` drafts accepted, the draft's cached positions stay valid
    up to the root plus ``min(a, g-1)`` drafts (the last draft was never fed), so
    :meth:`update` only crops.

    Knobs that shorten wasted drafting; none touches exactness (the verifier decides):

    * ``confidence``: stop the chain after a drafted token whose draft probability is below
      it (the token itself is still proposed; transformers' ``assistant_confidence_threshold``).
      0 disables it.
    * ``fallback``: stop the chain *before* a token whose maximum draft probability is below
      it (the token is dropped and the target produces that position itself; Big Little
      Decoder's fallback policy). 0 disables it.
    * ``schedule="heuristic"``: transformers' assisted-generation schedule; the draft length
      grows by 2 after a step that accepted all ``gamma`` drafts and shrinks by 1 (to at
      least 1) otherwise. It starts at ``gamma`` on every ``generate`` call (one proposer
      per call), so results do not depend on which prompts ran before.
    """

    def __init__(self, target: Target, gamma: int, schedule: str = "constant", confidence: float = 0.0,
                 fallback: float = 0.0):
        self.target, self.gamma, self.schedule, self.confidence = target, gamma, schedule, confidence
        self.fallback = fallback
        self.fallbacks = 0  # chains cut by ``fallback``
        self._pending = None

    def propose(self, state: ProposerState) -> Proposal:
        g = max(0, min(self.gamma, state.remaining - 1))
        tokens, q = [], []
        dev = state.prompt.device
        if g:
            if self.target.prompt is None:
                self.target.begin(state.prompt)
            logits = self.target.sync(state.tokens)  # committed tokens the draft has not seen yet
        synced, fed = self.target.length, 0
        for i in range(g):
            if i:
                logits = self.target.extend(torch.tensor([[tokens[-1]]], device=dev))[0][-1]
                fed += 1
            if self.fallback and float(torch.softmax(logits.float(), -1).max()) < self.fallback:
                self.fallbacks += 1
                break
            if state.temperature == 0:
                x = int(logits.argmax())
            else:
                q.append(state.process(logits))  # the target's p goes through the same processor
                x = acc.sample(q[-1], state.generator)
            tokens.append(x)
            if self.confidence and self._prob(logits, x, q, state.temperature) < self.confidence:
                break
        g = len(tokens)
        self._pending = (synced, fed)
        draft_probs = None if state.temperature == 0 else (torch.stack(q) if q else torch.empty(0, 0, device=dev))
        return Proposal(chain_tree(g, str(dev)), torch.tensor(tokens, dtype=torch.long, device=dev), draft_probs)

    @staticmethod
    def _prob(logits: torch.Tensor, x: int, q: list, temperature: float) -> float:
        """The draft's probability of its own token ``x`` (at the sampling temperature)."""
        return float(q[-1][x]) if temperature else float(torch.softmax(logits.float(), -1)[x])

    def stats(self) -> dict:
        return {"draft_forwards": self.target.forwards, "draft_forward_s": self.target.forward_s,
                **({"fallbacks": self.fallbacks} if self.fallback else {})}

    def update(self, result: StepResult) -> None:
        synced, fed = self._pending  # the draft cache holds the synced sequence + ``fed`` drafts
        if fed:
            self.target.crop(synced + min(result.accepted, fed))
        if self.schedule == "heuristic":
            # As transformers does: compare with the scheduled length, not with the drafted
            # one, so a chain cut short by ``confidence`` or by ``remaining`` counts as a miss.
            self.gamma = self.gamma + 2 if result.accepted == self.gamma else max(1, self.gamma - 1)


class Speculative(TreeDecoder):
    """Draft-model speculative decoding; exact at every temperature. Serves causal LMs and
    encoder-decoders (with a draft of the same kind)."""

    name = "speculative"
    model_kinds = ("causal", "seq2seq")
    acceptance_rules = ("greedy", "speculative", "target_sampling", "typical")
    default_sampling = "speculative"

    @classmethod
    def options(cls) -> dict:
        return {"draft": Option(None, (str, Path, torch.nn.Module)), **DRAFT_OPTIONS, **super().options()}

    @classmethod
    def test_configs(cls, model, workdir):
        return [{"draft": perturbed_copy(model)}, {"draft": perturbed_copy(model), "gamma": 2, "confidence": 0.5}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.drafting = draft_options(self.cfg)
        self.draft = resolve_draft(self.cfg["draft"], model)

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        return AutoregressiveDraft(make_target(self.draft), **self.drafting)
