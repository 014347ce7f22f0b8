"""The runtime half of a reduced vocabulary: the LM head over a token subset, and the files that
say which subset.

Two users, both beyond the papers:

* a reduced draft *model* (:mod:`common.components.reduced_vocab` builds one) is an ordinary checkpoint
  plus ``reduced_vocab.json`` (the kept token ids) in its folder. Model loading knows no draft
  variant: :func:`apply_sidecar` is registered as a load hook (entry-point group
  ``decoding_repro.load_hooks`` in ``pyproject.toml``), which :func:`common.assets.models.load_model`
  runs on every model it loads;
* a draft *head* that reads its tokens through the target's LM head (EAGLE's, Medusa's shared
  heads) drafts from the ``k`` most frequent answer tokens of its training data only (FR-Spec,
  EAGLE-3's draft vocabulary): ``draft_vocab.json`` beside the head lists the token ids by that
  frequency (:func:`write_draft_vocab`, written by the head's trainer or by this module's CLI
  for a head trained before), and :func:`reduced_readout` builds the restricted LM head.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import UserError

SIDECAR = "reduced_vocab.json"
DRAFT_VOCAB = "draft_vocab.json"  # token ids by training frequency (a draft head's ``vocab`` option)


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

    def topk(self, hidden: torch.Tensor, k: int, log_softmax: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` best kept tokens of each ``[..., H]`` row, without the ``[..., V]`` logits:
        (scores, token ids), each ``[..., k]``; ``k`` at most the kept count. With ``log_softmax``
        the scores are log-probabilities normalized over the kept tokens, which equal the full
        head's (every other logit of ``forward`` is the dtype's minimum, whose exponential is 0)."""
        sub = self.proj(hidden)                                            # [..., K]
        if log_softmax:
            sub = torch.log_softmax(sub.float(), dim=-1)
        v, i = sub.topk(k, dim=-1)
        return v, self.keep[i]


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


def _id_list(path: Path, key: str, what: str, fix: str) -> list[int]:
    """``{key: [token ids]}`` from a JSON file; damage or another shape is one UserError."""
    from ..paths import load_json

    ids = load_json(path, what, fix).get(key)
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise UserError(f"{path} is not a {what}: no list of token ids under {key!r}; {fix}")
    return ids


def write_sidecar(folder, keep: torch.Tensor, labels: str, source: str) -> None:
    """Write ``folder``'s ``reduced_vocab.json``: the kept ids (``[K]``), the labels they were
    counted on and where the checkpoint came from."""
    from ..paths import atomic_write
    atomic_write(Path(folder) / SIDECAR, lambda tmp: tmp.write_text(
        json.dumps({"keep": keep.tolist(), "labels": labels, "source": source})))


def apply_sidecar(model, folder) -> bool:
    """Apply ``folder``'s ``reduced_vocab.json`` if it has one (what ``load_model`` calls)."""
    path = Path(folder) / SIDECAR
    if not path.is_file():
        return False
    keep = _id_list(path, "keep", "reduced-vocabulary file", "rebuild the folder: python -m common.components.reduced_vocab")
    reduce_vocab(model, torch.tensor(keep, dtype=torch.long))
    return True


# -- a draft head's vocabulary ------------------------------------------------------------------
def frequency_order(token_arrays, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids by how often they occur in ``token_arrays`` (an iterable of 1-D int arrays),
    most frequent first (ties by id), ids that never occur left out: ``(order [U], counts [U])``."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for a in token_arrays:
        a = np.asarray(a, dtype=np.int64)
        if a.size and (int(a.min()) < 0 or int(a.max()) >= vocab_size):
            raise UserError(f"token id {int(a.max()) if int(a.max()) >= vocab_size else int(a.min())} is outside "
                            f"the vocabulary; valid: ids in [0, {vocab_size}) (the base model's vocabulary size)")
        counts += np.bincount(a, minlength=vocab_size)
    order = np.argsort(-counts, kind="stable")
    order = order[counts[order] > 0]
    return order, counts[order]


def write_draft_vocab(folder: Path, order, counts=None) -> None:
    """Store token ids in draft-vocabulary order (most frequent first) beside a head."""
    from ..paths import atomic_write
    data = {"order": [int(t) for t in order]}
    if counts is not None:
        data["counts"] = [int(c) for c in counts]
    atomic_write(Path(folder) / DRAFT_VOCAB, lambda tmp: tmp.write_text(json.dumps(data)))


def reduced_readout(model, folder: Path, k: int) -> ReducedHead:
    """The target's LM head restricted to the ``k`` first ids of ``folder``'s draft vocabulary
    (:class:`ReducedHead`: full-vocabulary logits, the rest at the minimum; its ``proj``
    ``[k, H]`` and ``keep`` ``[k]`` give the kept scores alone), on the target's kernels."""
    from ..engine.fast import pack_like

    path = Path(folder) / DRAFT_VOCAB
    if not path.is_file():
        raise UserError(f"vocab={k} needs {path} (written when the head is trained, or by python -m "
                        "common.components.reduced_head for a head trained before); valid: vocab=null for the full vocabulary")
    order = _id_list(path, "order", "draft vocabulary", "retrain the head, or rewrite the file: "
                     "python -m common.components.reduced_head --help")
    if k > len(order):
        raise UserError(f"vocab={k} exceeds the {len(order)} tokens of {path}; valid: 1..{len(order)}")
    keep = torch.tensor(sorted(order[:k]), dtype=torch.long, device=model.device)
    head = ReducedHead(model.lm_head, keep)
    pack_like(head, model)
    return head.eval()


def _main(argv=None) -> None:
    """Write ``draft_vocab.json`` for a head trained before its trainer wrote one: the answer
    tokens of the corpus' training shards by frequency, what the trainers count."""
    import argparse

    from ..training import corpus
    from ..errors import cli_main

    ap = argparse.ArgumentParser(description=_main.__doc__.split(":")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a self-distillation corpus folder (common.training.corpus)")
    ap.add_argument("--vocab-size", type=int, required=True, help="the base model's vocabulary size")
    ap.add_argument("--out", type=Path, required=True, help="the head's folder")

    def run(a):
        if not a.out.is_dir():
            raise UserError(f"{a.out} is not a folder; valid: the folder of a trained head")
        order, counts = frequency_order((sh.tokens[sh.offsets[i] + sh.starts[i]:sh.offsets[i + 1]]
                                         for sh in corpus.iter_shards(a.corpus) for i in range(len(sh))),
                                        a.vocab_size)
        write_draft_vocab(a.out, order, counts)
        print(f"{a.out / DRAFT_VOCAB}: {len(order)} tokens, {int(counts.sum())} answer tokens counted")
    cli_main(lambda: run(ap.parse_args(argv)))


if __name__ == "__main__":
    _main()
