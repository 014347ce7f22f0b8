"""Intermediate-layer LM heads (Table 2's "Y" classifier; Table 4's recipe).

For each probed layer ``l`` a vocabulary projection reads the layer's hidden state through
the model's (frozen) final norm, ``logits = W_l @ norm(hs[l])``, exactly where the decoder's
exit classifier sits (:func:`common.engine.forward.logits_from_hidden` with ``head=W_l``). Every
model weight is frozen; only the heads train, with next-token cross-entropy on ShareGPT
replies (the paper: "we employ the ShareGPT dataset. We freeze all model parameters excluding
those of the language modeling classifier"; AdamW, warmup 0.04, weight decay 0).

Choices the paper leaves open, made here and recorded in the checkpoint:

* each head is **initialized from the model's LM head** (a copy; SmolLM2 ties it to the
  embeddings, which stay untouched), so "Y" starts exactly at "N";
* the loss covers the reply tokens of the first ShareGPT exchange (prompt through the chat
  template, as the decoding runs see it), FastChat-style; the conversations of the mined
  evaluation sets (``sharegpt-summarize`` / ``sharegpt-translate``) are excluded;
* one frozen forward per sequence (``output_hidden_states=True``) feeds every layer's head.

Training runs through :func:`common.training.loop.train` (seeded, tqdm, checkpoint every N steps
and at the end, resumable to the same result). With ``eval_every`` set it stops early when the
held-out learning curve flattens (or at ``wall_budget_s``): the watched metric is the mean over
layers of the held-out top-1 match with the final layer, the quantity Table 2's "Y" rows report
(the loss itself is next-token cross-entropy on the data, as in the paper). Outputs:

    python -m ppd_pipelined.heads --model smollm2-135m-instruct --layers 8,15,23,26,28 \
        --out .cache/ppd_pipelined/embedded --log results/ppd_pipelined/raw/heads_train.jsonl \
        --meta-out results/ppd_pipelined/raw/heads_meta.json [--curve-out heads_curve.jsonl]

``<out>/heads.pt`` (training checkpoint: all heads, optimizer, config), ``<out>/head_l<l>.pt``
(one ``nn.Linear`` state dict per layer, the decoder's ``head=`` option), the per-step loss
log, and a JSON with the configuration used, the wall time and the held-out loss, accuracy
and match with the final layer before and after training (what ``ppdp.table4`` prints).
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch
from torch import nn

from common.assets.data import load_dataset_samples
from common.checks import ArgumentParser, check_device, check_positive_int, differences
from common.errors import UserError, cli_main
from common.engine.forward import num_layers
from common.hardware import code_version, describe
from common.assets.prompts import encode_prompt
from common.paths import short_reason
from common.records import check_start
from common.training.loop import Stopping, TrainConfig, fingerprint, load_trained, read_trained, run_path, train

from .config import HeadsConfig, check_probed_layers

INIT = "copy of the model's LM head (final-layer classifier)"


class LayerHeads(nn.Module):
    """One ``Linear(H, V, bias=False)`` per probed layer, initialized from ``lm_head_weight``."""

    def __init__(self, layers, hidden: int, vocab: int, lm_head_weight: torch.Tensor | None = None):
        super().__init__()
        self.layers = [int(l) for l in layers]
        self.heads = nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in self.layers)
        if lm_head_weight is not None:
            for h in self.heads:
                h.weight.data.copy_(lm_head_weight.detach())

    def head(self, layer: int) -> nn.Linear:
        if layer not in self.layers:
            raise UserError(f"no trained head for layer {layer}; trained: {self.layers}")
        return self.heads[self.layers.index(layer)]


def new_heads(model, layers) -> LayerHeads:
    check_probed_layers(list(layers), num_layers(model))
    return LayerHeads(layers, model.config.hidden_size, model.lm_head.out_features,
                      model.lm_head.weight.float()).to(model.device)


# ---------------------------------------------------------------- data
def excluded_ids(eval_datasets) -> set[str]:
    """ShareGPT question ids of the mined evaluation sets (kept out of training)."""
    out = set()
    for name in eval_datasets:
        if name.startswith("sharegpt-"):
            out |= {s.question_id for s in load_dataset_samples(name)}
    return out


def build_sequences(tokenizer, cfg: HeadsConfig, exclude: set[str] = frozenset(),
                    samples=None) -> tuple[list[dict], list[dict]]:
    """``(train, holdout)`` sequences ``{"ids": [...], "start": first reply position}``.

    Seeded choice of conversations from ``cfg.dataset`` (minus ``exclude``); prompt through
    the chat template, at most ``max_len // 2`` tokens (its last ones), then the reply and EOS
    up to ``max_len`` tokens in all.
    """
    if samples is None:
        samples = load_dataset_samples(cfg.dataset)
    samples = [s for s in samples if s.question_id not in exclude and s.reference]
    random.Random(cfg.seed).shuffle(samples)
    need = cfg.sequences + cfg.holdout
    if len(samples) < need:
        raise UserError(f"dataset {cfg.dataset!r} has {len(samples)} usable conversations; "
                        f"heads.sequences + heads.holdout = {need}")
    eos = tokenizer.eos_token_id
    seqs = []
    for s in samples[:need]:
        prompt = encode_prompt(tokenizer, s.turns[0], max_prompt_tokens=cfg.max_len // 2)[0].tolist()
        reply = tokenizer(s.reference, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        ids = (prompt + reply)[: cfg.max_len]
        seqs.append({"ids": ids, "start": len(prompt), "question_id": s.question_id})
    return seqs[: cfg.sequences], seqs[cfg.sequences:]


@torch.no_grad()
def frozen_features(model, seq: dict, layers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One frozen forward: normed states ``[L, n, H]`` of the positions that predict the reply,
    their labels ``[n]`` and the final layer's argmax there ``[n]``."""
    ids = torch.tensor([seq["ids"]], device=model.device)
    out = model(input_ids=ids, output_hidden_states=True)
    lo, hi = seq["start"] - 1, ids.shape[1] - 1  # position t predicts token t + 1
    norm = model.model.norm
    feats = torch.stack([norm(out.hidden_states[l][0, lo:hi]) for l in layers]).float()  # heads train in fp32
    return feats, ids[0, lo + 1:hi + 1], out.logits[0, lo:hi].argmax(-1)


def heads_loss(model, heads: LayerHeads, batch: list[dict]) -> torch.Tensor:
    """Mean over layers of the token-mean cross-entropy; one frozen forward per sequence."""
    parts = [frozen_features(model, s, heads.layers) for s in batch]
    feats = torch.cat([p[0] for p in parts], dim=1)    # [L, N, H]
    labels = torch.cat([p[1] for p in parts])          # [N]
    losses = [nn.functional.cross_entropy(h(feats[i]), labels) for i, h in enumerate(heads.heads)]
    return torch.stack(losses).mean()


@torch.no_grad()
def evaluate(model, heads: LayerHeads, seqs: list[dict]) -> dict:
    """Per layer on held-out sequences: cross-entropy and top-1 accuracy on the data, and top-1
    agreement with the final layer (teacher-forced p_correct, k = 1)."""
    sums = {l: [0.0, 0, 0] for l in heads.layers}
    n = 0
    for s in seqs:
        feats, labels, final = frozen_features(model, s, heads.layers)
        n += len(labels)
        for i, (l, h) in enumerate(zip(heads.layers, heads.heads)):
            logits = h(feats[i])
            sums[l][0] += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
            top1 = logits.argmax(-1)
            sums[l][1] += int((top1 == labels).sum())
            sums[l][2] += int((top1 == final).sum())
    return {str(l): {"loss": v[0] / n, "acc": v[1] / n, "match_final": v[2] / n} for l, v in sums.items()} | \
        {"tokens": n}


# ---------------------------------------------------------------- train / load
def train_config(cfg: HeadsConfig) -> TrainConfig:
    """The optimizer part of the recipe, as the checkpoint identity records it."""
    return TrainConfig(**{f.name: getattr(cfg, f.name) for f in fields(TrainConfig)})


def curve_point(ev: dict) -> dict:
    """A learning-curve point from :func:`evaluate`: per-layer lists (in ``layers`` order) and
    ``heldout_match``, the watched mean over layers of the match with the final layer."""
    layers = [k for k in ev if k != "tokens"]
    match = [ev[k]["match_final"] for k in layers]
    return {"heldout_match": sum(match) / len(match), "heldout_match_by_layer": match,
            "heldout_acc": [ev[k]["acc"] for k in layers], "heldout_loss": [ev[k]["loss"] for k in layers],
            "detail": ev}  # the full evaluation (not "heldout_": progress prints those)


def stopping(cfg: HeadsConfig) -> Stopping | None:
    """Early stopping of the recipe (None: train every epoch)."""
    if cfg.eval_every is None:
        return None
    return Stopping(eval_every=cfg.eval_every, patience=cfg.patience, min_delta=cfg.min_delta,
                    metric="heldout_match", wall_budget_s=cfg.wall_budget_s)


def identity_meta(model, layers, cfg: HeadsConfig, n_excluded: int) -> dict:
    return {"model": fingerprint(model), "layers": [int(l) for l in layers], "init": INIT,
            "dataset": cfg.dataset, "sequences": cfg.sequences, "holdout": cfg.holdout, "max_len": cfg.max_len,
            "excluded_eval_conversations": n_excluded, "frozen": "every model weight (final norm included)"}


def train_heads(model, tokenizer, layers, cfg: HeadsConfig, out_dir: Path, log_path: Path | None = None,
                exclude: set[str] = frozenset(), sequences: tuple[list, list] | None = None,
                evaluate_holdout: bool = True, curve_path: Path | None = None) -> dict:
    """Train one head per layer; resume from ``out_dir/heads.pt``; returns the run's summary.

    ``sequences``: ``(train, holdout)`` token sequences to use instead of :func:`build_sequences`.
    ``curve_path``: the held-out learning curve (JSONL; with ``cfg.eval_every``).
    """
    model.requires_grad_(False)
    heads = new_heads(model, layers)
    train_seqs, holdout = sequences if sequences is not None else build_sequences(tokenizer, cfg, exclude)
    meta = identity_meta(model, layers, cfg, len(exclude))
    out_dir = Path(out_dir)
    stop = stopping(cfg)
    ckpt = out_dir / "heads.pt"
    # With early stopping the curve's first point is the untrained heads' evaluation (a full
    # held-out pass, ~1.5 min on the embedded recipe): reuse it rather than evaluate twice.
    resuming = ckpt.exists() or run_path(ckpt).exists()
    before = evaluate(model, heads, holdout) if evaluate_holdout and (stop is None or resuming) else None
    t0 = time.perf_counter()
    log = train(heads, train_seqs, lambda mod, batch: heads_loss(model, mod, batch), train_config(cfg),
                ckpt, log_path=log_path, meta=meta, desc="ppd heads",
                evaluate=(lambda h: curve_point(evaluate(model, h, holdout))) if stop else None, stop=stop,
                curve_path=curve_path)
    wall = time.perf_counter() - t0
    state = read_trained(ckpt)
    if evaluate_holdout and before is None:
        before = state["curve"][0]["detail"]
    after = evaluate(model, heads, holdout) if evaluate_holdout else None
    for l, h in zip(heads.layers, heads.heads):  # the decoder's head= format: one Linear state dict
        tmp = out_dir / f"head_l{l}.pt.partial"
        torch.save(h.state_dict(), tmp)
        os.replace(tmp, out_dir / f"head_l{l}.pt")
    return {"config": asdict(cfg), "train_config": asdict(train_config(cfg)), "meta": meta,
            "steps": len(log), "chosen_step": state.get("chosen_step", state["step"]),
            "train_tokens": sum(len(s["ids"]) - s["start"] for s in train_seqs),
            "train_wall_s": state["wall_s"], "session_wall_s": wall, "stopped": state["stopped"],
            "final_loss": log[-1]["loss"] if log else None,
            "holdout_before": before, "holdout_after": after, "checkpoint": str(ckpt)}


def load_heads(model, ckpt_path: Path) -> LayerHeads:
    """The trained heads of a finished checkpoint (refused for another base model)."""
    state = read_trained(ckpt_path, hint="train it first (rule ppdp_train_heads)")
    found, want = state["identity"]["meta"].get("model"), fingerprint(model)
    if found != want:
        diff = differences(found if isinstance(found, dict) else {"model": found}, want)
        raise UserError(f"heads checkpoint {ckpt_path} was trained for another model ({diff}); train them for this "
                        "one (rule ppdp_train_heads)")
    meta = state["identity"]["meta"]
    heads = LayerHeads(meta["layers"], model.config.hidden_size, model.lm_head.out_features)
    load_trained(heads, state)
    return heads.to(device=model.device, dtype=model.dtype)


def main(argv=None) -> None:
    ap = ArgumentParser(description="train the intermediate-layer LM heads of Predictive Pipelined Decoding (Table 4 recipe)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", required=True, help="comma-separated probed layers")
    ap.add_argument("--out", type=Path, required=True, help="folder for heads.pt and head_l<l>.pt")
    ap.add_argument("--log", type=Path, required=True, help="per-step loss JSONL")
    ap.add_argument("--meta-out", type=Path, required=True, help="JSON: config used, wall time, held-out check")
    ap.add_argument("--curve-out", type=Path, default=None, help="held-out learning curve JSONL (with eval_every)")
    ap.add_argument("--exclude-datasets", default="", help="comma-separated evaluation sets kept out of training")
    ap.add_argument("--config", default="{}", help="JSON of HeadsConfig fields")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", default="adhoc")
    a = ap.parse_args(argv)
    version = code_version()  # the code this process loaded (read now: a commit made beside the run is not it)
    check_start(a.meta_out, a.curve_out)
    try:
        cfg = HeadsConfig(**json.loads(a.config))
        layers = [int(x) for x in a.layers.split(",") if x]
    except (TypeError, ValueError) as e:
        raise UserError(f"bad heads config ({short_reason(e)}); valid: --config with HeadsConfig's fields as a "
                        "JSON object, --layers as comma-separated integers") from None
    check_probed_layers(layers)
    # every cheap check before the model loads
    check_positive_int("--threads", a.threads)
    device = str(check_device(a.device))
    if a.threads:
        torch.set_num_threads(a.threads)
    from common.assets.models import load_model
    model, tok = load_model(a.model, dtype=a.dtype, device=device)
    exclude = excluded_ids([d for d in a.exclude_datasets.split(",") if d])
    summary = train_heads(model, tok, layers, cfg, a.out, a.log, exclude, curve_path=a.curve_out)
    summary |= {"model_name": a.model, "profile": a.profile, "device": describe(a.device), "dtype": a.dtype,
                "code_version": version}
    a.meta_out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.meta_out.with_name(a.meta_out.name + ".partial")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, a.meta_out)
    print(json.dumps({k: summary[k] for k in ("steps", "train_tokens", "train_wall_s", "final_loss")}))


if __name__ == "__main__":
    cli_main(main)
