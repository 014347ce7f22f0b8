"""Training prompt tokens (section 3.3): only the prompt embeddings learn, the model is frozen.

Data: the model's own greedy answers (:mod:`common.selfdistill`'s corpus), so the greedy
continuation from any cut ``t`` inside an answer is the rest of the sequence, and one frozen
forward over a sequence gives both the context cache of every cut and the teacher's
distribution at every position. A cut's ``m`` prompt tokens sit at ``t + 1 .. t + m`` (prompt
token ``j`` stands in for the token at ``t + j`` and guesses the one after it); the teacher
for prompt token ``j`` (0-based) is the model's distribution at position ``t + 1 + j`` of the
greedy text. Loss (eq. 1, distillation): ``sum_j alpha^j KL(teacher_j || student_j)``, the
student being the EPT-averaged logits; without distillation, cross-entropy on the text's
tokens ``x[t + 2 + j]``.

Cheap on CPU: every cut of a sequence trains in one forward of ``cuts * m * n`` positions
against the sequence's cache (no gradient through the context); each block sees only its
cut's prefix (``past_allow``) and its own EPTs (the EPT mask). Tests check that these logits
equal the ones decoding computes inside the verification forward.
"""
from __future__ import annotations

import torch
from torch import nn

from common.cache import crop_to
from common.fast import new_cache
from common.forward import final_norm, num_layers, run_layers

from .prompts import PromptTokens

ALPHA = 0.8  # the decay ratio of eq. 1 (Medusa's head weighting)


@torch.no_grad()
def teacher_forward(model, ids: torch.Tensor):
    """One frozen forward over ``[L]`` ids: ``(cache of L positions, [L, V] log-probabilities)``."""
    cache = new_cache(model)
    logits = model(input_ids=ids[None], past_key_values=cache, use_cache=True).logits[0]
    return cache, logits.float().log_softmax(-1)


def cut_logits(model, prompts: PromptTokens, cache, cuts: torch.Tensor, length: int) -> torch.Tensor:
    """Student logits of the prompt tokens placed after each cut of one cached sequence.

    Args:
        cache: the sequence's cache (``length`` positions; restored to them on return).
        cuts: ``[B]`` positions ``t``; block ``b``'s prompt tokens sit at ``t_b + 1 ..``.
    Returns:
        ``[B, m, V]`` EPT-averaged logits (with gradients into ``prompts``).
    """
    m, n, dev = prompts.m, prompts.n, cuts.device
    B, e = cuts.numel(), m * n
    states = prompts.embeddings.reshape(e, -1).repeat(B, 1)                         # [B*e, H]
    j = torch.arange(m, device=dev).repeat_interleave(n)                            # prompt token of each EPT
    pos = (cuts[:, None] + 1 + j[None]).reshape(-1)                                 # [B*e]
    block = torch.arange(B, device=dev).repeat_interleave(e)
    allow = (block[:, None] == block[None, :]) & prompts.allow(dev).repeat(B, B)    # own block, EPT mask
    past_allow = torch.arange(length, device=dev)[None, :] <= cuts[block][:, None]  # each cut's prefix
    h = run_layers(model, states[None].to(model.dtype), cache, 0, num_layers(model), pos[None], allow, past_allow)
    crop_to(cache, length)  # the prompt positions are never kept
    logits = model.lm_head(final_norm(model, h[0]))                                  # [B*e, V]
    return prompts.aggregate(logits.view(B, e, -1))


def sequence_loss(model, prompts: PromptTokens, ids: torch.Tensor, cuts: torch.Tensor, distill: bool = True,
                  alpha: float = ALPHA) -> torch.Tensor:
    """Eq. 1 averaged over the cuts of one greedy sequence ``[L]`` (cuts ``t <= L - 2 - m``)."""
    m = prompts.m
    cache, teacher = teacher_forward(model, ids)
    student = cut_logits(model, prompts, cache, cuts, ids.numel()).float().log_softmax(-1)   # [B, m, V]
    rows = cuts[:, None] + 1 + torch.arange(m, device=ids.device)[None]                     # [B, m]
    w = alpha ** torch.arange(m, device=ids.device, dtype=student.dtype)
    if distill:
        t = teacher[rows]                                                                    # [B, m, V]
        per = nn.functional.kl_div(student, t, log_target=True, reduction="none").sum(-1)   # [B, m]
    else:
        per = nn.functional.nll_loss(student.flatten(0, 1), ids[rows + 1].flatten(), reduction="none").view(rows.shape)
    return (per * w).sum(-1).mean()


@torch.inference_mode()
def guess_accuracy(model, prompts: PromptTokens, seqs: list[torch.Tensor], starts: list[int], topk: int = 10) -> list[list[float]]:
    """``acc[d][r]``: how often the rank-``r`` guess at distance ``d + 1`` is the model's own
    greedy token there, over every cut inside the answers of held-out greedy sequences (the
    table the candidate tree is built from)."""
    m = prompts.m
    hits, total = torch.zeros(m, topk), torch.zeros(m)
    for ids, start in zip(seqs, starts):
        L = ids.numel()
        cuts = torch.arange(max(start - 1, 0), L - m, device=ids.device)
        if cuts.numel() == 0:
            continue
        cache, teacher = teacher_forward(model, ids)
        ranks = cut_logits(model, prompts, cache, cuts, L).topk(topk, dim=-1).indices.cpu()  # [B, m, K]
        rows = (cuts[:, None] + 1 + torch.arange(m, device=ids.device)[None]).cpu()
        want = teacher.argmax(-1).cpu()[rows]                                                # [B, m]
        hits += (ranks == want[..., None]).float().sum(0)
        total += cuts.numel()
    return (hits / total.clamp(min=1)[:, None]).tolist()
