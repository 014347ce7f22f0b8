"""The one command line of trained components: common flags, the frozen model, its training
data, early stopping, stats out.

Each trainer (``python -m common.components.medusa_heads``, ``common.components.draft_model``, the paper packages' own) declares its
own flags and a ``train_fn``; :func:`component_main` does the rest. A harness module: it loads
models and names the data sources, which the training loop (:mod:`common.training.loop`) does not.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..checks import check_device
from ..config import TrainConfig
from ..errors import UserError, check_range
from ..hardware import code_version, provenance
from ..assets.models import load_model
from ..records import check_start, content_digest, write_json
from .loop import Stopping


def add_train_args(ap, lr: float, batch_size: int, eval_every: int, max_epochs: int = 20) -> None:
    """The flags every component trainer takes (optimizer, early stopping, outputs, threads)."""
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True, help="output folder (checkpoint, curve, stats)")
    ap.add_argument("--stats-out", type=Path, default=None, help="also copy stats.json here (results/)")
    ap.add_argument("--curve-out", type=Path, default=None, help="the learning curve JSONL (results/)")
    ap.add_argument("--max-epochs", type=int, default=max_epochs, help="upper bound; early stopping ends sooner")
    ap.add_argument("--max-steps", type=int, default=None, help="upper bound on optimizer steps (quick runs)")
    ap.add_argument("--batch-size", type=int, default=batch_size)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--eval-every", type=int, default=eval_every, help="steps between held-out evaluations")
    ap.add_argument("--patience", type=int, default=3, help="evaluations looked back over")
    ap.add_argument("--min-delta", type=float, default=0.005, help="flattening tolerance on the watched metric")
    ap.add_argument("--wall-budget", type=float, default=None, help="seconds of training (and evaluation)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the frozen model and the component train (cpu, cuda, cuda:N)")
    ap.add_argument("--seed", type=int, default=0)


def train_setup(a, warmup_frac: float = 0.02, schedule: str = "linear"):
    """``(TrainConfig, Stopping)`` from :func:`add_train_args`' flags; sets threads and seed."""
    if a.threads is not None:
        check_range("--threads", a.threads, 1)
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = TrainConfig(lr=a.lr, epochs=a.max_epochs, batch_size=a.batch_size, seed=a.seed,
                      warmup_frac=warmup_frac, schedule=schedule, max_steps=a.max_steps)
    stop = Stopping(eval_every=a.eval_every, patience=a.patience, min_delta=a.min_delta, wall_budget_s=a.wall_budget)
    return cfg, stop


def decoded_folder(out: Path) -> Path:
    """The folder decoders load from a trainer's ``--out``: its ``model/`` subfolder for a whole
    model (the distilled draft, BiLD's small models), else ``out`` itself (heads, prompt tokens, maps)."""
    out = Path(out)
    return out / "model" if (out / "model").is_dir() else out


def component_main(description: str, add_component_args, train_fn, data, argv=None, lr: float = 1e-3,
                   batch_size: int = 4, eval_every: int = 50, warmup_frac: float = 0.02,
                   schedule: str = "linear", check_args=None, check_model=None) -> None:
    """The one command line of trained components: common flags, the frozen model, its
    training data, early stopping, stats out. The stats carry ``weights_path``, the folder decoders
    load (:func:`decoded_folder`, as ``--out`` names it), and ``weights_digest``, its
    :func:`common.records.content_digest`: the digest a benchmark record keeps under ``components``
    for that path, so a table that joins a benchmark with these stats can tell whether the benchmark
    decoded these weights (:func:`common.harness.report.weights_match`).

    Args:
        add_component_args: ``(parser) -> None`` adds the component's own flags.
        train_fn: ``(args, model, tokenizer, data, TrainConfig, Stopping) -> stats``.
        data: ``(add_args, from_args)`` or ``(add_args, from_args, check_args)`` of the data
            source: :mod:`common.training.teacher`'s cache (components read off final hidden
            states) or :mod:`common.training.seqtrain`'s greedy sequences (components that run
            inside the forward); its ``check_args(args)`` runs before the model loads.
        check_args: ``(args) -> None`` validates the component's own flags before anything is
            loaded (a bad value fails in a second, not after the corpus is built).
        check_model: ``(args, model) -> None`` validates them against the loaded model, still
            before the training data is built.
    """
    add_data_args, load_data, *check_data = data
    ap = argparse.ArgumentParser(description=description)
    add_train_args(ap, lr=lr, batch_size=batch_size, eval_every=eval_every)
    add_data_args(ap)
    add_component_args(ap)
    a = ap.parse_args(argv)
    version = code_version()  # the code this run loaded, named in its stats (not a commit made while it trains)
    check_start(a.stats_out, a.curve_out)  # refused now, not after the training
    # flags TrainConfig and Stopping do not see: a bad one fails now, not after the model loads
    if a.max_steps is not None:
        check_range("--max-steps", a.max_steps, 1)
    if a.out.exists() and not a.out.is_dir():
        raise UserError(f"--out {a.out} is a file; valid: a folder (made if absent) for the checkpoint and stats")
    cfg, stop = train_setup(a, warmup_frac, schedule)
    device = str(check_device(a.device))
    for check in (*check_data, check_args):
        if check:
            check(a)
    model, tok = load_model(a.model, device=device)
    for p in model.parameters():
        p.requires_grad_(False)
    if check_model:
        check_model(a, model)
    stats = train_fn(a, model, tok, load_data(a, model, tok), cfg, stop)
    stats.update(provenance(a.model, device, version))
    weights = decoded_folder(a.out)
    stats["weights_path"] = str(weights)   # as benchmark records name it (their decoder_config)
    stats["weights_digest"] = content_digest(weights)
    if a.stats_out:
        write_json(a.stats_out, stats)
    print(json.dumps({k: v for k, v in stats.items() if k not in ("accuracy", "acc")}, indent=1))
