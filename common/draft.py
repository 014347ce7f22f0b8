"""A small draft model from the target's own first layers, distilled on the target's outputs.

The draft shares the target's tokenizer, embeddings, final norm and (tied) LM head, and keeps
its first ``n_layers`` decoder layers; the layers and the norm are then distilled to the
target's next-token distribution (its stored top-k over real ShareGPT text, the teacher cache
of :mod:`common.teacher`; embeddings and head frozen) until the top-1 agreement with the
target's greedy tokens on held-out greedy answers flattens. It is saved as an ordinary transformers checkpoint, so ``speculative`` and
``hf_assisted`` load it with ``draft=<folder>``; BiLD reuses the same family as its small model.

    python -m common.draft --model smollm2-135m-instruct --layers 4 --out .cache/components/embedded/draft \
        --teacher .cache/components/embedded/teacher.pt --heldout-corpus .cache/components/embedded/corpus.pt
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
from torch import nn

from . import teacher as teacher_cache
from .errors import UserError, check_range, cli_main
from .forward import num_layers
from .models import param_count
from .records import write_json
from .teacher import HardLabels, TeacherData
from .train_cli import component_main
from .training import Stopping, TrainConfig, run_summary, train


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


def topk_targets(data: TeacherData, flat: torch.Tensor, temperature: float = 1.0):
    """The teacher's top-k ids ``[P, k]`` and renormalised probabilities ``[P, k]`` at ``flat``."""
    logp = data.top_logp[flat].float() / temperature
    return data.top_idx[flat].long(), logp.log_softmax(-1).exp()


def kl_loss(data: TeacherData, temperature: float = 1.0):
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
        logq = draft(input_ids=ids).logits[ok.to(draft.device)].float().log_softmax(-1)  # [P, V]
        idx, p = topk_targets(data, flat[ok], temperature)
        return -(p.to(logq.device) * logq.gather(-1, idx.to(logq.device))).sum(-1).mean()
    return loss


def hard_loss(data: TeacherData, labels: str):
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
        logits = draft(input_ids=ids).logits[ok.to(draft.device)].float()
        f = flat[ok]
        y = kind.at(data, f)
        return nn.functional.cross_entropy(logits, y.to(logits.device))
    return loss


LABELS = ("topk", "greedy", "text")


@torch.inference_mode()
def evaluate(draft, data: TeacherData, batch_size: int = 8) -> dict:
    """Held-out metrics at the answer positions of the greedy corpus: top-1 agreement of the
    draft with the target's greedy token (the next id there), the top-k cross-entropy
    (``heldout_loss``, the training loss) and KL(target top-k renormalised || draft)."""
    answer = torch.zeros(data.n_tokens, dtype=torch.bool)
    answer[data.answer_positions()] = True
    hits = ce = kl = 0.0
    n = 0
    for i in range(0, len(data), batch_size):
        ids, flat = padded_batch(data, list(range(i, min(i + batch_size, len(data)))), draft.device)
        ok = flat >= 0
        ok[ok.clone()] = answer[flat[ok]]
        logq = draft(input_ids=ids).logits[ok.to(draft.device)].float().log_softmax(-1).cpu()
        f = flat[ok]
        hits += float((logq.argmax(-1) == data.ids[f + 1].long()).sum())
        idx, p = topk_targets(data, f)
        lq = logq.gather(-1, idx)
        ce += float(-(p * lq).sum())
        kl += float((p * (p.clamp_min(1e-30).log() - lq)).sum())
        n += f.numel()
    n = max(n, 1)
    return {"heldout_top1": round(hits / n, 4), "heldout_loss": round(ce / n, 4), "heldout_kl": round(kl / n, 4)}


def distill(target, teacher: dict, n_layers: int, out_dir: Path, cfg: TrainConfig, tokenizer=None,
            stop: Stopping | None = None, curve_path: Path | None = None, labels: str = "topk") -> dict:
    """Build, distill (on the teacher cache, :mod:`common.teacher`) and save the draft until
    its held-out top-1 agreement flattens; returns its stats (size, wall time, curve ends).

    ``labels``: ``"topk"`` (the target's stored top-k distribution: the distilled draft),
    ``"greedy"`` or ``"text"`` (hard labels, :func:`hard_loss`: BiLD's aligned and unaligned
    small models)."""
    if labels not in LABELS:
        raise UserError(f"labels={labels!r} is unknown; valid: {', '.join(LABELS)}")
    out_dir = Path(out_dir)
    stop = stop or Stopping(eval_every=50)
    draft = truncated_copy(target, n_layers)
    for name, p in draft.named_parameters():
        # embeddings and the tied head stay the target's: only layers and the final norm learn
        p.requires_grad_(name.startswith("model.layers") or name.startswith("model.norm"))
    t0 = time.perf_counter()
    tr, held = teacher["train"], teacher["heldout"]
    curve_file = out_dir / "curve.jsonl"
    loss = kl_loss(tr) if labels == "topk" else hard_loss(tr, labels)
    meta = {"layers": n_layers, "target": Path(str(target.config.name_or_path)).name, "teacher": teacher["key"],
            **({} if labels == "topk" else {"labels": labels})}
    log = train(draft, list(range(len(tr))), loss, cfg, out_dir / "train.pt", out_dir / "train_log.jsonl", meta=meta,
                desc="draft distillation", evaluate=lambda m: evaluate(m, held), stop=stop, curve_path=curve_file)
    for p in draft.parameters():
        p.requires_grad_(False)
    model_dir = out_dir / "model"
    draft.save_pretrained(model_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(model_dir)
    stats = {"layers": n_layers, "labels": labels, "params": param_count(draft),
             "params_not_shared": sum(p.numel() for n, p in draft.named_parameters() if n.startswith("model.layers")),
             **run_summary(out_dir / "train.pt", log, stop, cfg, t0, curve_path),
             "train_sequences": len(tr), "train_tokens": tr.n_tokens, "heldout_sequences": len(held),
             "teacher": teacher["key"], "teacher_wall_s": teacher.get("wall_s"), "threads": torch.get_num_threads()}
    write_json(out_dir / "stats.json", stats)
    return stats


def _main(argv=None) -> None:
    def add_args(ap):
        ap.add_argument("--layers", type=int, default=4)
        ap.add_argument("--labels", default="topk", choices=LABELS,
                        help="topk: distil the target's top-k (the draft); greedy / text: hard labels, the "
                             "target's greedy tokens / the reference text (BiLD's aligned / unaligned small model)")

    def run(a, model, tok, data, cfg, stop):
        return distill(model, data, a.layers, a.out, cfg, tok, stop, a.curve_out, a.labels)

    component_main("distill a draft model from the target's first layers on the teacher cache", add_args, run,
                   (teacher_cache.add_args, teacher_cache.from_args), argv, lr=5e-4, batch_size=4)


if __name__ == "__main__":
    cli_main(_main)
