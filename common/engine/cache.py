"""KV-cache editing over transformers' caches (5.x ``DynamicCache`` API).

Speculative and tree decoders append candidate tokens to the cache during verification and
must then drop the rejected ones. Two edits cover every method here:

* :func:`crop_to` keeps the first ``length`` positions (a linear chain was accepted);
* :func:`keep_positions` keeps an arbitrary ordered set of positions (one path of a tree).

:func:`gather_kv` / :func:`append_kv` move committed KV between caches (pipelined decoding's
workers). All work on a ``DynamicCache`` and on the self-attention half of an ``EncoderDecoderCache``
(BiLD's T5 models), and skip layers that were never filled (FIRP starts at a middle layer).
"""
from __future__ import annotations

import torch


def _self_attention(cache):
    """The decoder self-attention cache (the cross-attention one is never edited)."""
    return getattr(cache, "self_attention_cache", cache)


def seq_length(cache, layer_idx: int | None = None) -> int:
    """Number of cached positions; by default the largest over layers (some may be empty)."""
    c = _self_attention(cache)
    if layer_idx is not None:
        return c.get_seq_length(layer_idx=layer_idx)
    return max((_layer_len(layer) for layer in c.layers), default=0)


def _layer_len(layer) -> int:
    keys = getattr(layer, "keys", None)
    return 0 if keys is None or keys.numel() == 0 else keys.shape[-2]


def crop_to(cache, length: int) -> None:
    """Keep the first ``length`` positions of every filled layer, in place.

    Args:
        cache: a transformers ``DynamicCache`` (or ``EncoderDecoderCache``).
        length: positions to keep; must be <= the current length.
    """
    c = _self_attention(cache)
    for layer in c.layers:
        n = _layer_len(layer)
        if n > length:
            # ``DynamicCache.crop`` only takes a count to remove; slicing per layer also
            # handles layers of different lengths (partially filled caches).
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def keep_positions(cache, keep: torch.Tensor) -> None:
    """Keep only the positions ``keep`` (in that order) of every filled layer, in place.

    Args:
        cache: a transformers ``DynamicCache`` (or ``EncoderDecoderCache``); layer tensors
            are ``[batch, kv_heads, seq, head_dim]``.
        keep: ``[m]`` long tensor of positions, typically ``arange(prefix) ++ prefix + path``
            where ``path`` are the tree-node indices of the accepted path.
    """
    c = _self_attention(cache)
    for layer in c.layers:
        if _layer_len(layer) == 0:
            continue
        idx = torch.as_tensor(keep, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)


def accept_path(cache, prefix_len: int, node_indices) -> None:
    """After a tree forward appended nodes (and any injected positions) at ``prefix_len..``,
    keep the prefix and the accepted nodes (tree indices, root first), dropping the rest.

    Only the accepted nodes' slots are copied (to ``prefix_len..prefix_len+a``), the prefix
    stays where it is, and the tail is cut by slicing: no copy of the whole cache per step.
    """
    c = _self_attention(cache)
    a = len(node_indices)
    for layer in c.layers:
        if _layer_len(layer) == 0:
            continue
        src = prefix_len + torch.as_tensor(node_indices, dtype=torch.long, device=layer.keys.device)
        for name in ("keys", "values"):
            t = getattr(layer, name)
            t[..., prefix_len:prefix_len + a, :] = t.index_select(-2, src)  # gathered first: overlap-safe
            setattr(layer, name, t[..., :prefix_len + a, :])


def gather_kv(cache, layers: int, start: int, end: int) -> torch.Tensor:
    """KV of positions ``[start, end)`` of layers ``[0, layers)`` -> ``[layers, 2, kvh, n, hd]``
    fp32 (batch 1; the wire format of pipelined decoding's workers)."""
    c = _self_attention(cache)
    return torch.stack([torch.stack([c.layers[i].keys[0, :, start:end], c.layers[i].values[0, :, start:end]])
                        for i in range(layers)]).float()


def append_kv(cache, kv: torch.Tensor, dtype) -> None:
    """Append ``kv`` ``[layers, 2, kvh, n, hd]`` (from :func:`gather_kv`) to layers
    ``[0, layers)`` of ``cache``, cast to ``dtype``."""
    for i in range(kv.shape[0]):
        cache.update(kv[i, 0][None].to(dtype), kv[i, 1][None].to(dtype), i)
