"""Early exit as a draft model on one shared KV cache: the target's first ``k`` layers, its final
norm and its LM head propose tokens, and the target verifies them without recomputing those
``k`` layers.

Two :class:`~common.engine.target.Target` s share one model and one cache:

* :class:`ExitDraftTarget` (the small model) runs layers ``[0, k)`` on each token it is fed,
  appending their keys/values to the shared cache, and reads its next-token distribution off
  the exit state (final norm + LM head, the target's own, or trained ones the model carries);
* :class:`SharedExitTarget` (the large model) verifies a chain by running only layers
  ``[k, d)`` over the positions the draft already took through ``[0, k)``, starting from the
  exit states the draft left, and runs the first ``k`` layers only for the chain's tail the
  draft never fed (its last token, or every node when nothing was drafted).

The first ``k`` layers' keys/values of a drafted position are therefore computed once, by the
draft, one token at a time, and are exactly the target's own (same weights, same inputs); the
positions the verifier rejects are cut from every layer by the verifier's ``accept``, so the
draft's ``crop`` has nothing left to do. Between steps every layer holds the committed tokens
but the newest; mid-step, layers ``[0, k)`` run ahead by the drafted positions.

Decoder-only models with the layer stack :mod:`common.engine.forward` drives; chains only.
"""
from __future__ import annotations

import torch

from ..errors import UserError
from ..engine.forward import Verified, check_context, check_layer, embed, final_norm, logits_from_hidden, num_layers
from ..engine.target import CausalTarget, SharedCacheTarget


class SharedExitTarget(CausalTarget):
    """The target, verifying chains whose first ``exit_layer`` layers its draft already ran.

    Attributes:
        exit_layer: ``k``, the draft's depth (``1 <= k < d``).
        held: ``[1, m, H]`` exit states (outputs of layer ``k - 1``) of the ``m`` positions
            layers ``[0, k)`` hold beyond layers ``[k, d)``, oldest first; None when ``m = 0``.
    """

    def __init__(self, model, exit_layer: int):
        super().__init__(model)
        check_layer(model, exit_layer, "exit_layer")
        self.exit_layer, self.depth = exit_layer, num_layers(model)
        self.held: torch.Tensor | None = None

    def begin(self, prompt):
        super().begin(prompt)
        self.held = None

    @property
    def length(self) -> int:
        """Positions every layer holds (the last layer's count: the first ``k`` may run ahead)."""
        return self.layer_length(self.depth - 1)

    def draft(self) -> "ExitDraftTarget":
        """The small model of one ``generate`` call, on this target's cache."""
        return ExitDraftTarget(self)

    def hold(self, states: torch.Tensor) -> None:
        """Keep the exit states ``[1, q, H]`` of positions the draft just took through ``[0, k)``."""
        self.held = states if self.held is None else torch.cat([self.held, states], dim=1)

    def _verify(self, tree_tokens, tree, injections, capture, head):
        if injections or capture or not tree.is_chain:
            raise UserError("an early-exit target verifies plain chains only (no injected positions, "
                            "captured layers or branches)")
        past, k, n = self.length, self.exit_layer, tree_tokens.numel()
        m = 0 if self.held is None else self.held.shape[1]
        ahead = self.layer_length(0) - past
        if ahead != m or m > n:
            raise AssertionError(f"shared cache out of step: layers [0, {k}) hold {ahead} positions beyond "
                                 f"the rest, {m} exit states kept, {n} chain nodes")
        pos = torch.arange(past, past + n, device=tree_tokens.device)[None]
        check_context(self.model, pos)
        parts = [self.held] if m else []
        if m < n:  # the chain's tail the draft never fed: its first k layers run here
            parts.append(self.run_layers(embed(self.model, tree_tokens[m:][None]), 0, k, pos[:, m:]))
        self.held = None
        hidden = self.run_layers(torch.cat(parts, dim=1), k, self.depth, pos)
        normed = final_norm(self.model, hidden[0])                       # [n, H]
        return (self.model.lm_head(normed) if head else None), Verified(normed, normed[:0], {})


class ExitDraftTarget(SharedCacheTarget):
    """The first ``k`` layers of a :class:`SharedExitTarget`'s model + its final norm and LM head,
    on that target's cache (never a cache of its own)."""

    def __init__(self, main: SharedExitTarget):
        super().__init__(main)
        self.main = main

    @property
    def length(self) -> int:
        """Positions layers ``[0, k)`` hold."""
        return self.layer_length(0)

    def _forward(self, ids, keep, want_hidden):
        past = self.length
        pos = torch.arange(past, past + ids.shape[1], device=ids.device)[None]
        h = self.run_layers(embed(self.model, ids), 0, self.main.exit_layer, pos)
        self.main.hold(h)
        return logits_from_hidden(self.model, h[:, -keep:])[0], None

    def crop(self, length: int) -> None:
        """Nothing to do: the verifier's ``accept`` already cut the rejected positions from every
        layer, the draft's included."""
