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

Appendix B's other options (:class:`Extras`; the defaults are the paper's method, and the
decoder runs the first two):

* ``aggregation="learned"`` (B.6): a trained scalar weight per EPT, ``p = sum_i w_i p_i`` over
  its prompt token's EPT logits (initialised to ``1/n``, i.e. the average);
* ``head=True`` (B.4): a custom decoding head (a copy of the LM head, trained) that only the
  prompt tokens' states go through;
* ``prefix=k`` (B.3): ``k`` prefix tokens per prompt token, trained keys and values in every
  layer's attention that only that prompt token's EPTs see (real tokens never do);
* ``exits=k`` (B.7): a prompt token's state is the average of the last ``k`` layers' outputs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from common.errors import UserError, check_range

MASKS = ("ensemble", "decoder", "encoder")
AGGREGATIONS = ("average", "learned")


@dataclass(frozen=True)
class Extras:
    """Appendix B's ablation options beside the prompt embeddings; the defaults are the
    paper's method (nothing extra)."""
    aggregation: str = "average"   # B.6: "average" or "learned" weights over EPTs
    head: bool = False             # B.4: a custom decoding head for the prompt tokens
    prefix: int = 0                # B.3: prefix tokens (keys/values in every layer) per prompt token
    exits: int = 1                 # B.7: average the outputs of the last ``exits`` layers

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS:
            raise UserError(f"EPT aggregation {self.aggregation!r} is unknown; valid: {', '.join(AGGREGATIONS)}")
        check_range("prefix tokens per prompt token", self.prefix, 0, 64)
        check_range("exits (last layers averaged)", self.exits, 1, 64)

    def meta(self) -> dict:
        """The options that differ from the paper's method (what a checkpoint's meta records:
        checkpoints of the plain method keep the meta they had before these options existed)."""
        default = Extras()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}

    @classmethod
    def from_meta(cls, meta: dict) -> "Extras":
        return cls(**{f.name: meta[f.name] for f in fields(cls) if f.name in meta})


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
    """``m`` prompt tokens x ``n`` EPTs of width ``hidden``, and the :class:`Extras` that were
    asked for; the only trained parameters.

    Args:
        init: ``[H]`` or ``[k, H]`` embeddings to start from (the paper initialises from the
            embeddings of a short text); default: small random vectors.
        head_init: ``[V, H]`` the custom decoding head's starting weight (``extras.head``).
        prefix_init: ``[d, 2, kv_heads, prefix, head_dim]`` keys and values to start each
            prompt token's prefix from (``extras.prefix``; the same for every prompt token).
    """

    def __init__(self, hidden: int, m: int = 3, n: int = 1, mask: str = "ensemble",
                 init: torch.Tensor | None = None, seed: int = 0, extras: Extras = Extras(),
                 head_init: torch.Tensor | None = None, prefix_init: torch.Tensor | None = None):
        super().__init__()
        check_range("prompt tokens (m)", m, 1)
        check_range("EPTs per prompt token (n)", n, 1)
        if mask not in MASKS:
            raise UserError(f"EPT mask {mask!r} is unknown; valid: {', '.join(MASKS)}")
        self.m, self.n, self.mask, self.extras = m, n, mask, extras
        g = torch.Generator().manual_seed(seed)
        emb = torch.randn(m, n, hidden, generator=g) * 0.02
        if init is not None:
            init = init.detach().float().reshape(-1, hidden)
            emb = emb + init[torch.arange(m * n) % init.shape[0]].reshape(m, n, hidden)
        self.embeddings = nn.Parameter(emb)
        self.weights = nn.Parameter(torch.full((m, n), 1.0 / n)) if extras.aggregation == "learned" else None
        self.head = None
        if extras.head:
            if head_init is None:
                raise ValueError("a custom decoding head needs head_init")
            self.head = nn.Linear(hidden, head_init.shape[0], bias=False)
            with torch.no_grad():
                self.head.weight.copy_(head_init)
        self.prefix_kv = None
        if extras.prefix:
            if prefix_init is None or prefix_init.shape[3] != extras.prefix:
                raise ValueError(f"prefix tuning needs prefix_init [d, 2, kv_heads, {extras.prefix}, head_dim]")
            self.prefix_kv = nn.Parameter(prefix_init.detach().float().repeat(1, 1, 1, m, 1))  # [d, 2, kvh, m*p, hd]

    def allow(self, device=None) -> torch.Tensor:
        return ept_allow(self.m, self.n, self.mask, device)

    def readout(self, normed: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """``[..., k*n, H]`` final-normed states of the first ``k <= m`` prompt tokens' EPTs ->
        ``[..., k, V]`` guess logits: the LM head (or the custom one), then the average (or the
        learned weighting) over each prompt token's EPTs."""
        logits = (lm_head if self.head is None else self.head)(normed).unflatten(-2, (-1, self.n))      # [..., k, n, V]
        if self.weights is None:
            return logits.mean(-2)
        w = self.weights[:logits.shape[-3]].to(logits.dtype)                     # [k, n]
        return (logits * w[..., None]).sum(-2)

    def prefix_allow(self, device=None) -> torch.Tensor:
        """``[m*n, m*prefix]`` bool: EPTs of prompt token ``j`` see only prompt token ``j``'s prefix."""
        p = self.extras.prefix
        j = torch.arange(self.m, device=device)
        return (j.repeat_interleave(self.n)[:, None] == j.repeat_interleave(p)[None, :])
