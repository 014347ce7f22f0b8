"""A draft model whose LM head scores only its most frequent tokens (beyond the papers).

On a 49 k-token vocabulary the LM head is most of a shallow draft's step (SmolLM2-135M: 28 M
of the 4-layer draft's 42 M multiply-adds, and as much of the weights it reads). Keeping the
head's rows of the ``keep`` most frequent tokens of the draft's own training labels makes each
draft step read a sixth of that, at the price of never proposing the other tokens: a token
outside the kept set is one the large model must supply (fallback, rollback, or rejection).

The kept rows are the trained head's rows, unchanged, so over the kept tokens the reduced
draft's distribution is the full draft's renormalised: its argmax equals the full draft's
wherever that is a kept token, and its confidence (max probability) is at least as high. The
head still returns ``[.., V]`` logits over the whole vocabulary (the dropped tokens at the
dtype's lowest value, so their probability is exactly 0 and no ``0 * -inf`` arises), so every
decoder and check that expects the target's vocabulary takes the reduced draft unchanged.

A reduced draft is an ordinary checkpoint plus ``reduced_vocab.json`` (the kept ids) in its
folder; the head and that sidecar are :mod:`common.components.reduced_head` (what model loading applies,
through a load hook); this module chooses the kept ids and writes the folder.

    python -m common.components.reduced_vocab --model .cache/components/embedded/bild_small_aligned/model \
        --teacher .cache/components/embedded/teacher.pt --labels greedy --keep 8192 \
        --out .cache/components/embedded/bild_small_aligned_v8192/model --stats-out stats.json
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoConfig

from ..checks import ArgumentParser, check_out_path
from ..errors import UserError, check_range, cli_main
from ..records import write_json
from .reduced_head import write_sidecar
from ..training.teacher import HardLabels, read_cache

LABELS = tuple(m.value for m in HardLabels)


def frequent_tokens(ids: torch.Tensor, k: int, vocab: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The ``k`` most frequent ids of ``ids`` (``[N]``; ties to the smaller id), with ``always``
    (e.g. EOS) forced in; sorted ``[k]``."""
    check_range("keep", k, 1, vocab)
    counts = torch.bincount(ids.long().flatten(), minlength=vocab).double()
    for t in always:
        counts[t] = float("inf")
    # stable order: highest count first, then smallest id (argsort of -count is stable)
    order = torch.argsort(-counts, stable=True)
    return order[:k].sort().values


def label_tokens(data, labels: str) -> torch.Tensor:
    """The hard labels a small model was trained on at the answer positions of a teacher
    cache (:class:`common.training.teacher.TeacherData`): the target's greedy tokens or the text's."""
    return HardLabels.parse(labels).at(data, data.answer_positions())


def kept_ids(ids: torch.Tensor, keep: int, config) -> torch.Tensor:
    """The ``keep`` most frequent of the label ids ``ids`` (:func:`label_tokens`), the model
    ``config``'s EOS ids forced in (a small model must be able to end an answer); sorted ``[keep]``."""
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    return frequent_tokens(ids, keep, int(config.vocab_size), tuple(t for t in eos if t is not None))


def coverage(ids: torch.Tensor, keep: torch.Tensor) -> float:
    """Share of ``ids`` inside ``keep``."""
    return float(torch.isin(ids, keep).float().mean()) if ids.numel() else 0.0


def _main(argv=None) -> None:
    ap = ArgumentParser(prog="python -m common.components.reduced_vocab", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="a trained draft's checkpoint folder")
    ap.add_argument("--teacher", type=Path, required=True, help="the teacher cache the draft was trained on")
    ap.add_argument("--labels", required=True, choices=LABELS, help="the draft's training labels (counted)")
    ap.add_argument("--keep", type=int, required=True, help="how many of the most frequent tokens the head keeps")
    ap.add_argument("--out", type=Path, required=True, help="the reduced draft's checkpoint folder")
    ap.add_argument("--stats-out", type=Path, required=True)
    a = ap.parse_args(argv)
    check_out_path(a.stats_out)
    if not (a.model / "config.json").is_file():
        raise UserError(f"--model {a.model}: no checkpoint there (config.json missing); valid: a draft's model folder")
    cfg = AutoConfig.from_pretrained(a.model)
    vocab = int(cfg.vocab_size)
    check_range("--keep", a.keep, 1, vocab - 1)
    data = read_cache(a.teacher)
    train_ids, held_ids = label_tokens(data["train"], a.labels), label_tokens(data["heldout"], a.labels)
    keep = kept_ids(train_ids, a.keep, cfg)
    # the checkpoint is the trained draft's, unchanged; the sidecar names the kept rows
    tmp = a.out.with_name(a.out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(a.model, tmp)
    write_sidecar(tmp, keep, a.labels, str(a.model))
    shutil.rmtree(a.out, ignore_errors=True)
    tmp.replace(a.out)
    stats = {"keep": a.keep, "vocab": vocab, "labels": a.labels, "source": str(a.model),
             "train_coverage": round(coverage(train_ids, keep), 4),
             "heldout_coverage": round(coverage(held_ids, keep), 4),
             "head_params": a.keep * int(cfg.hidden_size), "full_head_params": vocab * int(cfg.hidden_size)}
    write_json(a.stats_out, stats)
    print(f"kept {a.keep} of {vocab} tokens: {stats['train_coverage']:.1%} of the training labels, "
          f"{stats['heldout_coverage']:.1%} of the held-out ones")


if __name__ == "__main__":
    cli_main(_main)
