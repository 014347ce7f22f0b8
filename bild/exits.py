"""One prediction head shared by several exits of the model, trained on its frozen trunk: the
model of BiLD's early-exit variant (section 4.4, appendix 7.2.1) and of its CALM baseline.

The paper fine-tunes mT5-small with a loss over exits that share the prediction head:

* ``--loss bild``: ``L = (L_k + L_d) / 2``, the NLL after the first ``k`` layers (the small
  model, ``--exit-layer``) and after the last;
* ``--loss calm``: ``L = sum_i w_i L_i`` over every layer ``i = 1..d``, ``w_i = i / sum_j j``
  (CALM's weighted average, for its consistency across exits).

Deviation (full fine-tuning of the 135 M-parameter model is out of reach on 2 CPU cores): the
trunk (embeddings and decoder layers) stays frozen and only the shared exit head trains: the
final norm and an untied copy of the LM head, both initialised from the model's own. The
result is saved as an ordinary transformers checkpoint (the frozen layers, the trained norm and
head, ``tie_word_embeddings`` off), so a benchmark loads it as the large model: its ``vanilla``
is the paper's reference (the fine-tuned model), ``bild`` with ``exit_layer=k`` its early exit
and ``calm`` its exits at any layer, all through the same head.

Why not the draft family of :mod:`common.components.draft_model` (first ``k`` layers + final norm + head, BiLD's
separate small model): it trains its own copy of the ``k`` layers, so its keys/values are not
the large model's and it cannot share its cache, and its head serves the small model alone; the
early exit of the paper is a path *inside* the large model, one head shared with the last layer.

Labels: ``text`` (the teacher cache's ShareGPT reference replies, as the paper fine-tunes on the
task's references) or ``greedy`` (the model's own greedy tokens), at answer positions (every
one, or at most ``--per-sequence`` of each sequence: the cached states grow with positions x
exits), ``--batch-size`` positions a step. The trunk is frozen, so
its states at the exits are computed once before training and every step costs only the shared
head. Early stopping watches ``heldout_score``, minus the weighted loss on the held-out greedy
answers.

    python -m bild.exits --model smollm2-135m-instruct --loss bild --exit-layer 4 --labels text \\
        --teacher .cache/components/embedded/teacher.pt --heldout-corpus .cache/components/embedded/corpus.pt \\
        --out .cache/components/embedded/bild_exit_bild
"""
from __future__ import annotations

import copy
import dataclasses
import time
from enum import Enum
from pathlib import Path

import torch
from torch import nn

from common.checkpoints import fingerprint
from common.errors import UserError, check_range, cli_main
from common.engine.forward import check_layer, num_layers
from common.components.medusa_heads import layer_inputs
from common.records import content_digest, write_json
from common.training.teacher import HardLabels, TeacherData
from common.training.loop import Stopping, TrainConfig, run_summary, train

LABELS = ("text", "greedy")  # HardLabels' values, the CLI's default first


class ExitLoss(str, Enum):
    """How the shared exit head weighs its exits (a ``str`` enum: the value is what flags,
    stats and checkpoints store)."""
    BILD = "bild"  # BiLD's early exit: the small model's depth and the last layer, half each
    CALM = "calm"  # CALM: every layer, weight proportional to its depth

    @classmethod
    def parse(cls, value) -> "ExitLoss":
        try:
            return cls(value)
        except ValueError:
            raise UserError(f"loss {value!r} is unknown; valid: {', '.join(m.value for m in cls)}") from None

    @property
    def takes_exit_layer(self) -> bool:
        """Whether the loss needs ``--exit-layer`` (the one early exit it trains)."""
        return self is ExitLoss.BILD

    def weights(self, depth: int, exit_layer: int | None = None) -> dict[int, float]:
        """``{exit depth (layers run): weight}`` over a ``depth``-layer model."""
        if self is ExitLoss.BILD:
            if exit_layer is None or not 1 <= exit_layer < depth:
                raise UserError(f"--exit-layer {exit_layer} is out of range; valid: 1..{depth - 1} (below the "
                                f"model's {depth} layers)")
            return {exit_layer: 0.5, depth: 0.5}
        total = depth * (depth + 1) / 2
        return {i: i / total for i in range(1, depth + 1)}


LOSSES = tuple(m.value for m in ExitLoss)


def exit_weights(loss: str, depth: int, exit_layer: int | None = None) -> dict[int, float]:
    """``{exit depth (layers run): weight}`` of a loss over a ``depth``-layer model."""
    return ExitLoss.parse(loss).weights(depth, exit_layer)


class ExitHead(nn.Module):
    """The final norm and an untied copy of the LM head, shared by every exit: raw states
    ``[..., H]`` -> logits ``[..., V]``."""

    def __init__(self, model):
        super().__init__()
        self.norm = copy.deepcopy(model.model.norm)
        w = model.lm_head.weight
        self.head = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.head.weight.copy_(w)
        for p in self.parameters():
            p.requires_grad_(True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden))


def install(model, head: ExitHead):
    """Make ``head`` the model's own final norm and (untied) LM head, in place; returns the model.
    Every exit of :mod:`common.engine.forward` then reads it, and ``save_pretrained`` stores it."""
    with torch.no_grad():
        model.model.norm.load_state_dict(head.norm.state_dict())
        lm = nn.Linear(head.head.in_features, head.head.out_features, bias=False,
                       device=head.head.weight.device, dtype=head.head.weight.dtype)
        lm.weight.copy_(head.head.weight)
    lm.weight.requires_grad_(False)
    model.lm_head = lm
    model.config.tie_word_embeddings = False
    if getattr(model.config, "get_text_config", None) is not None:
        model.config.get_text_config().tie_word_embeddings = False
    return model


def train_positions(data: TeacherData, per_sequence: int | None, seed: int = 0) -> torch.Tensor:
    """``[P]`` sorted flat answer positions of ``data`` to train on: every one, or at most
    ``per_sequence`` of each sequence, drawn with a generator seeded by ``seed``."""
    answer = data.answer_positions()
    if per_sequence is None:
        return answer
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(len(data)):
        a, b = data.span(s)
        mine = answer[(answer >= a) & (answer < b)]
        if mine.numel() > per_sequence:
            mine = mine[torch.randperm(mine.numel(), generator=g)[:per_sequence].sort().values]
        out.append(mine)
    return torch.cat(out) if out else answer


def exit_labels(data: TeacherData, positions: torch.Tensor, labels: str) -> torch.Tensor:
    """``[P]`` the token each of ``positions`` is trained to predict: the text's next token or
    the model's greedy one."""
    return HardLabels.parse(labels).at(data, positions)


def exit_states(model, data: TeacherData, weights: dict[int, float], positions: torch.Tensor) -> torch.Tensor:
    """``[E, P, H]`` raw states of the frozen trunk at each exit depth (``sorted(weights)``) and
    each of ``positions``, in the model's dtype (held on the CPU: P x E x H of them). The trunk
    never trains, so one pass over the data serves every step and evaluation: a step then costs
    only the shared head's projections."""
    return layer_inputs(model, data, sorted(weights), positions=positions, normed=False, dtype=model.dtype)


def exit_loss(states: torch.Tensor, y: torch.Tensor, weights: dict[int, float]):
    """``(head, batch of item indices) -> loss``: ``sum_i w_i NLL_i`` over the batch's positions.

    Args:
        states: ``[E, P, H]`` the exits' states (:func:`exit_states`, exits ``sorted(weights)``).
        y: ``[P]`` labels (:func:`exit_labels`).
    """
    depths = sorted(weights)
    if states.shape[0] != len(depths) or states.shape[1] != y.numel():
        raise UserError(f"exit states {tuple(states.shape)} do not match {len(depths)} exits and {y.numel()} labels")

    def loss(head, batch):
        idx = torch.as_tensor(batch, dtype=torch.long)
        dev = head.head.weight.device
        target = y[idx].to(dev)
        return sum(weights[d] * nn.functional.cross_entropy(head(states[j, idx].to(dev)).float(), target)
                   for j, d in enumerate(depths))
    return loss


@torch.inference_mode()
def evaluate(head: ExitHead, states: torch.Tensor, y: torch.Tensor, weights: dict[int, float],
             batch_size: int = 256) -> dict:
    """Held-out metrics of the exits, ``states`` ``[E, P, H]`` (:func:`exit_states` of the
    held-out greedy corpus's answer positions, exits ``sorted(weights)``), ``y`` ``[P]`` their
    labels (the base model's greedy tokens):

    ``heldout_loss`` (the weighted NLL), ``heldout_score`` (its negative: what early stopping
    watches), and per exit, deepest last: ``heldout_nll`` and ``heldout_top1`` (agreement with
    the greedy token) and ``heldout_agree`` (agreement with the deepest exit's argmax: how
    often an exit would keep the full model's token)."""
    depths = sorted(weights)
    n = y.numel()
    if n == 0:
        raise UserError("the held-out corpus has no answer positions to evaluate the exits on")
    dev = head.head.weight.device
    nll = torch.zeros(len(depths), dtype=torch.float64)
    hits, agree = torch.zeros_like(nll), torch.zeros_like(nll)
    for i in range(0, n, batch_size):
        t = y[i:i + batch_size].to(dev)
        preds = []
        for j in range(len(depths)):
            logp = head(states[j, i:i + batch_size].to(dev)).float().log_softmax(-1)
            nll[j] += float(-logp.gather(-1, t[:, None]).sum())
            preds.append(logp.argmax(-1))
            hits[j] += float((preds[-1] == t).sum())
        for j, p in enumerate(preds):
            agree[j] += float((p == preds[-1]).sum())
    nll, hits, agree = nll / n, hits / n, agree / n
    loss = float(sum(weights[dd] * float(nll[j]) for j, dd in enumerate(depths)))
    r = lambda t: [round(float(x), 4) for x in t]  # noqa: E731
    return {"heldout_score": round(-loss, 4), "heldout_loss": round(loss, 4), "heldout_nll": r(nll),
            "heldout_top1": r(hits), "heldout_agree": r(agree), "heldout_positions": n}


def train_exits(model, teacher: dict, loss: str, out_dir: Path, cfg: TrainConfig, tokenizer=None,
                stop: Stopping | None = None, curve_path: Path | None = None, exit_layer: int | None = None,
                labels: str = "text", per_sequence: int | None = None, eval_positions: int | None = 1024) -> dict:
    """Train the shared exit head of ``model`` (frozen) with ``loss``'s weights on the teacher
    cache (:mod:`common.training.teacher`), install it, save the model to ``out_dir/model``; returns the
    stats (also ``out_dir/stats.json``).

    Training items are answer positions (at most ``per_sequence`` per training sequence),
    ``cfg.batch_size`` of them a step; the held-out metrics read the first ``eval_positions``
    answer positions of the held-out corpus."""
    out_dir = Path(out_dir)
    d = num_layers(model)
    kind = ExitLoss.parse(loss)
    weights = kind.weights(d, exit_layer)
    if kind.takes_exit_layer:
        check_layer(model, exit_layer, "--exit-layer")
    exit_layer = exit_layer if kind.takes_exit_layer else None
    stop = dataclasses.replace(stop or Stopping(eval_every=50), metric="heldout_score")
    tr, held = teacher["train"], teacher["heldout"]
    t0 = time.perf_counter()
    pos = train_positions(tr, per_sequence, cfg.seed)
    hpos = held.answer_positions()[:eval_positions]
    y, hy = exit_labels(tr, pos, labels), exit_labels(held, hpos, "text")
    states, hstates = exit_states(model, tr, weights, pos), exit_states(model, held, weights, hpos)
    states_wall = round(time.perf_counter() - t0, 1)
    head = ExitHead(model)
    meta = {"loss": kind.value, "exit_layer": exit_layer, "labels": labels,
            "per_sequence": per_sequence, **fingerprint(model), "teacher": teacher["key"]}
    curve_file = out_dir / "curve.jsonl"
    log = train(head, list(range(y.numel())), exit_loss(states, y, weights), cfg,
                out_dir / "train.pt", out_dir / "train_log.jsonl", meta=meta, desc=f"{loss} exit head",
                evaluate=lambda h: evaluate(h, hstates, hy, weights), stop=stop, curve_path=curve_file,
                artifact=out_dir / "model" / "config.json")
    install(model, head)
    model.save_pretrained(out_dir / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir / "model")
    stats = {"loss": kind.value, "exit_layer": exit_layer, "layers": d,
             "exit_depths": sorted(weights), "weights": [weights[k] for k in sorted(weights)], "labels": labels,
             "per_sequence": per_sequence, "train_positions": y.numel(), "batch_positions": cfg.batch_size,
             "trained_params": sum(p.numel() for p in head.parameters()), "frozen_trunk": True,
             "states_wall_s": states_wall, **run_summary(out_dir / "train.pt", log, stop, cfg, t0, curve_path),
             "train_sequences": len(tr), "train_tokens": tr.n_tokens, "heldout_sequences": len(held),
             "teacher": teacher["key"], "threads": torch.get_num_threads(),
             # what the sweeps' records name as model_digest (common.harness.bench): a sweep run before a retraining shows
             "model_digest": content_digest(out_dir / "model")}
    write_json(out_dir / "stats.json", stats)
    return stats


def _main(argv=None) -> None:
    from common.training import teacher
    from common.training.cli import component_main

    def add_args(ap):
        ap.add_argument("--loss", required=True, choices=LOSSES,
                        help="bild: (L_k + L_d) / 2 (early-exit BiLD); calm: sum_i i / sum_j j * L_i (CALM)")
        ap.add_argument("--exit-layer", type=int, default=None, help="k, the early exit's depth (--loss bild)")
        ap.add_argument("--labels", default="text", choices=LABELS,
                        help="text: the reference replies (the paper's fine-tuning); greedy: the model's own tokens")
        ap.add_argument("--per-sequence", type=int, default=None,
                        help="answer positions of each training sequence cached and trained on (at most; default all)")
        ap.add_argument("--eval-positions", type=int, default=1024, help="held-out answer positions evaluated")

    def check_args(a):
        if a.per_sequence is not None:
            check_range("--per-sequence", a.per_sequence, 1)
        check_range("--eval-positions", a.eval_positions, 1)
        kind = ExitLoss.parse(a.loss)
        if kind.takes_exit_layer and a.exit_layer is None:
            raise UserError(f"--loss {kind.value} needs --exit-layer k (the small model's depth)")
        if not kind.takes_exit_layer and a.exit_layer is not None:
            raise UserError(f"--loss {kind.value} weighs every layer; it takes no --exit-layer")

    def check_model(a, model):
        if ExitLoss.parse(a.loss).takes_exit_layer:
            check_layer(model, a.exit_layer, "--exit-layer")

    def run(a, model, tok, data, cfg, stop):
        return train_exits(model, data, a.loss, a.out, cfg, tok, stop, a.curve_out, a.exit_layer, a.labels,
                           a.per_sequence, a.eval_positions)

    component_main("train a prediction head shared by early exits (BiLD's early exit, CALM) on a frozen model",
                   add_args, run, (teacher.add_args, teacher.from_args, teacher.check_args), argv, lr=1e-3, batch_size=256,
                   check_args=check_args, check_model=check_model)


if __name__ == "__main__":
    cli_main(_main)
