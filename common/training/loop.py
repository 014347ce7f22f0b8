"""The one training loop: seeded, tqdm progress, checkpointed and resumable.

Every trained component (Predictive Pipelined Decoding's intermediate heads, Medusa heads, the distilled draft model,
FIRP's linear maps, prompt tokens) trains a small module on top of a frozen model through
:func:`train`. A checkpoint holds the module, optimizer, scheduler, step, RNG state and the
config it was trained with; resuming with another config is an error, not a silent mix.
Resuming gives exactly the parameters of an uninterrupted run (same seed, same batches).

With an ``evaluate`` callback the loop also keeps a **learning curve** (held-out metrics every
``Stopping.eval_every`` steps, appended to a JSONL and to the checkpoint, so a resumed run
continues it) and stops when the held-out metric flattens or a wall-time budget is spent
(:class:`Stopping`); ``cfg.epochs`` is then only an upper bound.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from ..config import TrainConfig  # defined torch-free (the workflow builds it while planning)
from ..checkpoints import publish, run_path
# Checkpoint identity lives in common.checkpoints; re-exported for the paper packages and tools
# that still import it from the training loop.
from ..checkpoints import fingerprint, load_trained, read_trained, save_trained  # noqa: F401
from ..errors import UserError, check_range
from ..checks import differences
from ..paths import atomic_write, load_or_error
from ..records import write_json, write_jsonl


def _schedule(total: int, warmup: int, shape: str = "linear"):
    """The learning-rate factor at each step: linear warmup over ``warmup`` steps, then a
    linear or cosine decay to 0 at ``total``."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        left = max(0.0, (total - step) / max(1, total - warmup))  # 1 -> 0 after the warmup
        return left if shape == "linear" else 0.5 * (1 - math.cos(math.pi * left))
    return f


def _identity_config(cfg: TrainConfig) -> dict:
    """The config as a checkpoint's identity stores it. Fields added later are left out while
    at their defaults, so checkpoints written before they existed still resume."""
    d = asdict(cfg)
    for key, default in (("schedule", "linear"), ("max_steps", None)):
        if d[key] == default:
            del d[key]
    return d


@dataclass(frozen=True)
class Stopping:
    """When training stops before ``cfg.epochs``: the held-out curve has flattened, or the
    wall-time budget is spent. Not part of a checkpoint's identity (it changes when training
    ends, not what a step computes).

    Attributes:
        eval_every: steps between held-out evaluations (one more runs before the first step).
        patience: evaluations looked back over.
        min_delta: the flattening tolerance: stop when the best ``metric`` of the last
            ``patience`` evaluations beats the best before them by less than this.
        metric: key of the ``evaluate`` result to watch, larger is better (e.g. head-1 top-1).
        wall_budget_s: stop (after one last evaluation) once training and evaluation have taken
            this long, counted across resumes; None: no budget. A run stopped by its budget
            continues when it is resumed with a larger one, and a run stopped flat continues
            when resumed with a rule under which its curve is not flat (e.g. more patience).
        restore_best: when the run ends, publish the trainable weights of the evaluation with
            the best ``metric`` (early stopping as the textbooks define it), not the last
            step's: with patience the last ``patience`` evaluations are past the best by
            construction, and at a learning rate still near its peak the held-out metric swings
            between evaluations (the draft's top-1 fell 0.331 -> 0.283 over its last three).
            The last weights stay in the run state, so a run that continues resumes from them.
    """
    eval_every: int
    patience: int = 3
    min_delta: float = 0.005
    metric: str = "heldout_top1"
    wall_budget_s: float | None = None
    restore_best: bool = True

    def __post_init__(self):
        check_range("eval_every", self.eval_every, 1)
        check_range("patience", self.patience, 1)
        check_range("min_delta", self.min_delta, 0)
        if self.wall_budget_s is not None and not self.wall_budget_s > 0:
            raise UserError(f"wall_budget_s={self.wall_budget_s} is out of range; valid: > 0 or None")

    def flattened(self, curve: list[dict]) -> bool:
        """True when the last ``patience`` evaluations improved ``metric`` by < ``min_delta``."""
        values = [_scalar(r[self.metric]) for r in curve]
        if len(values) <= self.patience:
            return False
        return max(values[-self.patience:]) - max(values[:-self.patience]) < self.min_delta


def _scalar(v) -> float:
    """A metric that is a list (per head) is watched through its first entry (head 1)."""
    return float(v[0] if isinstance(v, (list, tuple)) else v)


def train(module: torch.nn.Module, examples: Sequence, loss_fn: Callable[[torch.nn.Module, list], torch.Tensor],
          cfg: TrainConfig, ckpt_path: Path, log_path: Path | None = None, meta: dict | None = None,
          desc: str = "train", evaluate: Callable[[torch.nn.Module], dict] | None = None,
          stop: Stopping | None = None, curve_path: Path | None = None,
          artifact: Path | None = None) -> list[dict]:
    """Train ``module`` on ``examples`` with AdamW; resume from ``ckpt_path`` if it exists.

    Args:
        examples: the training items; each epoch visits them in a seeded permutation, in
            batches of ``cfg.batch_size`` (lists handed to ``loss_fn``).
        loss_fn: ``(module, batch) -> scalar loss``.
        ckpt_path: the finished checkpoint, published when the run ends; the run's state is
            written every ``cfg.checkpoint_every`` steps (atomically) to :func:`run_path`, which
            a rerun resumes from.
        log_path: JSONL of ``{step, epoch, loss, lr}`` per step (rewritten on resume).
        meta: stored in the checkpoint beside the config (e.g. base model, layer indices);
            resuming with a different ``meta`` is an error.
        evaluate: ``(module) -> dict`` of held-out metrics (run under ``inference_mode``, the
            module in eval mode); needs ``stop``. Its results, with ``step``, ``wall_s``,
            ``examples_seen`` and ``train_loss`` (mean since the previous evaluation), form
            the learning curve, stored in the checkpoint and (rewritten after every
            evaluation) in ``curve_path``.
        stop: when to end before ``cfg.epochs`` (:class:`Stopping`).
        artifact: what the workflow declares for this run where that is not ``ckpt_path`` itself
            (e.g. an exported model's ``config.json``). Snakemake deletes a rerun job's declared
            outputs, not ``ckpt_path``; with ``artifact`` absent, a published checkpoint of another
            recipe is the leftover of the run being replaced, and this run starts afresh instead
            of refusing it.
    Returns:
        the per-step log; ``module`` holds the published weights (with ``stop.restore_best``,
        those of the best evaluation). The checkpoint's ``curve``, ``stopped`` (why training
        ended: ``"flat"``, ``"wall budget"``, ``"epochs"`` or ``"max steps"``) and
        ``chosen_step`` (the step whose weights it holds) are read with :func:`read_trained`.
    """
    if (evaluate is None) != (stop is None):
        raise UserError("train: evaluate and stop go together")
    if not examples:
        raise UserError("no training examples")
    ckpt_path = Path(ckpt_path)
    n_batches = math.ceil(len(examples) / cfg.batch_size)
    total = n_batches * cfg.epochs if cfg.max_steps is None else min(n_batches * cfg.epochs, cfg.max_steps)
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(1, round(cfg.warmup_frac * total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(total, warmup, cfg.schedule))
    identity = {"config": _identity_config(cfg), "meta": meta or {}, "n_examples": len(examples)}
    step, log, curve, wall, stopped, relabel = 0, [], [], 0.0, None, False
    best = None  # {"step", "value", "params"}: the trainable weights of the best evaluation so far
    work = run_path(ckpt_path)
    source = work if work.is_file() else ckpt_path if ckpt_path.is_file() else None
    # map to where the module lives: a run checkpoint from a lent GPU resumes on the CPU (and back)
    device = next(iter(params), torch.empty(0)).device
    state = _read_state(source, device) if source is not None else None
    if state is not None and state["identity"] != identity:
        # The published output is gone (a workflow rerun deletes it: the checkpoint itself, or
        # the artifact exported from it) and the recipe changed since: the run state belongs to
        # another recipe, so this run starts afresh. Otherwise a finished run of another recipe
        # would be overwritten silently: refuse.
        replaced = not ckpt_path.is_file() or (artifact is not None and not Path(artifact).exists())
        if not replaced:
            raise UserError(f"checkpoint {source} was trained with another config/data "
                            f"({differences(state['identity'], identity)}); delete it or restore that config")
        tqdm.write(f"{desc}: {source} was trained with another config/data; starting afresh")
        work.unlink(missing_ok=True)
        ckpt_path.unlink(missing_ok=True)
        state = None
    if state is not None:
        # a finished run publishes its best weights; it continues (a raised budget) from its last
        module.load_state_dict(state.get("last_module", state["module"]))
        best = state.get("best")
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, log = state["step"], state["log"]
        curve, wall, stopped = state.get("curve", []), state.get("wall_s", 0.0), state.get("stopped")
        relabel = stopped == "epochs" and step == total and total == cfg.max_steps
        if relabel:
            stopped = "max steps"  # a checkpoint from before the two were told apart (saved so below)
        if stopped == "wall budget" and stop is not None and (stop.wall_budget_s is None or wall < stop.wall_budget_s):
            stopped = None  # the budget was raised: the run continues where it stopped, curve and all
        elif stopped == "flat" and stop is not None and not stop.flattened(curve) \
                and (stop.wall_budget_s is None or wall < stop.wall_budget_s):
            stopped = None  # the rule was relaxed (e.g. more patience): the curve is not flat under it
    t_start = time.perf_counter() - wall  # wall time counts across resumes

    def chosen() -> dict | None:
        """The best evaluation's weights, when the run publishes those rather than its last."""
        return best if stop is not None and stop.restore_best and best is not None and best["step"] != step else None

    def save():
        work.parent.mkdir(parents=True, exist_ok=True)
        done = step >= total or stopped is not None
        weights, extra = module.state_dict(), {}
        if done and chosen() is not None:
            extra = {"last_module": weights}
            weights = {**weights, **best["params"]}
        state = {"identity": identity, "module": weights, "optimizer": opt.state_dict(),
                 "scheduler": sched.state_dict(), "step": step, "log": log, "curve": curve,
                 "wall_s": time.perf_counter() - t_start, "stopped": stopped, "done": done, "best": best,
                 "chosen_step": best["step"] if done and chosen() is not None else step, **extra}
        atomic_write(work, lambda tmp: torch.save(state, tmp), keep="the last checkpoint")
        if done:
            publish(work, ckpt_path)

    def run_eval():
        nonlocal best
        module.eval()
        with torch.inference_mode():
            res = evaluate(module)
        module.train()
        since = [r["loss"] for r in log if r["step"] > (curve[-1]["step"] if curve else 0)]
        curve.append({"step": step, "wall_s": round(time.perf_counter() - t_start, 2),
                      "examples_seen": step * cfg.batch_size,
                      "train_loss": sum(since) / len(since) if since else None, **res})
        if curve_path is not None:
            write_jsonl(curve_path, curve)
        value = _scalar(res[stop.metric])
        if stop.restore_best and (best is None or value >= best["value"]):  # a tie: the later, longer-trained one
            best = {"step": step, "value": value,
                    "params": {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}}

    module.train()
    if evaluate is not None and not curve and stopped is None:
        run_eval()  # the untrained component: the curve's first point
        save()
    if relabel:
        save()
    bar = tqdm(total=total, initial=step, desc=desc, unit="step")
    while step < total and stopped is None:
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
        if evaluate is not None:
            over = stop.wall_budget_s is not None and time.perf_counter() - t_start >= stop.wall_budget_s
            if step % stop.eval_every == 0 or step == total or over:
                run_eval()
                bar.write(f"{desc} step {step}: " + ", ".join(
                    f"{k}={_fmt(v)}" for k, v in curve[-1].items() if k.startswith("heldout")))
                stopped = "flat" if stop.flattened(curve) else "wall budget" if over \
                    else ("max steps" if total == cfg.max_steps else "epochs") if step == total else None
                save()
                continue
        if step % cfg.checkpoint_every == 0 or step == total:
            save()
    bar.close()
    if curve_path is not None and curve:
        # a finished run resumed (a workflow rerun deletes the curve with the other outputs, and
        # the run state, kept, is already done) evaluates nothing: the curve comes from its state
        write_jsonl(curve_path, curve)
    if not ckpt_path.is_file() and work.is_file():
        publish(work, ckpt_path)  # a finished run whose published checkpoint was deleted (a rerun)
    if chosen() is not None:
        module.load_state_dict(best["params"], strict=False)  # what was published
    module.eval()
    if log_path is not None:
        write_jsonl(log_path, log)
    return log


def chosen_row(state: dict) -> dict | None:
    """The learning-curve row of the weights a finished checkpoint holds (``chosen_step``: the
    best evaluation under ``Stopping.restore_best``; the last step for runs saved before it)."""
    curve = state.get("curve") or []
    step = state.get("chosen_step", state.get("step"))
    return next((r for r in curve if r["step"] == step), curve[-1] if curve else None)


def run_summary(ckpt_path: Path, log: list[dict], stop: Stopping, cfg: TrainConfig, started: float,
                curve_path: Path | None = None) -> dict:
    """After :func:`train` on the teacher cache: the statistics every such component reports
    (wall times, why it stopped, first and last loss, the held-out metrics untrained and at the
    end, the stopping rule and optimizer config); the curve is copied to ``curve_path``.

    ``train_wall_s`` is the training's own time (steps and evaluations) summed over every session
    that ran it, as :func:`finish_with_accuracy` reports it: what a cost table charges, also for a
    run resumed across sessions; ``session_wall_s`` is this session's, loading included.

    Args:
        log: :func:`train`'s per-step log.
        started: ``time.perf_counter()`` when this session began.
    """
    state = _read_state(ckpt_path, "cpu", mmap=True)  # mapped: only the curve and counters are read
    curve = state["curve"]
    if curve_path is not None:
        write_jsonl(curve_path, curve)

    def heldout(row: dict) -> dict:
        return {k: v for k, v in row.items() if k.startswith("heldout")}
    return {"train_wall_s": state["wall_s"], "session_wall_s": time.perf_counter() - started, "stopped": state["stopped"],
            "steps": state["step"], "chosen_step": state.get("chosen_step", state["step"]), "first_loss": log[0]["loss"] if log else None,
            "final_loss": log[-1]["loss"] if log else None, "untrained": heldout(curve[0]), "final": heldout(chosen_row(state)),
            "stopping": asdict(stop), "config": asdict(cfg)}


def _read_state(path: Path, device, mmap: bool = False) -> dict:
    """A run's state (a finished checkpoint or the run file beside it) on ``device``; a truncated,
    garbage or foreign file is one UserError naming it (training again from the start is the fix:
    the run's progress is in the damaged file)."""
    def load(p: Path) -> dict:
        state = torch.load(p, weights_only=False, map_location=device, mmap=mmap)
        if not isinstance(state, dict) or not isinstance(state.get("identity"), dict):
            raise ValueError("no run state written by common.training.loop")
        return state
    return load_or_error(path, load, "training checkpoint", "delete it and train again (the run starts afresh)")


def finish_with_accuracy(ckpt_path: Path, module: torch.nn.Module, model, acc: list[list[float]], out: Path,
                         curve_path: Path | None, started: float, **fields) -> dict:
    """After :func:`train`: store ``acc`` (the final held-out top-k accuracy per distance, what
    decoding builds its trees from) in the checkpoint, and write ``out/stats.json`` (and the
    curve to ``curve_path``).

    Args:
        acc: ``acc[d][r]``, rank-``r`` accuracy at distance ``d + 1``.
        started: ``time.perf_counter()`` when this session began (its wall time is reported
            beside the training's own, which counts across resumes).
        fields: the component's own statistics.
    Returns:
        the statistics.
    """
    ckpt_path = Path(ckpt_path)
    state = _read_state(ckpt_path, "cpu")  # rewritten only, never trained on
    state["acc"] = acc
    atomic_write(ckpt_path, lambda tmp: torch.save(state, tmp))
    n = sum(p.numel() for p in module.parameters())
    stats = {**fields, "steps": state["step"], "stopped": state["stopped"], "train_wall_s": state["wall_s"],
             "session_wall_s": time.perf_counter() - started, "params": n,
             "params_pct_of_base": 100.0 * n / sum(p.numel() for p in model.parameters()),
             "heldout_top1": [a[0] for a in acc], "heldout_top5": [sum(a[:5]) for a in acc], "acc": acc,
             "config": state["identity"]["config"]}
    write_json(Path(out) / "stats.json", stats)
    if curve_path is not None:
        write_jsonl(curve_path, state["curve"])
    return stats


def _fmt(v) -> str:
    return "[" + ", ".join(f"{x:.3f}" for x in v) + "]" if isinstance(v, (list, tuple)) else f"{v:.4f}"


