"""FIRP's predictors (section 3): one affine map per future step, applied at an intermediate layer.

Step ``i`` (1..K) maps the real state of the anchor position at the input of layer ``t_i`` to
a pseudo state ``W_i h + b_i`` for the position ``i`` places after it; the pseudo states then
run through layers ``t_i .. d-1`` beside the real tokens (attending to the real context up to
the anchor, to themselves and, by default, to the earlier steps' pseudo states of the same
anchor) and through the final norm and the LM head. Layers must increase with the step.
"""
from __future__ import annotations

import torch
from torch import nn

from common.errors import UserError, check_layers


class FirpMaps(nn.Module):
    """``K`` affine maps ``R^d -> R^d``, initialised to the identity (a pseudo state starts as
    the anchor's own state: the sensible start the paper leaves open)."""

    def __init__(self, hidden: int, layers: list[int], depth: int | None = None):
        super().__init__()
        if not layers:
            raise UserError("FIRP needs at least one prediction step (K >= 1); got no layers")
        check_layers(layers, depth, "prediction layer")
        if any(b <= a for a, b in zip(layers, layers[1:])):
            raise UserError(f"prediction layers {list(layers)} must increase with the step")
        self.layers = list(layers)
        self.maps = nn.ModuleList(nn.Linear(hidden, hidden) for _ in layers)
        with torch.no_grad():
            for lin in self.maps:
                lin.weight.copy_(torch.eye(hidden))
                lin.bias.zero_()

    @property
    def steps(self) -> int:
        return len(self.layers)

    def forward(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Step ``i`` (0-based): ``[..., d]`` real states at layer ``layers[i]`` -> pseudo states."""
        return self.maps[i](h)
