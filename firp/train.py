"""Training FIRP's maps (section 3.2, Eq. 4): only ``W_i, b_i`` learn, the model is frozen.

Data: the model's own greedy answers (:mod:`common.selfdistill`'s corpus), so the teacher for
an anchor ``q`` is the model's own distribution along its greedy continuation. One frozen
forward over a sequence gives the cache, the real state of every position at every layer,
and the teacher's distributions; then, for every anchor of the sequence at once, step ``i``
(0-based) maps the anchors' real states at layer ``t_i`` to pseudo states at positions
``q + 1 + i`` and runs them through layers ``t_i .. d-1``, each seeing its anchor's prefix and
(unless ``mask_earlier``) its own earlier pseudo states, exactly as decoding runs them; the
loss is ``sum_i KL(teacher at q + 1 + i || pseudo state i)``, averaged over anchors. Gradients
reach ``W_i`` only through the frozen upper layers (and, through attention, from later steps).

Decisions the paper leaves open (documented here, used by the entry point): KL(teacher ||
student) as Medusa and prompt decoding use it; steps >= 2 see the earlier pseudo states during
training as they do in decoding; identity initialisation (:class:`firp.maps.FirpMaps`).
"""
from __future__ import annotations

import torch
from torch import nn

from common.cache import crop_to
from common.fast import new_cache
from common.forward import final_norm, num_layers, run_layers

from .maps import FirpMaps


@torch.no_grad()
def teacher_forward(model, ids: torch.Tensor):
    """``(cache of L positions, hidden states per layer input [d+1] x [L, H], [L, V] log-probs)``."""
    cache = new_cache(model)
    out = model(input_ids=ids[None], past_key_values=cache, use_cache=True, output_hidden_states=True)
    return cache, [h[0] for h in out.hidden_states], out.logits[0].float().log_softmax(-1)


def anchor_logits(model, maps: FirpMaps, cache, hidden: list[torch.Tensor], anchors: torch.Tensor, length: int,
                  mask_earlier: bool = False) -> torch.Tensor:
    """``[B, K, V]`` logits of every anchor's pseudo states (with gradients into ``maps``).

    ``cache`` holds the sequence's ``length`` positions and is restored to them on return.
    """
    d, B, dev = num_layers(model), anchors.numel(), anchors.device
    prefix = torch.arange(length, device=dev)[None, :] <= anchors[:, None]            # [B, L]
    own = torch.eye(B, dtype=torch.bool, device=dev)
    out = []
    for i, layer in enumerate(maps.layers):
        states = maps(i, hidden[layer][anchors])                                        # [B, H]
        # at layer t_i the cache holds the sequence and the i earlier steps' blocks (B each)
        earlier = [torch.zeros_like(own) if mask_earlier else own for _ in range(i)]
        past_allow = torch.cat([prefix, *earlier], dim=1)
        h = run_layers(model, states[None], cache, layer, d, (anchors + 1 + i)[None], own, past_allow)
        out.append(model.lm_head(final_norm(model, h[0])))
    crop_to(cache, length)
    return torch.stack(out, dim=1)


def sequence_loss(model, maps: FirpMaps, ids: torch.Tensor, anchors: torch.Tensor, mask_earlier: bool = False):
    """Eq. 4 over the anchors of one greedy sequence ``[L]`` (anchors ``q <= L - 1 - K``)."""
    cache, hidden, teacher = teacher_forward(model, ids)
    student = anchor_logits(model, maps, cache, hidden, anchors, ids.numel(), mask_earlier).float().log_softmax(-1)
    rows = anchors[:, None] + 1 + torch.arange(maps.steps, device=ids.device)[None]
    return nn.functional.kl_div(student, teacher[rows], log_target=True, reduction="none").sum(-1).mean()


@torch.inference_mode()
def step_accuracy(model, maps: FirpMaps, seqs: list[torch.Tensor], starts: list[int], topk: int = 10,
                  mask_earlier: bool = False) -> list[list[float]]:
    """``acc[i][r]``: how often step ``i``'s rank-``r`` guess is the model's own greedy token at
    distance ``i + 2`` from the anchor, over every anchor inside held-out greedy answers."""
    K = maps.steps
    hits, total = torch.zeros(K, topk), 0
    for ids, start in zip(seqs, starts):
        L = ids.numel()
        anchors = torch.arange(max(start - 1, 0), L - K, device=ids.device)
        if anchors.numel() == 0:
            continue
        cache, hidden, teacher = teacher_forward(model, ids)
        ranks = anchor_logits(model, maps, cache, hidden, anchors, L, mask_earlier).topk(topk, dim=-1).indices.cpu()
        rows = (anchors[:, None] + 1 + torch.arange(K, device=ids.device)[None]).cpu()
        hits += (ranks == teacher.argmax(-1).cpu()[rows][..., None]).float().sum(0)
        total += anchors.numel()
    return (hits / max(total, 1)).tolist()
