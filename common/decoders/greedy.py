"""Vanilla decoding: the baseline every lossless method must match, token for token at
temperature 0 and in distribution above it (it samples the target's processed distribution,
:func:`common.engine.acceptance.process`, with its own seeded generator: the reference).

Kept as strong as the library's own ``generate``: one forward per token through the target's
``model(...)`` call on its cache, only the last position's logits computed, no Python-side
copies. Serves causal LMs and encoder-decoders alike (:mod:`common.engine.target`).
"""
from __future__ import annotations

import torch

from ..engine import acceptance as acc
from .base import DecodeOutput, Decoder


class Vanilla(Decoder):
    name = "vanilla"
    lossless = True
    model_kinds = ("causal", "seq2seq")

    @classmethod
    def can_sample(cls) -> bool:
        return True

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        if self.cfg["temperature"] > 0:
            return self._sample(input_ids, max_new_tokens)
        logits, _ = self.target.start(input_ids)
        tokens: list[int] = []
        nxt = logits.argmax(-1).view(1, 1)  # [1, 1]
        while True:
            t = int(nxt)
            tokens.append(t)
            if t in self.eos or len(tokens) >= max_new_tokens:
                break
            logits, _ = self.target.extend(nxt)
            nxt = logits[-1].argmax(-1).view(1, 1)
        return DecodeOutput(tokens, {"steps": len(tokens), "accept_lengths": [1] * len(tokens)})

    def _sample(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        """The greedy loop with each token drawn from the processed ``[V]`` distribution."""
        c, gen = self.cfg, self.generator()
        logits, _ = self.target.start(input_ids)
        tokens: list[int] = []
        while True:
            t = acc.sample(acc.process(logits.view(-1, logits.shape[-1])[-1], c["temperature"], c["top_p"],
                                       c["top_k"]), gen)
            tokens.append(t)
            if t in self.eos or len(tokens) >= max_new_tokens:
                break
            logits, _ = self.target.extend(torch.tensor([[t]], device=input_ids.device))
        return DecodeOutput(tokens, {"steps": len(tokens), "accept_lengths": [1] * len(tokens)})
