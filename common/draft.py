"""A small draft model from the target's own first layers, distilled on the target's outputs.

The draft shares the target's tokenizer, embeddings, final norm and (tied) LM head, and keeps
its first ``n_layers`` decoder layers; the layers and the norm are then distilled to the
target's next-token distribution (KL on self-distilled ShareGPT answers; embeddings and head
frozen). It is saved as an ordinary transformers checkpoint, so ``speculative`` and
``hf_assisted`` load it with ``draft=<folder>``; BiLD reuses the same family as its small model.

    python -m common.draft --model smollm2-135m-instruct --layers 4 --out .cache/draft/embedded
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import torch
from torch import nn

from .errors import check_range, cli_main
from .forward import num_layers
from .models import param_count
from .training import TrainConfig, train


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


def kl_loss(target, temperature: float = 1.0):
    """``(draft, batch) -> KL(target || draft)`` over answer positions, teacher run frozen."""
    def loss(draft, batch):
        total = 0.0
        for ex in batch:
            ids = torch.tensor([ex["ids"]], device=target.device)
            t0 = ex["start"] - 1
            with torch.no_grad():
                p = target(input_ids=ids).logits[0, t0:-1] / temperature
            q = draft(input_ids=ids).logits[0, t0:-1] / temperature
            total = total + nn.functional.kl_div(q.log_softmax(-1), p.log_softmax(-1), log_target=True,
                                                 reduction="batchmean")
        return total / len(batch)
    return loss


def distill(target, corpus: list[dict], n_layers: int, out_dir: Path, cfg: TrainConfig, tokenizer=None) -> dict:
    """Build, distill and save the draft; returns its stats (size, training time, final loss)."""
    out_dir = Path(out_dir)
    draft = truncated_copy(target, n_layers)
    for name, p in draft.named_parameters():
        # embeddings and the tied head stay the target's: only layers and the final norm learn
        p.requires_grad_(name.startswith("model.layers") or name.startswith("model.norm"))
    t0 = time.perf_counter()
    log = train(draft, corpus, kl_loss(target), cfg, out_dir / "train.pt", out_dir / "train_log.jsonl",
                meta={"layers": n_layers, "target": Path(str(target.config.name_or_path)).name},
                desc="draft distillation")
    for p in draft.parameters():
        p.requires_grad_(False)
    model_dir = out_dir / "model"
    draft.save_pretrained(model_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(model_dir)
    stats = {"layers": n_layers, "params": param_count(draft),
             "params_not_shared": sum(p.numel() for n, p in draft.named_parameters() if n.startswith("model.layers")),
             "train_wall_s": time.perf_counter() - t0, "first_loss": log[0]["loss"], "final_loss": log[-1]["loss"],
             "train_sequences": len(corpus)}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=1))
    return stats


def _main(argv=None) -> None:
    from .selfdistill import component_main

    def add_args(ap):
        ap.add_argument("--layers", type=int, default=4)

    def run(a, model, tok, corpus, cfg):
        return distill(model, corpus, a.layers, a.out, cfg, tok)

    component_main("distill a draft model from the target's first layers", add_args, run, argv, lr=5e-4)


if __name__ == "__main__":
    cli_main(_main)
