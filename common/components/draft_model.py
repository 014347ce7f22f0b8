"""A small draft model from the target's own first layers, distilled on the target's outputs.

The draft shares the target's tokenizer, embeddings, final norm and (tied) LM head, and keeps
its first ``n_layers`` decoder layers; the layers and the norm are then distilled to the
target's next-token distribution (its stored top-k over real ShareGPT text, the teacher cache
of :mod:`common.training.teacher`; embeddings and head frozen) until the top-1 agreement with the
target's greedy tokens on held-out greedy answers flattens. It is saved as an ordinary transformers checkpoint, so ``speculative`` and
``hf_assisted`` load it with ``draft=<folder>``; BiLD reuses the same family as its small model.

``keep``: train it with a reduced-vocabulary head (:mod:`common.components.reduced_head`, beyond the
papers): the head scores only the ``keep`` most frequent tokens of its training labels from the
first step, the losses renormalise over them (a position whose label is dropped is the large
model's to supply and teaches nothing), and the folder carries the kept ids as the sidecar
that model loading applies. A shallow draft with a short head is a small model at the size
ratio BiLD's T5-small/T5-large pairs have (~8%), where the 49 k-token head alone is 28 M of a
4-layer draft's 42 M parameters.

    python -m common.components.draft_model --model smollm2-135m-instruct --layers 4 --out .cache/components/embedded/draft \
        --teacher .cache/components/embedded/teacher.pt --heldout-corpus .cache/components/embedded/corpus.pt
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
from torch import nn

from ..training import teacher as teacher_cache
from ..errors import UserError, check_range, cli_main
from ..engine.forward import num_layers
from ..assets.models import param_count
from .reduced_head import reduce_vocab, write_sidecar
from .reduced_vocab import coverage, kept_ids, label_tokens
from ..records import write_json
from ..training.teacher import HardLabels, TeacherData
from ..training.cli import component_main
from ..training.loop import Stopping, TrainConfig, run_summary, train


def truncated_copy(model, n_layers: int):
    """A deep copy of ``model`` keeping decoder layers ``[0, n_layers)`` (LLaMA-style)."""
    d = num_layers(model)
    check_range("layers", n_layers, 1, d - 1)
    draft = copy.deepcopy(model)
    draft.model.layers = nn.ModuleList(list(draft.model.layers)[:n_layers])
    draft.config.num_hidden_layers = n_layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:n_layers]
    return draft


def padded_batch(data: TeacherData, seqs: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, T]`` ids of sequences ``seqs`` and the ``[B, T]`` flat index of each
    position in ``data`` (-1 on padding; a causal model's real positions never see it)."""
    spans = [data.span(s) for s in seqs]
    width = max(b - a for a, b in spans)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    flat = torch.full((len(seqs), width), -1, dtype=torch.long)
    for r, (a, b) in enumerate(spans):
        ids[r, :b - a] = data.ids[a:b].long()
        flat[r, :b - a] = torch.arange(a, b)
    return ids.to(device), flat


def position_logits(draft, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The draft's logits ``[P, V]`` at the ``P`` positions ``rows`` (``[B, T]`` bool) marks in
    ``ids`` (``[B, T]``). The LM head runs on those rows only: in a shallow draft the 49 k-token
    head is most of a step's work, and padding (and, for hard labels, every prompt position)
    would otherwise pay for it, forward and backward."""
    hidden = draft.model(input_ids=ids).last_hidden_state  # [B, T, H], after the final norm
    return draft.lm_head(hidden[rows.to(hidden.device)])  # [P, V]


def topk_targets(data: TeacherData, flat: torch.Tensor, temperature: float = 1.0, kept: torch.Tensor | None = None):
    """The teacher's top-k ids ``[P, k]`` and renormalised probabilities ``[P, k]`` at ``flat``;
    with ``kept`` (``[V]`` bool, a reduced head's vocabulary) renormalised over the kept ids only
    (rows with none kept are all zero)."""
    logp = data.top_logp[flat].float() / temperature
    idx, p = data.top_idx[flat].long(), logp.log_softmax(-1).exp()
    if kept is not None:
        p = p * kept[idx]
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    return idx, p


def kl_loss(data: TeacherData, temperature: float = 1.0, kept: torch.Tensor | None = None):
    """``(draft, batch of sequence indices) -> loss``: cross-entropy of the draft's full
    next-token distribution against the target's stored top-k distribution, renormalised
    (= KL(target_top-k || draft) up to the target's entropy, a constant), at every position.

    Top-k instead of the full distribution: the cache stores 32 of 49 k probabilities per
    position; on SmolLM2 over ShareGPT text they hold most of the mass, and the rest only
    spreads the draft over tokens it would never propose.
    """
    def loss(draft, batch):
        ids, flat = padded_batch(data, batch, draft.device)
        ok = flat >= 0
        logq = position_logits(draft, ids, ok).float().log_softmax(-1)  # [P, V]
        idx, p = topk_targets(data, flat[ok], temperature, kept)
        per = -(p.to(logq.device) * logq.gather(-1, idx.to(logq.device))).sum(-1)  # [P]
        if kept is None:
            return per.mean()
        has = (p.sum(-1) > 0).to(per.device)  # positions whose top-k holds a kept token
        return per[has].sum() / has.sum().clamp_min(1)
    return loss


def hard_loss(data: TeacherData, labels: str, kept: torch.Tensor | None = None):
    """``(draft, batch) -> loss``: cross-entropy on hard labels at the answer positions.

    ``labels="greedy"``: the target's own greedy token after each position (BiLD's *aligned*
    small model, section 3.5.1: trained on what the large model predicts); ``"text"``: the
    text's next token, ShareGPT's reference reply (BiLD's *unaligned* small model, trained on
    the task's references as the paper fine-tunes its small models).
    """
    kind = HardLabels.parse(labels)
    answer = torch.zeros(data.n_tokens, dtype=torch.bool)
    answer[data.answer_positions()] = True

    def loss(draft, batch):
        ids, flat = padded_batch(data, batch, draft.device)
        ok = flat >= 0
        ok[ok.clone()] = answer[flat[ok]]
        if kept is not None:  # a dropped label is the large model's to supply
            ok[ok.clone()] = kept[kind.at(data, flat[ok])]
        logits = position_logits(draft, ids, ok).float()
        f = flat[ok]
        y = kind.at(data, f)
        if not len(y):
            return logits.sum() * 0.0
        return nn.functional.cross_entropy(logits, y.to(logits.device))
    return loss


LABELS = ("topk", "greedy", "text")


@torch.inference_mode()
def evaluate(draft, data: TeacherData, batch_size: int = 8, kept: torch.Tensor | None = None) -> dict:
    """Held-out metrics at the answer positions of the greedy corpus: top-1 agreement of the
    draft with the target's greedy token (the next id there; a dropped token of a reduced head
    counts as a miss), the top-k cross-entropy (``heldout_loss``, the training loss) and
    KL(target top-k renormalised || draft), both over the kept tokens of a reduced head."""
    answer = torch.zeros(data.n_tokens, dtype=torch.bool)
    answer[data.answer_positions()] = True
    hits = ce = kl = 0.0
    n = m = 0
    for i in range(0, len(data), batch_size):
        ids, flat = padded_batch(data, list(range(i, min(i + batch_size, len(data)))), draft.device)
        ok = flat >= 0
        ok[ok.clone()] = answer[flat[ok]]
        logq = position_logits(draft, ids, ok).float().log_softmax(-1).cpu()
        f = flat[ok]
        hits += float((logq.argmax(-1) == data.ids[f + 1].long()).sum())
        idx, p = topk_targets(data, f, kept=kept)
        lq = logq.gather(-1, idx)
        ce += float(-(p * lq).sum())
        kl += float((p * (p.clamp_min(1e-30).log() - lq)).sum())
        n += f.numel()
        m += int((p.sum(-1) > 0).sum())
    n, m = max(n, 1), max(m, 1)
    return {"heldout_top1": round(hits / n, 4), "heldout_loss": round(ce / m, 4), "heldout_kl": round(kl / m, 4)}


def distill(target, teacher: dict, n_layers: int, out_dir: Path, cfg: TrainConfig, tokenizer=None,
            stop: Stopping | None = None, curve_path: Path | None = None, labels: str = "topk",
            keep: int | None = None) -> dict:
    """Build, distill (on the teacher cache, :mod:`common.training.teacher`) and save the draft until
    its held-out top-1 agreement flattens; returns its stats (size, wall time, curve ends).

    ``labels``: ``"topk"`` (the target's stored top-k distribution: the distilled draft),
    ``"greedy"`` or ``"text"`` (hard labels, :func:`hard_loss`: BiLD's aligned and unaligned
    small models). ``keep``: train with a head over the ``keep`` most frequent training labels
    (the module docstring)."""
    if labels not in LABELS:
        raise UserError(f"labels={labels!r} is unknown; valid: {', '.join(LABELS)}")
    out_dir = Path(out_dir)
    stop = stop or Stopping(eval_every=50)
    tr, held = teacher["train"], teacher["heldout"]
    if labels == "topk" and tr.top_idx.shape[-1] == 0:
        raise UserError("labels=topk distils the target's top-k, and this training set carries none (a text-only "
                        "set); valid: labels=text, or a teacher cache with a pass over its training set")
    draft = truncated_copy(target, n_layers)
    kept = reduced = None
    if keep is not None:
        vocab = int(draft.config.vocab_size)
        check_range("keep", keep, 1, vocab - 1)
        counted = "text" if labels == "text" else "greedy"  # the labels the loss teaches
        train_labels = label_tokens(tr, counted)
        ids = kept_ids(train_labels, keep, draft.config)
        kept = torch.zeros(vocab, dtype=torch.bool)
        kept[ids] = True
        reduced = {"ids": ids, "labels": counted, "head": draft.lm_head, "tied": draft.config.tie_word_embeddings,
                   "train_coverage": round(coverage(train_labels, ids), 4),
                   "heldout_coverage": round(coverage(label_tokens(held, "greedy"), ids), 4)}
        reduce_vocab(draft, ids)  # its rows are the (frozen, tied) head's: only the scored set shrinks
    for name, p in draft.named_parameters():
        # embeddings and the tied head stay the target's: only layers and the final norm learn
        p.requires_grad_(name.startswith("model.layers") or name.startswith("model.norm"))
    t0 = time.perf_counter()
    curve_file = out_dir / "curve.jsonl"
    loss = kl_loss(tr, kept=kept) if labels == "topk" else hard_loss(tr, labels, kept)
    meta = {"layers": n_layers, "target": Path(str(target.config.name_or_path)).name, "teacher": teacher["key"],
            **({} if labels == "topk" else {"labels": labels}), **({} if keep is None else {"keep": keep})}
    log = train(draft, list(range(len(tr))), loss, cfg, out_dir / "train.pt", out_dir / "train_log.jsonl", meta=meta,
                desc="draft distillation", evaluate=lambda m: evaluate(m, held, kept=kept), stop=stop,
                curve_path=curve_file, artifact=out_dir / "model" / "config.json")
    for p in draft.parameters():
        p.requires_grad_(False)
    params = param_count(draft)
    if reduced is not None:  # saved with the full head; the sidecar makes loading cut it again
        draft.lm_head, draft.config.tie_word_embeddings = reduced["head"], reduced["tied"]
    model_dir = out_dir / "model"
    draft.save_pretrained(model_dir)
    if reduced is not None:
        write_sidecar(model_dir, reduced["ids"], reduced["labels"], "trained with this head (common.components.draft_model --keep)")
    if tokenizer is not None:
        tokenizer.save_pretrained(model_dir)
    stats = {"layers": n_layers, "labels": labels, "params": params,
             "params_not_shared": sum(p.numel() for n, p in draft.named_parameters() if n.startswith("model.layers")),
             **({} if reduced is None else {"keep": keep, "head_params": keep * int(draft.config.hidden_size),
                                            "train_coverage": reduced["train_coverage"],
                                            "heldout_coverage": reduced["heldout_coverage"]}),
             **run_summary(out_dir / "train.pt", log, stop, cfg, t0, curve_path),
             "train_sequences": len(tr), "train_tokens": tr.n_tokens, "heldout_sequences": len(held),
             "teacher": teacher["key"], **teacher_cache.cost_fields(teacher), "threads": torch.get_num_threads()}
    write_json(out_dir / "stats.json", stats)
    return stats


def _main(argv=None) -> None:
    def add_args(ap):
        ap.add_argument("--layers", type=int, default=4)
        ap.add_argument("--keep", type=int, default=None,
                        help="train with an LM head over this many most frequent training labels (default: all)")
        ap.add_argument("--labels", default="topk", choices=LABELS,
                        help="topk: distil the target's top-k (the draft); greedy / text: hard labels, the "
                             "target's greedy tokens / the reference text (BiLD's aligned / unaligned small model)")

    def run(a, model, tok, data, cfg, stop):
        return distill(model, data, a.layers, a.out, cfg, tok, stop, a.curve_out, a.labels, a.keep)

    component_main("distill a draft model from the target's first layers on the teacher cache", add_args, run,
                   (teacher_cache.add_args, teacher_cache.from_args, teacher_cache.check_args), argv, lr=5e-4, batch_size=4)


if __name__ == "__main__":
    cli_main(_main)
