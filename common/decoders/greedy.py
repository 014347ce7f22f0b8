"""Vanilla greedy decoding: the baseline every lossless method must match token for token.

Kept as strong as the library's own ``generate``: one forward per token on a
``DynamicCache``, only the last position's logits computed, no Python-side copies.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .base import DecodeOutput, Decoder


class Vanilla(Decoder):
    name = "vanilla"
    lossless = True

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                            logits_to_keep=1).logits
        tokens: list[int] = []
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
        while True:
            t = int(nxt)
            tokens.append(t)
            if t in self.eos or len(tokens) >= max_new_tokens:
                break
            logits = self.model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
            nxt = logits[:, -1].argmax(-1, keepdim=True)
        return DecodeOutput(tokens, {"steps": len(tokens), "accept_lengths": [1] * len(tokens)})
