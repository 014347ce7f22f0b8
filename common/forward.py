"""One forward path for every method, without forking the model's code.

Methods need more than ``model(input_ids)``: pipelined decoding runs layers ``[0, d_bar)`` and
``[d_bar, d)`` separately, FIRP injects predicted hidden states at a middle layer, early-exit
methods read logits from a middle layer, tree methods pass an ancestor mask. All of them go
through :func:`run_layers`, which drives the model's own decoder layers with an explicit 4D
mask and explicit position ids (``shared/notes/transformers-5.23.md`` section 5; single-token
steps are bitwise equal to ``model(...)``, chunks with a mask agree to ~1e-5). Masks are always arguments here, never model attributes.

Supported: decoder-only models exposing ``model.model.layers``, ``model.model.norm``,
``model.model.rotary_emb`` and ``model.lm_head`` (LLaMA, Mistral, Qwen2, SmolLM2, Vicuna).
"""
from __future__ import annotations

import torch

from .errors import UserError
from .tree import attention_mask_4d, causal_allow


def num_layers(model) -> int:
    """Decoder layer count ``d`` of a causal LM."""
    return len(_backbone(model).layers)


def _backbone(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise UserError(f"{type(model).__name__} has no decoder layer stack (model.model.layers); "
                        "layer-level methods need a LLaMA-style causal LM")
    return inner


def check_layer(model, layer: int, name: str = "layer") -> None:
    """Raise UserError unless ``1 <= layer < d`` (an exit strictly inside the model)."""
    d = num_layers(model)
    if not 1 <= layer < d:
        raise UserError(f"{name}={layer} is outside the model's layers; valid: 1..{d - 1} (model has {d})")


def embed(model, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, q]`` ids -> ``[B, q, H]`` input embeddings."""
    return _backbone(model).embed_tokens(input_ids)


def run_layers(model, hidden: torch.Tensor, cache, start: int, end: int,
               position_ids: torch.Tensor, allow: torch.Tensor | None = None) -> torch.Tensor:
    """Run decoder layers ``[start, end)`` on ``hidden``, appending to ``cache`` at those layers.

    Args:
        hidden: ``[1, q, H]`` input to layer ``start`` (embeddings when ``start == 0``).
        cache: a ``DynamicCache``; layers ``start..end-1`` must hold the same past length.
        position_ids: ``[1, q]`` absolute positions (tree nodes: past + depth).
        allow: ``[q, q]`` bool attention among the new tokens (default: causal). The past is
            always fully visible.
    Returns:
        ``[1, q, H]`` raw (un-normed) output of layer ``end - 1``.
    """
    m = _backbone(model)
    q = hidden.shape[1]
    past = cache.get_seq_length(layer_idx=start) if cache is not None else 0
    if allow is None and q == 1:
        mask = None  # one token sees everything; no mask keeps sdpa on model()'s own kernel
    else:
        mask = attention_mask_4d(causal_allow(q, hidden.device) if allow is None else allow, past, hidden.dtype)
    pe = m.rotary_emb(hidden, position_ids=position_ids)
    for i in range(start, end):
        hidden = m.layers[i](hidden, attention_mask=mask, position_embeddings=pe,
                             position_ids=position_ids, past_key_values=cache, use_cache=cache is not None)
    return hidden


def logits_from_hidden(model, hidden: torch.Tensor, head=None) -> torch.Tensor:
    """Final norm + LM head (or a given ``head``) on raw layer output ``[B, q, H]`` -> ``[B, q, V]``."""
    normed = _backbone(model).norm(hidden)
    return (head or model.lm_head)(normed)


def tree_forward(model, input_ids: torch.Tensor, cache, allow: torch.Tensor,
                 depth: torch.Tensor, **kwargs):
    """One target forward over tree nodes through ``model(...)`` with an explicit mask.

    Args:
        input_ids: ``[1, n]`` node tokens (node 0 = root = last committed token).
        cache: cache holding ``past`` committed positions; the n nodes are appended.
        allow: ``[n, n]`` ancestor mask; ``depth``: ``[n]`` node depths.
    Returns:
        the model output (``.logits`` ``[1, n, V]``; hidden states if requested in kwargs).
    """
    past = cache.get_seq_length()
    mask = attention_mask_4d(allow, past, model.dtype)
    pos = (past + depth).unsqueeze(0)
    return model(input_ids=input_ids, attention_mask=mask, position_ids=pos,
                 past_key_values=cache, use_cache=True, **kwargs)
