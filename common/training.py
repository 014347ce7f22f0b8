"""The one training loop: seeded, tqdm progress, checkpointed and resumable.

Every trained component (Predictive Pipelined Decoding's intermediate heads, Medusa heads, the distilled draft model,
FIRP's linear maps, prompt tokens) trains a small module on top of a frozen model through
:func:`train`. A checkpoint holds the module, optimizer, scheduler, step, RNG state and the
config it was trained with; resuming with another config is an error, not a silent mix.
Resuming gives exactly the parameters of an uninterrupted run (same seed, same batches).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from .config import TrainConfig  # defined torch-free (the workflow builds it while planning)
from .errors import UserError


def _schedule(total: int, warmup: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


def train(module: torch.nn.Module, examples: Sequence, loss_fn: Callable[[torch.nn.Module, list], torch.Tensor],
          cfg: TrainConfig, ckpt_path: Path, log_path: Path | None = None, meta: dict | None = None,
          desc: str = "train") -> list[dict]:
    """Train ``module`` on ``examples`` with AdamW; resume from ``ckpt_path`` if it exists.

    Args:
        examples: the training items; each epoch visits them in a seeded permutation, in
            batches of ``cfg.batch_size`` (lists handed to ``loss_fn``).
        loss_fn: ``(module, batch) -> scalar loss``.
        ckpt_path: written every ``cfg.checkpoint_every`` steps and at the end (atomically).
        log_path: JSONL of ``{step, epoch, loss, lr}`` per step (rewritten on resume).
        meta: stored in the checkpoint beside the config (e.g. base model, layer indices);
            resuming with a different ``meta`` is an error.
    Returns:
        the per-step log.
    """
    if not examples:
        raise UserError("no training examples")
    ckpt_path = Path(ckpt_path)
    n_batches = math.ceil(len(examples) / cfg.batch_size)
    total = n_batches * cfg.epochs
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(total, max(1, round(cfg.warmup_frac * total))))
    identity = {"config": asdict(cfg), "meta": meta or {}, "n_examples": len(examples)}
    step, log = 0, []
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, weights_only=False)
        if state["identity"] != identity:
            raise UserError(f"checkpoint {ckpt_path} was trained with another config/data "
                            f"({state['identity']}); delete it or restore that config")
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, log = state["step"], state["log"]

    def save():
        tmp = ckpt_path.with_name(ckpt_path.name + ".partial")
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"identity": identity, "module": module.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "step": step, "log": log, "done": step >= total}, tmp)
        os.replace(tmp, ckpt_path)

    module.train()
    bar = tqdm(total=total, initial=step, desc=desc, unit="step")
    while step < total:
        epoch, b = divmod(step, n_batches)
        # The permutation depends only on (seed, epoch): a resumed run sees the same batches.
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
        batch = [examples[i] for i in order[b * cfg.batch_size:(b + 1) * cfg.batch_size].tolist()]
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # dropout etc. reproducible per step
        loss = loss_fn(module, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        step += 1
        lv = float(loss.detach())
        log.append({"step": step, "epoch": epoch, "loss": lv, "lr": sched.get_last_lr()[0]})
        bar.update(1)
        bar.set_postfix(loss=f"{lv:.3f}")
        if step % cfg.checkpoint_every == 0 or step == total:
            save()
    bar.close()
    module.eval()
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(log_path) + ".partial")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in log))
        os.replace(tmp, log_path)
    return log


def fingerprint(model) -> dict:
    """What a trained component is tied to: a checkpoint made for another base model (name,
    depth, width or vocabulary) is refused when loaded."""
    c = model.config
    return {"base": Path(str(c.name_or_path)).name, "layers": c.num_hidden_layers,
            "hidden": c.hidden_size, "vocab": c.vocab_size}


def read_trained(ckpt_path: Path, hint: str = "train it first") -> dict:
    """The state of a finished checkpoint (``identity``, ``module``, ...), read once."""
    ckpt_path = Path(ckpt_path)
    if not ckpt_path.is_file():
        raise UserError(f"checkpoint {ckpt_path} does not exist; {hint}")
    state = torch.load(ckpt_path, weights_only=False, map_location="cpu")
    if not isinstance(state, dict) or "identity" not in state or "module" not in state:
        raise UserError(f"{ckpt_path} is not a checkpoint written by common.training")
    if not state.get("done"):
        raise UserError(f"checkpoint {ckpt_path} is from an unfinished run; rerun training to resume it")
    return state


def load_trained(module: torch.nn.Module, ckpt, meta: dict | None = None) -> dict:
    """Load a finished checkpoint (a path, or a state from :func:`read_trained`) into
    ``module``; returns its identity (config, meta). ``meta`` must match the stored one."""
    state = ckpt if isinstance(ckpt, dict) else read_trained(ckpt)
    if meta is not None and state["identity"]["meta"] != meta:
        raise UserError(f"checkpoint was trained for {state['identity']['meta']}, not {meta}")
    module.load_state_dict(state["module"])
    module.eval()
    return state["identity"]


def save_trained(module: torch.nn.Module, ckpt_path: Path, meta: dict) -> None:
    """Store ``module`` as a finished checkpoint without training it (random components for
    tests of the decoders that load them)."""
    ckpt_path = Path(ckpt_path)
    ckpt_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_path.with_name(ckpt_path.name + ".partial")
    torch.save({"identity": {"config": None, "meta": meta, "n_examples": 0}, "module": module.state_dict(),
                "step": 0, "log": [], "done": True}, tmp)
    os.replace(tmp, ckpt_path)
