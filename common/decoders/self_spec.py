"""Self-speculative decoding (Draft & Verify, Zhang et al. 2024): the target drafts for itself
by skipping layers, then verifies with all layers. No second model, no training.

The draft is a :class:`LayerSkipTarget`: the target model running only its kept layers
through :func:`common.engine.forward.run_layers` (a skipped layer passes its input on unchanged, as
its residual branch would with a zero update) on a cache of its own, so the verifying
target's cache only ever holds full-model keys and values.

Which layers are skipped: ``skip=<file>`` (a set searched on calibration prompts as the paper
does, :mod:`common.components.skip_search`) or ``skip=[i, ...]``; ``draft_layers=[...]`` names
the kept ones instead; with neither, the fixed every-other-layer set (:func:`default_draft_layers`,
not the paper's). Every output's stats say which (``layer_set``: ``searched``, ``given`` or
``every_other``; ``skipped_layers``).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..components.skip_search import check_skip, kept_segments, read_skip_file
from ..errors import UserError
from ..engine.forward import embed, logits_from_hidden, num_layers
from ..engine.target import CausalTarget
from .base import DecodeOutput, Option
from .speculative import DRAFT_OPTIONS, AutoregressiveDraft, draft_options
from .tree_loop import Proposer, TreeDecoder


def default_draft_layers(d: int) -> list[int]:
    """Keep the first and last layers (they matter most) and every other layer between."""
    return sorted({0, d - 1} | set(range(0, d, 2)))


class LayerSkipTarget(CausalTarget):
    """The model with only ``layers`` (sorted indices) run; skipped layers' caches stay empty."""

    def __init__(self, model, layers: list[int]):
        super().__init__(model)
        self.segments = kept_segments(layers)

    @property
    def length(self) -> int:
        return self.layer_length(self.segments[0][0])

    def _forward(self, ids, keep, want_hidden):
        past = self.length
        pos = torch.arange(past, past + ids.shape[1], device=ids.device)[None]
        h = embed(self.model, ids)
        for start, end in self.segments:
            h = self.run_layers(h, start, end, pos)
        return logits_from_hidden(self.model, h[:, -keep:])[0], None


class SelfSpeculative(TreeDecoder):
    """Layer-skipping self-speculative decoding; exact at temperature 0 (and in distribution
    at temperature > 0, through speculative sampling)."""

    name = "self_speculative"
    acceptance_rules = ("greedy", "speculative", "typical")
    default_sampling = "speculative"

    @classmethod
    def options(cls) -> dict:
        return {"draft_layers": Option(None, (list, tuple)), "skip": Option(None, (str, Path, list, tuple)),
                **DRAFT_OPTIONS, **super().options()}

    @classmethod
    def test_configs(cls, model, workdir):
        d = num_layers(model)
        return [{}, {"draft_layers": [0, d - 1], "gamma": 3}, {"gamma": 2, "schedule": "heuristic", "confidence": 0.3},
                {"skip": [1]}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.drafting = draft_options(self.cfg)
        d = num_layers(model)
        layers, skip = self.cfg["draft_layers"], self.cfg["skip"]
        if layers is not None and skip is not None:
            raise UserError("decoder 'self_speculative' takes skip=<file or list> or draft_layers=<kept layers>, "
                            "not both")
        if skip is not None:
            searched = isinstance(skip, (str, Path))
            skip = read_skip_file(skip, d) if searched else check_skip(skip, d)
            layers, self.layer_set = [i for i in range(d) if i not in set(skip)], "searched" if searched else "given"
        else:
            self.layer_set = "every_other" if layers is None else "given"
            layers = default_draft_layers(d) if layers is None else layers
        if (not layers or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < d for i in layers)):
            raise UserError(f"draft_layers={layers!r} is invalid; valid: a non-empty list of layer "
                            f"indices in 0..{d - 1} (model has {d} layers)")
        self.layers = sorted(set(layers))

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        return AutoregressiveDraft(LayerSkipTarget(self.model, self.layers), **self.drafting)

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        out = super()._generate(input_ids, max_new_tokens)
        d = num_layers(self.model)
        out.stats["layer_set"] = self.layer_set  # which skip the record ran: searched, given or every_other
        out.stats["skipped_layers"] = [i for i in range(d) if i not in set(self.layers)]
        return out
