"""transformers' own generation, wrapped under the contract (peers, not rewrites).

``hf_generate`` is ``model.generate(do_sample=False)`` at temperature 0 and
``do_sample=True`` with the decoder's temperature, top-p and top-k above it (transformers'
processors: the distribution :func:`common.engine.acceptance.process` gives); ``prompt_lookup`` adds
``prompt_lookup_num_tokens`` (n-gram drafts copied from the prompt, verified by the model).
Steps and accepted lengths are read from the cache length seen at each model forward.
``hf_generate`` also serves encoder-decoders (the reference a T5's own greedy ``generate`` is).
"""
from __future__ import annotations

import torch

from ..engine.fast import stock_copy
from .base import DecodeOutput, Decoder, Option


class _ForwardProbe:
    """Records the committed cache length at each forward of ``model`` while active."""

    def __init__(self, model):
        self.model, self.lengths = model, []

    def __enter__(self):
        def hook(_mod, args, kwargs):
            cache = kwargs.get("past_key_values")
            self.lengths.append(cache.get_seq_length() if cache is not None else 0)
        self.handle = self.model.register_forward_pre_hook(hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def accept_lengths(self, prompt_len: int, new_tokens: int) -> list[int]:
        """Tokens committed per forward: after forward i, ``lengths[i+1] - prompt_len + 1``
        tokens exist (the cache holds all but the newest); the last forward ends the run."""
        done = [max(0, n - prompt_len + 1) for n in self.lengths[1:]] + [new_tokens]
        prev, out = 0, []
        for d in done:
            out.append(d - prev)
            prev = d
        return out


class HFGenerate(Decoder):
    name = "hf_generate"
    lossless = True
    model_kinds = ("causal", "seq2seq")

    @classmethod
    def options(cls) -> dict:
        # stock: generate() on an unmodified copy (transformers' own modules, attention and cache)
        # rather than on the shared fast path: the "before" reference of the hardware-limit work
        return {**super().options(), "stock": Option(False, (bool,))}

    @classmethod
    def can_sample(cls) -> bool:
        return True

    def _sampling_kwargs(self) -> dict:
        """generate()'s sampling arguments; ``None`` switches a generation-config default off."""
        c = self.cfg
        if c["temperature"] == 0:
            return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        return {"do_sample": True, "temperature": c["temperature"], "top_p": c["top_p"], "top_k": c["top_k"]}

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        if self.cfg["stock"]:
            self.model = stock_copy(model)

    def _kwargs(self) -> dict:
        return {}

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        if self.cfg["temperature"] > 0:
            # generate() takes no generator: it draws from torch's global one, so it is seeded
            # right before the call (same seed, same tokens, as the other decoders' own generators)
            torch.manual_seed(int(self.cfg["seed"]))
        with _ForwardProbe(self.model) as probe:
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                      max_new_tokens=max_new_tokens,
                                      eos_token_id=sorted(self.eos) or None,
                                      pad_token_id=min(self.eos) if self.eos else None,
                                      **self._sampling_kwargs(), **self._kwargs())
        # generate returns prompt ++ new ids (causal) or start token ++ new ids (seq2seq); the
        # cache holds the same positions, minus the newest.
        before = 1 if self.target.kind == "seq2seq" else input_ids.shape[1]
        tokens, _ = self.truncate(out[0, before:].tolist(), max_new_tokens)
        acc = probe.accept_lengths(before, len(tokens))
        return DecodeOutput(tokens, {"steps": len(acc), "accept_lengths": acc})


class PromptLookup(HFGenerate):
    name = "prompt_lookup"
    model_kinds = ("causal",)

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "num_tokens": Option(10, (int,), lo=1), "max_ngram": Option(2, (int,), lo=1)}

    def _kwargs(self) -> dict:
        return {"prompt_lookup_num_tokens": self.cfg["num_tokens"],
                "max_matching_ngram_size": self.cfg["max_ngram"]}
