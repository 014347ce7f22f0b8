"""The layer-level forward path of causal LMs, without forking the model's code.

Methods need more than ``model(input_ids)``: pipelined decoding runs layers ``[0, d_bar)`` and
``[d_bar, d)`` separately, self-speculative decoding skips layers, tree methods pass an
ancestor mask, prompt decoding appends trained embeddings as extra positions, FIRP injects
predicted hidden states at middle layers. :func:`run_layers` drives the model's own decoder
layers with an explicit 4D mask and explicit position ids (single-token steps without a mask
are bitwise equal to ``model(...)``; chunks with a mask agree to ~1e-5, ``docs/transformers-notes.md``, "Running a range of layers");
:func:`verify_forward` builds on it for the verification forward with :class:`Injection`\\ s.
Masks are always arguments, never model attributes. Prefill and single-token decoding steps
go through ``model(...)`` itself (:mod:`common.engine.target`), which is what a strong baseline runs.

Supported: decoder-only models exposing ``model.model.layers``, ``model.model.norm``,
``model.model.rotary_emb`` and ``model.lm_head`` (LLaMA, Mistral, Qwen2, SmolLM2, Vicuna).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..errors import UserError, check_layers


# -- masks --------------------------------------------------------------------------------
def attention_mask_4d(allow: torch.Tensor, past_len: int, dtype=torch.float32,
                      past_allow: torch.Tensor | None = None) -> torch.Tensor:
    """Additive mask for ``q`` new positions after ``past_len`` cached ones.

    Args:
        allow: ``[q, q]`` bool, which new position may attend which (causal, ancestor or
            injection rows).
        past_len: cached positions.
        past_allow: ``[q, past_len]`` bool, which cached positions each new one sees; default:
            all (decoding). Training on several cuts of one cached sequence at once passes
            each cut's prefix here.
    Returns:
        ``[1, 1, q, past_len + q]`` on ``allow``'s device: 0 (attend) / ``finfo(dtype).min``.
        transformers passes a 4D float mask through untouched; a bool mask would be added as
        0/1 by the eager kernel, so float it is.
    """
    q = allow.shape[0]
    full = torch.ones(q, past_len + q, dtype=torch.bool, device=allow.device)
    full[:, past_len:] = allow
    if past_allow is not None:
        full[:, :past_len] = past_allow
    out = torch.zeros(full.shape, dtype=dtype, device=allow.device)
    return out.masked_fill_(~full, torch.finfo(dtype).min)[None, None]


def causal_allow(q: int, device=None) -> torch.Tensor:
    """``[q, q]`` lower-triangular bool mask (a chain is a tree with one path)."""
    return torch.ones(q, q, dtype=torch.bool, device=device).tril_()


# -- model structure ----------------------------------------------------------------------
def _backbone(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise UserError(f"{type(model).__name__} has no decoder layer stack (model.model.layers); "
                        "layer-level methods need a LLaMA-style causal LM")
    return inner


def backbone(model):
    """The decoder stack of a LLaMA-style causal LM (``model.model``: embeddings, layers, norm,
    rotary embedding), for modules built from the target's own layer classes (EAGLE's head)."""
    return _backbone(model)


def num_layers(model) -> int:
    """Decoder layer count ``d`` of a causal LM."""
    return len(_backbone(model).layers)


def check_layer(model, layer: int, name: str = "layer") -> None:
    """Raise UserError unless ``1 <= layer < d`` (an exit strictly inside the model)."""
    check_layers([layer], num_layers(model), name)


def embed(model, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, q]`` ids -> ``[B, q, H]`` input embeddings."""
    return _backbone(model).embed_tokens(input_ids)


def final_norm(model, hidden: torch.Tensor) -> torch.Tensor:
    """The model's final norm on raw layer output ``[..., H]``."""
    return _backbone(model).norm(hidden)


def logits_from_hidden(model, hidden: torch.Tensor, head=None) -> torch.Tensor:
    """Final norm + LM head (or a given ``head``) on raw layer output ``[B, q, H]`` -> ``[B, q, V]``."""
    return (head or model.lm_head)(final_norm(model, hidden))


# -- layer ranges ---------------------------------------------------------------------------
def run_layers(model, hidden: torch.Tensor, cache, start: int, end: int,
               position_ids: torch.Tensor, allow: torch.Tensor | None = None,
               past_allow: torch.Tensor | None = None, position_embeddings=None) -> torch.Tensor:
    """Run decoder layers ``[start, end)`` on ``hidden``, appending to ``cache`` at those layers.

    Args:
        hidden: ``[1, q, H]`` input to layer ``start`` (embeddings when ``start == 0``).
        cache: a ``DynamicCache`` or None; layers ``start..end-1`` must hold the same past length.
        position_ids: ``[1, q]`` absolute positions (tree nodes: past + depth).
        allow: ``[q, q]`` bool attention among the new positions (default: causal).
        past_allow: ``[q, past]`` bool, which cached positions each new one sees (default: all).
        position_embeddings: the rotary ``(cos, sin)`` of ``position_ids`` (:func:`rotary`), for a
            caller running one position through the layers a few at a time; computed if None.
    Returns:
        ``[1, q, H]`` raw (un-normed) output of layer ``end - 1``.
    """
    m = _backbone(model)
    q = hidden.shape[1]
    past = cache.get_seq_length(layer_idx=start) if cache is not None else 0
    if allow is None and q == 1 and past_allow is None:
        mask = None  # one token sees everything; no mask keeps sdpa on model()'s own kernel
    else:
        mask = attention_mask_4d(causal_allow(q, hidden.device) if allow is None else allow, past, hidden.dtype,
                                 past_allow)
    pe = m.rotary_emb(hidden, position_ids=position_ids) if position_embeddings is None else position_embeddings
    for i in range(start, end):
        hidden = m.layers[i](hidden, attention_mask=mask, position_embeddings=pe,
                             position_ids=position_ids, past_key_values=cache, use_cache=cache is not None)
    return hidden


def rotary(model, hidden: torch.Tensor, position_ids: torch.Tensor):
    """The rotary ``(cos, sin)`` the layers use at ``position_ids`` (``[1, q]``), for ``hidden``'s
    dtype and device."""
    return _backbone(model).rotary_emb(hidden, position_ids=position_ids)


# -- the verification forward ---------------------------------------------------------------
@dataclass
class Injection:
    """Extra positions a proposer adds to the verification forward (not tree nodes).

    They enter before layer ``layer`` (0: as input embeddings, e.g. prompt decoding's prompt
    tokens; ``l > 0``: as hidden states, e.g. FIRP's predicted states), run through the
    remaining layers beside the tree nodes, and come back after the final norm. Tree nodes
    never attend to them, so they cannot change the nodes' logits; their KV entries are
    dropped when the accepted path is kept.

    Attributes:
        layer: entry layer ``0..d-1``.
        states: ``[e, H]`` states, or a callable ``(hidden) -> [e, H]`` called with the
            ``[q, H]`` input of layer ``layer`` at every position present there (tree nodes
            first, then earlier injections' positions in order) - how FIRP maps a node's real
            state to its pseudo states inside the same forward.
        position_ids: ``[e]`` absolute positions (rotary embeddings).
        allow: ``[e, q + e]`` bool, what each new position attends among the positions
            present at its entry (same order as above) and the new ones; the cached past is
            always visible.
    """
    layer: int
    states: torch.Tensor | Callable[[torch.Tensor], torch.Tensor]
    position_ids: torch.Tensor
    allow: torch.Tensor


@dataclass
class Verified:
    """What one verification forward returns.

    Attributes:
        hidden: ``[n, H]`` final normed states of the tree nodes (the LM head's input); None
            where a target does not gather them (encoder-decoders).
        extra_hidden: ``[E, H]`` final normed states of every injected position, in order
            (empty when there are none).
        captured: ``{layer: [q_l, H]}`` input of each requested layer at every position
            present there (nodes first), for proposers that read intermediate states.
    """
    hidden: torch.Tensor | None
    extra_hidden: torch.Tensor
    captured: dict


def _append_rows(allow: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Grow a ``[q, q]`` mask by ``e`` new positions: old rows never see them, new rows are
    ``new`` (``[e, q + e]``)."""
    q, e = allow.shape[0], new.shape[0]
    out = torch.zeros(q + e, q + e, dtype=torch.bool, device=allow.device)
    out[:q, :q] = allow
    out[q:] = new
    return out


def check_context(model, pos: torch.Tensor) -> None:
    """Refuse positions ``pos`` (any shape) beyond the model's context (``max_position_embeddings``)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and int(pos.max()) >= limit:
        raise UserError(f"verification positions reach {int(pos.max())}, beyond the model's context of "
                        f"{limit} positions; valid: a shorter prompt, fewer new tokens or a smaller tree")


def verify_forward(model, cache, node_tokens: torch.Tensor, node_allow: torch.Tensor,
                   node_positions: torch.Tensor, injections: Sequence[Injection] = (),
                   capture: Sequence[int] = ()) -> Verified:
    """One forward over tree nodes (and injected positions) after the cached past.

    Args:
        node_tokens: ``[n]`` tokens of the tree nodes (node 0 = root).
        node_allow: ``[n, n]`` ancestor mask; ``node_positions``: ``[n]`` absolute positions.
        injections: extra positions, see :class:`Injection`.
        capture: layers whose input states to return.
    Returns:
        :class:`Verified`. Every layer's cache gains the positions present at that layer
        (tree nodes first); keep the accepted path with :func:`common.engine.cache.accept_path`.
    """
    d = num_layers(model)
    dev = node_tokens.device
    hidden = embed(model, node_tokens[None])                      # [1, n, H]
    pos, allow = node_positions.to(dev)[None], node_allow.to(dev)
    by_layer: dict[int, list[Injection]] = {}
    for inj in injections:
        check_layers([inj.layer], d, "injection layer", lo=0)
        by_layer.setdefault(inj.layer, []).append(inj)
    captured = {}
    bounds = sorted({0, d, *by_layer, *capture})
    for start, end in zip(bounds, bounds[1:]):
        for inj in by_layer.get(start, ()):
            states = inj.states(hidden[0]) if callable(inj.states) else inj.states
            e = states.shape[0]
            if tuple(inj.allow.shape) != (e, hidden.shape[1] + e):
                raise UserError(f"injection at layer {start}: allow has shape {list(inj.allow.shape)}; "
                                f"valid: [{e}, {hidden.shape[1] + e}] (its positions x positions present)")
            hidden = torch.cat([hidden, states.to(hidden.dtype)[None]], dim=1)
            pos = torch.cat([pos, inj.position_ids.to(dev)[None]], dim=1)
            allow = _append_rows(allow, inj.allow.to(dev))
        check_context(model, pos)
        if start in capture:
            captured[start] = hidden[0]
        hidden = run_layers(model, hidden, cache, start, end, pos, allow)
    n = node_tokens.numel()
    normed = final_norm(model, hidden[0])
    return Verified(normed[:n], normed[n:], captured)


# -- states and keys/values of single layers ---------------------------------------------------
def layer_states(model, ids: torch.Tensor, depths: Sequence[int]) -> dict[int, torch.Tensor]:
    """Raw (un-normed) residual states after the first ``depth`` layers, for each depth asked.

    Args:
        ids: ``[B, T]`` token ids (right padding is harmless: real positions never see it).
        depths: layer counts in ``0..d`` (0: the embeddings; ``d``: the last layer's output,
            before the final norm).
    Returns:
        ``{depth: [B, T, H]}``. No cache is written; run under ``no_grad`` for a frozen trunk.
    """
    d = num_layers(model)
    want = sorted(set(depths))
    if not want or want[0] < 0 or want[-1] > d:
        raise UserError(f"layer depths {list(depths)} are out of range; valid: 0..{d}")
    pos = torch.arange(ids.shape[1], device=ids.device)[None]
    hidden, out, at = embed(model, ids), {}, 0
    for depth in want:
        if depth > at:
            hidden = run_layers(model, hidden, None, at, depth, pos)
            at = depth
        out[depth] = hidden
    return out


def layer_kv(model, layer: int, hidden: torch.Tensor, position_ids: torch.Tensor,
             position_embeddings=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values decoder layer ``layer`` caches for input states ``hidden``, without
    running its attention or MLP (CALM's state propagation: a skipped layer's cache entry
    computed from the exited state).

    Args:
        hidden: ``[1, q, H]`` the layer's input (raw residual stream).
        position_ids: ``[1, q]`` absolute positions (rotary embeddings).
        position_embeddings: their rotary ``(cos, sin)`` (:func:`rotary`); computed if None.
    Returns:
        ``([1, kvh, q, hd] keys, [1, kvh, q, hd] values)``, rotated, as the layer's own
        forward hands them to ``cache.update`` (LLaMA-style layers: input norm, k/v
        projections, optional per-head ``k_norm``, rotary embeddings).
    """
    m = _backbone(model)
    block = m.layers[layer]
    attn = block.self_attn
    x = block.input_layernorm(hidden)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    k = attn.k_proj(x).view(shape)
    if getattr(attn, "k_norm", None) is not None:
        k = attn.k_norm(k)
    k = k.transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = rotary(model, hidden, position_ids) if position_embeddings is None else position_embeddings
    rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb  # the model's own rotary code
    k, _ = rotate(k, k, cos, sin)
    return k, v


def append_layer_kv(model, cache, layers: Sequence[int], hidden: torch.Tensor, position_ids: torch.Tensor,
                    position_embeddings=None) -> None:
    """Append to ``cache``, at each of ``layers``, the keys/values of input ``hidden``
    (:func:`layer_kv`): those layers now hold the positions as if ``hidden`` had entered each."""
    pe = rotary(model, hidden, position_ids) if position_embeddings is None else position_embeddings
    for i in layers:
        k, v = layer_kv(model, i, hidden, position_ids, pe)
        cache.update(k, v, i)
