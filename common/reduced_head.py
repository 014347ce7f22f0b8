"""The runtime half of a reduced-vocabulary draft: its LM head and the sidecar that carries it.

A reduced draft (:mod:`common.reduced_vocab` builds one, beyond the papers) is an ordinary
checkpoint plus ``reduced_vocab.json`` (the kept token ids) in its folder. Model loading knows
no draft variant: :func:`apply_sidecar` is registered as a load hook (entry-point group
``decoding_repro.load_hooks`` in ``pyproject.toml``), which :func:`common.models.load_model`
runs on every model it loads.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .errors import UserError

SIDECAR = "reduced_vocab.json"


class ReducedHead(nn.Module):
    """LM head over the vocabulary subset ``keep``.

    ``forward``: ``[..., H]`` hidden states -> ``[..., V]`` logits, the kept tokens' from
    ``proj`` (``[K, H]``, the original head's rows) and every other token's the dtype's minimum.
    """

    def __init__(self, head: nn.Linear, keep: torch.Tensor):
        super().__init__()
        self.vocab = head.out_features
        self.proj = nn.Linear(head.in_features, keep.numel(), bias=head.bias is not None,
                              device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(head.weight[keep])
            if head.bias is not None:
                self.proj.bias.copy_(head.bias[keep])
        self.register_buffer("keep", keep.to(head.weight.device), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = self.proj(hidden)                                            # [..., K]
        out = sub.new_full((*sub.shape[:-1], self.vocab), torch.finfo(sub.dtype).min)
        return out.index_copy_(-1, self.keep, sub)                         # [..., V]


def reduce_vocab(model, keep: torch.Tensor):
    """Replace ``model.lm_head`` (an ``nn.Linear``) by a :class:`ReducedHead` over ``keep``
    (``[K]`` distinct token ids), in place; returns ``model``. The head is untied from the
    input embeddings (it holds copies of the kept rows)."""
    head = getattr(model, "lm_head", None)
    if type(head) is not nn.Linear:
        raise UserError(f"a reduced vocabulary needs a model with an nn.Linear lm_head, not {type(head).__name__}")
    keep = torch.as_tensor(keep, dtype=torch.long).flatten()
    v = head.out_features
    if keep.numel() == 0 or keep.unique().numel() != keep.numel() or int(keep.min()) < 0 or int(keep.max()) >= v:
        raise UserError(f"reduced vocabulary: the kept ids must be distinct ids in [0, {v}), at least one")
    model.lm_head = ReducedHead(head, keep)
    model.config.tie_word_embeddings = False
    return model


def write_sidecar(folder, keep: torch.Tensor, labels: str, source: str) -> None:
    """Write ``folder``'s ``reduced_vocab.json``: the kept ids (``[K]``), the labels they were
    counted on and where the checkpoint came from."""
    from .paths import atomic_write
    atomic_write(Path(folder) / SIDECAR, lambda tmp: tmp.write_text(
        json.dumps({"keep": keep.tolist(), "labels": labels, "source": source})))


def apply_sidecar(model, folder) -> bool:
    """Apply ``folder``'s ``reduced_vocab.json`` if it has one (what ``load_model`` calls)."""
    path = Path(folder) / SIDECAR
    if not path.is_file():
        return False
    try:
        keep = json.loads(path.read_text())["keep"]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a reduced-vocabulary file ({e}); expected {{\"keep\": [token ids]}}") from e
    reduce_vocab(model, torch.tensor(keep, dtype=torch.long))
    return True
