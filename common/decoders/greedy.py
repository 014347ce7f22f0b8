"""Vanilla greedy decoding: the baseline every lossless method must match token for token.

Kept as strong as the library's own ``generate``: one forward per token through the target's
``model(...)`` call on its cache, only the last position's logits computed, no Python-side
copies. Serves causal LMs and encoder-decoders alike (:mod:`common.engine.target`).
"""
from __future__ import annotations

import torch

from .base import DecodeOutput, Decoder


class Vanilla(Decoder):
    name = "vanilla"
    lossless = True
    model_kinds = ("causal", "seq2seq")

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
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
