"""CALM (Schuster et al., 2022), BiLD's early-exit baseline (appendix 7.2, Figure 7): every new
token leaves the decoder at the first layer whose hidden state has *saturated*.

The ``calm`` decoder, as BiLD's appendix 7.2.1 configures CALM (greedy, batch 1):

* the prompt's prefill runs every layer and gives the first token;
* each later token runs the layers one at a time; after ``i`` layers (``min_exit <= i < d``)
  its exit confidence is the cosine similarity between the state after layer ``i`` and the
  state before it (hidden-state saturation, the measure BiLD chose over CALM's softmax one);
* it exits at the first ``i`` where that similarity exceeds CALM's decaying threshold
  ``lambda_t = clip_[0,1](0.9 * lambda + 0.1 * exp(-tau * t / N))`` (CALM, section 3.5; ``t``
  the output position, 0 for the prefill's token, ``N`` the maximum output length; BiLD sweeps
  ``lambda`` in [0.7, 0.98] and ``tau`` in {0, 1, 2, 4, 8});
* its next token is the argmax of the final norm + LM head on the exited state (one head
  shared by every exit; trained with CALM's weighted loss by :mod:`bild.exits`);
* *state propagation*: each skipped layer ``j > i`` gets the keys/values the exited state would
  give it had it entered that layer (:meth:`common.engine.target.CausalTarget.append_layer_kv`), so later tokens
  that run deeper attend to every position at every layer.

``threshold=1, tau=0`` never exits early: the output is the model's greedy output (a test).
"""
from __future__ import annotations

import math

import torch

from common.decoders.base import DecodeOutput, Decoder, Option
from common.errors import UserError
from common.engine.forward import embed, logits_from_hidden, num_layers, rotary


def decaying_threshold(threshold: float, tau: float, t: int, max_len: int) -> float:
    """CALM's threshold at output position ``t`` of at most ``max_len``:
    ``clip_[0,1](0.9 * threshold + 0.1 * exp(-tau * t / max_len))``."""
    return min(1.0, max(0.0, 0.9 * threshold + 0.1 * math.exp(-tau * t / max_len)))


def saturation(before: torch.Tensor, after: torch.Tensor) -> float:
    """Cosine similarity of a token's states ``[..., H]`` before and after a layer (<= 1)."""
    return min(1.0, float(torch.nn.functional.cosine_similarity(before.float().flatten(), after.float().flatten(),
                                                                dim=0)))


class Calm(Decoder):
    """Decoder ``calm`` (see the module docstring). Lossy: exits change the tokens."""

    name = "calm"
    lossless = False
    model_kinds = ("causal",)

    @classmethod
    def options(cls) -> dict:
        return {"threshold": Option(0.9, (float,), lo=0.0, hi=1.0),
                "tau": Option(4.0, (float,), lo=0.0),
                "min_exit": Option(1, (int,), lo=1)}

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.depth = num_layers(model)
        if self.cfg["min_exit"] >= self.depth:
            raise UserError(f"decoder 'calm' option min_exit={self.cfg['min_exit']} is out of range; "
                            f"valid: 1..{self.depth - 1} (the model has {self.depth} layers)")

    def exits(self, depth: int, before: torch.Tensor, after: torch.Tensor, lam: float) -> bool:
        """Whether a token leaves after ``depth`` layers (``before``/``after``: its states around
        the last one)."""
        return self.cfg["min_exit"] <= depth < self.depth and saturation(before, after) > lam

    def step(self, token: int, lam: float) -> tuple[torch.Tensor, int]:
        """Feed one committed token; returns its ``[V]`` next-token logits and its exit depth."""
        model, target = self.model, self.target
        pos = torch.tensor([[self.target.length]], device=self.device)
        h = embed(model, torch.tensor([[token]], device=self.device))        # [1, 1, H]
        pe = rotary(model, h, pos)  # once per token, not once per layer
        depth = 0
        while depth < self.depth:
            out = target.run_layers(h, depth, depth + 1, pos, position_embeddings=pe)
            depth += 1
            leave = self.exits(depth, h, out, lam)
            h = out
            if leave:
                break
        if depth < self.depth:  # state propagation to the skipped layers' caches
            target.append_layer_kv(range(depth, self.depth), h, pos, pe)
        return logits_from_hidden(model, h)[0, -1], depth

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        logits, _ = self.target.start(input_ids)
        tokens, depths = [int(logits.argmax())], [self.depth]
        while tokens[-1] not in self.eos and len(tokens) < max_new_tokens:
            lam = decaying_threshold(self.cfg["threshold"], self.cfg["tau"], len(tokens), max_new_tokens)
            logits, depth = self.step(tokens[-1], lam)
            tokens.append(int(logits.argmax()))
            depths.append(depth)
        n = len(tokens)
        return DecodeOutput(tokens, {"steps": n, "accept_lengths": [1] * n, "exit_layers": depths,
                                     "mean_exit_layer": sum(depths) / n,
                                     "layer_share": sum(depths) / (n * self.depth),
                                     "early_exits": sum(e < self.depth for e in depths)})
