"""The decoder contract every method implements.

``Decoder(model, tokenizer, **cfg).generate(input_ids, max_new_tokens) -> DecodeOutput``.
``tokens`` are the new token ids only; generation stops after the first EOS (kept) or at
``max_new_tokens``. ``stats`` holds at least ``steps`` (target-model forwards after the
prefill, counted as Spec-Bench does: the prefill is step 1), ``accept_lengths`` (tokens
committed per step; they sum to ``new_tokens``), ``new_tokens`` and ``wall_time`` (s).
Methods add their own keys (e.g. ``matches`` for pipelined decoding).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..errors import UserError


@dataclass
class DecodeOutput:
    """New tokens and run statistics of one ``generate`` call."""
    tokens: list[int]
    stats: dict = field(default_factory=dict)


def eos_ids(model, tokenizer=None) -> set[int]:
    """All EOS ids the model's generation config (or tokenizer) declares."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


class Decoder:
    """Base class: holds the model, checks arguments, times ``_generate``."""

    name = "base"
    lossless = False  # True when greedy output must equal vanilla greedy exactly

    def __init__(self, model, tokenizer=None, **cfg):
        self.model, self.tokenizer = model, tokenizer
        self.eos = eos_ids(model, tokenizer)
        unused = set(cfg) - set(self.options())
        if unused:
            raise UserError(f"decoder {self.name!r} has no option(s) {sorted(unused)}; "
                            f"valid: {sorted(self.options()) or 'none'}")
        self.cfg = {**self.options(), **cfg}

    @classmethod
    def options(cls) -> dict:
        """Configurable options and their defaults."""
        return {}

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        """Decode up to ``max_new_tokens`` after ``input_ids`` (``[1, S]`` long)."""
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens={max_new_tokens} is out of range; valid: >= 1")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise UserError(f"input_ids must have shape [1, S]; got {list(input_ids.shape)}")
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self._generate(input_ids, max_new_tokens)
        out.stats["wall_time"] = time.perf_counter() - t0
        out.stats["new_tokens"] = len(out.tokens)
        if out.stats.get("accept_lengths") is not None:
            assert sum(out.stats["accept_lengths"]) == len(out.tokens), "accept_lengths must sum to new_tokens"
        return out

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        raise NotImplementedError

    def close(self) -> None:
        """Release resources held across calls (worker processes); a no-op by default."""

    def truncate(self, tokens: list[int], max_new_tokens: int) -> tuple[list[int], bool]:
        """Cut ``tokens`` after the first EOS or at the budget; return (tokens, finished)."""
        for i, t in enumerate(tokens):
            if t in self.eos:
                return tokens[: min(i + 1, max_new_tokens)], True
        return tokens[:max_new_tokens], len(tokens) >= max_new_tokens
