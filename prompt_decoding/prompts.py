"""Prompt tokens (Chen et al., 2024, section 3): trained input embeddings that guess future tokens.

``m`` prompt tokens, each with ``n`` ensemble prompt tokens (EPTs), are appended after a
token as input embeddings (not vocabulary entries). All EPTs of prompt token ``j`` share the
position ``p + j`` after the token at ``p``; the guess for distance ``j`` is the average of the
LM-head logits of its EPTs. Real tokens never attend to prompt tokens, so prompt tokens never
change what the model computes for real tokens.

Attention among one token's EPTs (Appendix B.5; ``(j, i)`` = EPT ``i`` of prompt token ``j``):

* ``ensemble`` (the paper's default): ``(j, i)`` sees ``(j', i)`` for ``j' <= j``: ``n`` disjoint
  groups, whose logits are averaged;
* ``decoder``: sees every EPT of earlier prompt tokens, and itself;
* ``encoder``: sees every EPT of earlier prompt tokens and every EPT of its own.
"""
from __future__ import annotations

import torch
from torch import nn

from common.errors import UserError, check_range

MASKS = ("ensemble", "decoder", "encoder")


def ept_allow(m: int, n: int, mask: str = "ensemble", device=None) -> torch.Tensor:
    """``[m*n, m*n]`` bool: which EPT of one token's prompt tokens sees which, rows and columns
    ordered ``(j, i)`` (prompt token major)."""
    if mask not in MASKS:
        raise UserError(f"EPT mask {mask!r} is unknown; valid: {', '.join(MASKS)}")
    j = torch.arange(m, device=device).repeat_interleave(n)   # prompt token of each EPT
    i = torch.arange(n, device=device).repeat(m)              # EPT index
    earlier, same = j[:, None] > j[None, :], j[:, None] == j[None, :]
    if mask == "ensemble":
        return (earlier | same) & (i[:, None] == i[None, :])
    if mask == "decoder":
        return earlier | (same & (i[:, None] == i[None, :]))
    return earlier | same


class PromptTokens(nn.Module):
    """``m`` prompt tokens x ``n`` EPTs of width ``hidden``; the only trained parameters.

    Args:
        init: ``[H]`` or ``[k, H]`` embeddings to start from (the paper initialises from the
            embeddings of a short text); default: small random vectors.
    """

    def __init__(self, hidden: int, m: int = 3, n: int = 1, mask: str = "ensemble",
                 init: torch.Tensor | None = None, seed: int = 0):
        super().__init__()
        check_range("prompt tokens (m)", m, 1)
        check_range("EPTs per prompt token (n)", n, 1)
        if mask not in MASKS:
            raise UserError(f"EPT mask {mask!r} is unknown; valid: {', '.join(MASKS)}")
        self.m, self.n, self.mask = m, n, mask
        g = torch.Generator().manual_seed(seed)
        emb = torch.randn(m, n, hidden, generator=g) * 0.02
        if init is not None:
            init = init.detach().float().reshape(-1, hidden)
            emb = emb + init[torch.arange(m * n) % init.shape[0]].reshape(m, n, hidden)
        self.embeddings = nn.Parameter(emb)

    def allow(self, device=None) -> torch.Tensor:
        return ept_allow(self.m, self.n, self.mask, device)

    def aggregate(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., m*n, V]`` EPT logits -> ``[..., m, V]``: the average over each prompt token's EPTs."""
        return logits.unflatten(-2, (self.m, self.n)).mean(-2)
