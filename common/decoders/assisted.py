"""transformers' assisted generation (``generate(assistant_model=draft)``), a peer of
``speculative`` run by the library itself; exact at greedy, and at temperature > 0 transformers'
speculative sampling (its ``_speculative_sampling``: Leviathan et al.'s rule, the draft's and the
target's logits through the same processors), seeded as ``hf_generate`` is. Steps and accepted
lengths come from the target's forwards, as for ``prompt_lookup``.

With a draft whose generation config sets nothing, transformers 5.23 drafts up to 20 tokens a
step (constant schedule) and cuts the chain after the first draft token of probability < 0.4
(``assistant_confidence_threshold``; tuned online only if scikit-learn is installed).
``speculative`` with ``gamma=20, confidence=0.4`` is the same rule in our loop.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .base import DecodeOutput, Option
from .hf import HFGenerate
from .speculative import perturbed_copy, resolve_draft


class HFAssisted(HFGenerate):
    name = "hf_assisted"
    model_kinds = ("causal",)

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "draft": Option(None, (str, Path, torch.nn.Module))}

    @classmethod
    def test_configs(cls, model, workdir):
        return [{"draft": perturbed_copy(model)}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.draft = resolve_draft(self.cfg["draft"], model)

    def _kwargs(self) -> dict:
        return {"assistant_model": self.draft}

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        # A "heuristic" schedule (set in the draft's generation config) stores the adapted
        # draft length there across calls; restore it so every call starts alike (results
        # must not depend on which prompts ran before).
        gc = self.draft.generation_config
        saved = gc.num_assistant_tokens
        try:
            return super()._generate(input_ids, max_new_tokens)
        finally:
            gc.num_assistant_tokens = saved
