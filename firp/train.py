"""Training FIRP's maps (section 3.2, Eq. 4): only ``W_i, b_i`` learn, the model is frozen.

Data: the model's own greedy answers (:mod:`common.training.corpus`), so the teacher for
an anchor ``q`` is the model's own distribution along its greedy continuation. One frozen
forward over a sequence gives the cache, the real state of every position at every layer,
and the teacher's distributions. Step ``i`` (0-based) maps the anchors' real states at layer
``t_i`` to pseudo states at positions ``q + 1 + i`` and runs them through layers ``t_i .. d-1``
(all anchors of the sequence at once); its loss is ``KL(teacher at q + 1 + i || pseudo state
i)``, averaged over anchors. Gradients reach ``W_i`` only through the frozen upper layers.

Two modes (``--mode``):

* ``separate`` (the default, the paper's section 3.3: "we train K linear projections
  separately so we need to conduct the training process K times"): K trainings, one per map,
  each its own optimisation, schedule, early stopping and checkpoint
  (``DIR/separate/map<i>.pt``), assembled into ``DIR/maps.pt``. Step ``i``'s pseudo state sees
  what the paper's mask gives it: the real states up to ``q + i`` (positions the earlier steps'
  pseudo states stand in for when decoding) and itself; with ``mask_earlier`` only the real
  context up to its anchor ``q``. Its held-out curve (early stopping) is measured as decoding
  runs it, after the earlier, already trained maps. Each map gets the whole recipe (steps,
  wall budget) of its own.
* ``joint`` (what the committed maps were trained with, config ``firp.train.mode``): one
  training of all K maps on one loss, the mean of the K steps' ``KL(...)``, each step seeing the earlier
  steps' pseudo states (unless ``mask_earlier``) as decoding does, so gradients also reach
  ``W_i`` from later steps through attention.

Decisions the paper leaves open (documented here, used by the entry point): KL(teacher ||
student) as Medusa and prompt decoding use it; identity initialisation (:class:`firp.maps.FirpMaps`); AdamW
at lr 1e-3, 2% warmup then linear decay, no weight decay, gradient norm clipped at 1 (Medusa's
recipe); a step is ``--batch-size`` sequences with ``--anchors`` random anchors each, prompts
cut to 96 tokens and answers of 128 (the embedded corpus), early stopping on the held-out
step-1 top-1 instead of the paper's 2 fixed epochs (the layer sweeps of Figures 5-7 train a
fixed 2 epochs instead: config ``firp.variants``).

Figure 7's masked setting (``--mask-earlier``, "the second pseudo hidden state can not see the
first"): every step's pseudo state sees the real context up to its anchor and itself, none of
the earlier steps' states (real or pseudo), in training, in the held-out accuracy and (read from the
checkpoint's meta) in decoding. The paper does not say whether its masked maps were also
trained masked; here they are, so the comparison is of two trained settings.

Entry point::

    python -m firp.train --model smollm2-135m-instruct --out DIR \
        --corpus .cache/.../seq_corpus.pt --heldout-corpus .cache/.../corpus.pt [--mode joint]

writes ``DIR/maps.pt`` (a :mod:`common.training.loop` checkpoint that also holds ``acc``, the
held-out top-k accuracy per step the tree search reads), ``DIR/curve.jsonl`` (separate: every
map's curve, rows tagged ``map``), ``DIR/stats.json`` (with ``mode``).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from common.engine.cache import crop_to
from common.errors import UserError, check_range, cli_main
from common.engine.forward import final_norm, num_layers, run_layers
from common.paths import atomic_write
from common.records import write_jsonl
from common.training.seqtrain import cuts_loss, teacher_forward

from .maps import FirpMaps

MODES = ("separate", "joint")  # the paper's K trainings (the default); one training on the summed loss


def anchor_logits(model, maps: FirpMaps, cache, hidden: list[torch.Tensor], anchors: torch.Tensor, length: int,
                  mask_earlier: bool = False, trace: list | None = None, steps: int | None = None) -> torch.Tensor:
    """``[B, K, V]`` logits of every anchor's pseudo states as decoding computes them, each step
    after the earlier steps' (with gradients into ``maps``).

    ``cache`` holds the sequence's ``length`` positions and is restored to them on return.
    ``trace``: a list that receives, per step, the ``[B, H]`` pseudo states after each layer
    ``t_i .. d-1`` (the layers then run one at a time; same values). ``steps``: only the first
    ``steps`` steps (``[B, steps, V]``; None: all K).
    """
    d, B, dev = num_layers(model), anchors.numel(), anchors.device
    prefix = torch.arange(length, device=dev)[None, :] <= anchors[:, None]            # [B, L]
    own = torch.eye(B, dtype=torch.bool, device=dev)
    out = []
    for i, layer in enumerate(maps.layers[:steps]):
        states = maps(i, hidden[layer][anchors])                                        # [B, H]
        # at layer t_i the cache holds the sequence and the i earlier steps' blocks (B each)
        earlier = [torch.zeros_like(own) if mask_earlier else own for _ in range(i)]
        past_allow = torch.cat([prefix, *earlier], dim=1)
        pos = (anchors + 1 + i)[None]
        if trace is None:
            h = run_layers(model, states[None], cache, layer, d, pos, own, past_allow)
        else:
            h, per = states[None], []
            for li in range(layer, d):
                h = run_layers(model, h, cache, li, li + 1, pos, own, past_allow)
                per.append(h[0])
            trace.append(per)
        out.append(model.lm_head(final_norm(model, h[0])))
    crop_to(cache, length)
    return torch.stack(out, dim=1)


def step_logits(model, maps: FirpMaps, i: int, cache, hidden: list[torch.Tensor], anchors: torch.Tensor,
                length: int, mask_earlier: bool = False) -> torch.Tensor:
    """``[B, V]`` logits of step ``i`` (0-based) alone, as the paper trains it (section 3.3): the
    pseudo state at ``q + 1 + i`` sees the real states up to ``q + i`` and itself (with
    ``mask_earlier``, the real states up to its anchor ``q`` only), no other step's.

    Args:
        cache: the sequence's ``length`` positions (restored to them on return).
        hidden: the ``d + 1`` hidden states ``[L, H]`` of the frozen forward.
        anchors: ``[B]`` positions ``q <= length - 2 - i``.
    """
    d, B, dev = num_layers(model), anchors.numel(), anchors.device
    layer = maps.layers[i]
    seen = anchors if mask_earlier else anchors + i
    past_allow = torch.arange(length, device=dev)[None, :] <= seen[:, None]            # [B, L]
    own = torch.eye(B, dtype=torch.bool, device=dev)
    states = maps(i, hidden[layer][anchors])                                            # [B, H]
    h = run_layers(model, states[None], cache, layer, d, (anchors + 1 + i)[None], own, past_allow)
    crop_to(cache, length)
    return model.lm_head(final_norm(model, h[0]))


def _kl(student_logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean over anchors of ``KL(teacher || student)``, summed over the ``[..., V]`` vocabulary
    (``teacher``: log-probabilities)."""
    student = student_logits.float().log_softmax(-1)
    return nn.functional.kl_div(student, teacher, log_target=True, reduction="none").sum(-1).mean()


def sequence_loss(model, maps: FirpMaps, ids: torch.Tensor, anchors: torch.Tensor, mask_earlier: bool = False):
    """Eq. 4 over the K steps at once (``--mode joint``), at the anchors of one greedy sequence
    ``[L]`` (anchors ``q <= L - 1 - K``): the mean over anchors and steps (the sum over steps
    divided by K, which only rescales the learning rate)."""
    cache, hidden, teacher = teacher_forward(model, ids, hidden_states=True)
    rows = anchors[:, None] + 1 + torch.arange(maps.steps, device=ids.device)[None]
    return _kl(anchor_logits(model, maps, cache, hidden, anchors, ids.numel(), mask_earlier), teacher[rows])


def step_loss(model, maps: FirpMaps, i: int, ids: torch.Tensor, anchors: torch.Tensor, mask_earlier: bool = False):
    """Eq. 4 for step ``i`` alone (``--mode separate``) at the anchors of one greedy sequence ``[L]``
    (anchors ``q <= L - 2 - i``)."""
    cache, hidden, teacher = teacher_forward(model, ids, hidden_states=True)
    return _kl(step_logits(model, maps, i, cache, hidden, anchors, ids.numel(), mask_earlier), teacher[anchors + 1 + i])


@torch.inference_mode()
def split_accuracy(model, seqs: list[torch.Tensor], starts: list[int], steps: int, predictors: dict,
                   topk: int = 10) -> tuple[dict[str, list[list[float]]], int]:
    """Top-k accuracy of draft-token predictors on the paper's protocol (section 4.2.1): split a
    greedy answer at ``q`` and guess the model's own next greedy tokens. Every split point of
    every held-out answer counts (``start - 1 <= q <= L - 1 - steps``; the paper samples 50 per
    sequence); step ``i`` (0-based) must guess the token at distance ``i + 2`` from ``q``, the
    argmax of the model's distribution at ``q + 1 + i`` (distance 1 is the model's own token).

    Args:
        seqs: ``[L]`` token ids each (prompt then greedy answer); ``starts``: where answers start.
        predictors: name -> ``(cache, hidden, anchors [B], L) -> [B, >= steps, V]`` logits, given
            one frozen forward over the sequence (:func:`common.training.seqtrain.teacher_forward`: the
            cache of its ``L`` positions, which a predictor must leave at ``L``, and the ``d + 1``
            hidden states ``[L, H]``); steps beyond ``steps`` are ignored.
    Returns:
        ``(acc, n)``: name -> ``acc[i][r]``, how often step ``i``'s rank-``r`` guess is right;
        ``n`` split points.
    """
    hits, total = {name: torch.zeros(steps, topk) for name in predictors}, 0
    for ids, start in zip(seqs, starts):
        L = ids.numel()
        anchors = torch.arange(max(start - 1, 0), L - steps, device=ids.device)
        if anchors.numel() == 0:
            continue
        cache, hidden, teacher = teacher_forward(model, ids, hidden_states=True)
        rows = (anchors[:, None] + 1 + torch.arange(steps, device=ids.device)[None]).cpu()
        want = teacher.argmax(-1).cpu()[rows][..., None]                               # [B, steps, 1]
        for name, predict in predictors.items():
            ranks = predict(cache, hidden, anchors, L)[:, :steps].topk(topk, dim=-1).indices.cpu()
            hits[name] += (ranks == want).float().sum(0)
        total += anchors.numel()
    return {name: (h / max(total, 1)).tolist() for name, h in hits.items()}, total


def step_accuracy(model, maps: FirpMaps, seqs: list[torch.Tensor], starts: list[int], topk: int = 10,
                  mask_earlier: bool = False, steps: int | None = None) -> list[list[float]]:
    """``acc[i][r]`` of the maps' step ``i`` as decoding runs it (:func:`split_accuracy`), for the
    first ``steps`` steps (None: all K)."""
    steps = maps.steps if steps is None else steps

    def predict(cache, hidden, anchors, L):
        return anchor_logits(model, maps, cache, hidden, anchors, L, mask_earlier, steps=steps)
    return split_accuracy(model, seqs, starts, steps, {"firp": predict}, topk)[0]["firp"]


def check_options(anchors: int, eval_seqs: int, mode: str = "separate") -> None:
    """The trainer's own settings (the entry point checks them before loading anything)."""
    check_range("--anchors", anchors, 1)
    check_range("--eval-seqs", eval_seqs, 1)
    if mode not in MODES:
        raise UserError(f"--mode {mode!r} is invalid; valid: {', '.join(MODES)}")


def check_steps(layers: list[int] | None, steps_k: int | None, mask_earlier: bool = False) -> int:
    """The number of prediction steps ``K`` that ``--layers`` and ``--steps-k`` give (3 when
    neither does); a masked training needs a second step to mask (Figure 7)."""
    if steps_k is not None:
        check_range("--steps-k", steps_k, 1)
    if layers and steps_k is not None and len(layers) != steps_k:
        raise UserError(f"--layers {','.join(map(str, layers))} names {len(layers)} layer(s) but --steps-k is "
                        f"{steps_k}; valid: one layer per step")
    k = len(layers) if layers else steps_k or 3
    if mask_earlier and k < 2:
        raise UserError("--mask-earlier hides step 1's pseudo states from the later steps; valid with K >= 2 steps")
    return k


def parse_layers(text: str | None) -> list[int] | None:
    """``--layers "14,19,23"`` -> ``[14, 19, 23]`` (None: the default layers)."""
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--layers {text!r} is not a comma-separated list of integers, e.g. 14,19,23") from None


def make_loss(model, seqs: list[tuple[torch.Tensor, int]], anchors: int, mask_earlier: bool):
    """``(maps, batch of sequence indices) -> loss``: Eq. 4 over ``anchors`` random anchors of each
    (``--mode joint``)."""
    return cuts_loss(seqs, anchors, lambda maps: maps.steps + 1,
                     lambda maps, ids, q: sequence_loss(model, maps, ids, q, mask_earlier))


def make_step_loss(model, maps: FirpMaps, i: int, seqs: list[tuple[torch.Tensor, int]], anchors: int,
                   mask_earlier: bool):
    """``(map i, batch of sequence indices) -> loss``: step ``i``'s Eq. 4 over ``anchors`` random
    anchors of each (``--mode separate``); anchors leave the ``i + 2`` positions step ``i`` reads."""
    return cuts_loss(seqs, anchors, lambda _: i + 2,
                     lambda _, ids, q: step_loss(model, maps, i, ids, q, mask_earlier))


def _train_joint(model, maps, data, ckpt, cfg, stop, meta, anchors, mask_earlier, evaluate, curve_path):
    """One training of every map on the K steps' loss; its checkpoint is ``ckpt`` itself."""
    from common.training.loop import train

    train(maps, list(range(len(data["train"]))), make_loss(model, data["train"], anchors, mask_earlier), cfg, ckpt,
          meta=meta, desc="firp maps", evaluate=evaluate, stop=stop, curve_path=curve_path)


def _train_separate(model, maps, data, ckpt, cfg, stop, meta, anchors, mask_earlier, evaluate, curve_path):
    """K trainings, map ``i`` alone in the ``i``-th (its own optimiser, schedule, early stopping and
    checkpoint ``separate/map<i+1>.pt``), then ``ckpt``: the K maps as one finished checkpoint."""
    from common.training.loop import read_trained, train

    identity_mode = {"mode": "separate"}  # a joint run's checkpoint of the same meta is not this one
    if ckpt.is_file():
        old = read_trained(ckpt, hint="train it again (python -m firp.train)")
        if old["identity"].get("mode") != "separate" or old["identity"]["meta"] != meta:
            raise UserError(f"{ckpt} holds maps of another training ({old['identity'].get('mode', 'joint')} mode, "
                            f"{old['identity']['meta'].get('layers')}); delete it or train with --mode joint")
    folder = ckpt.parent / "separate"
    states, curve = [], []
    for i in range(maps.steps):
        part = folder / f"map{i + 1}.pt"

        def evaluate_i(_, i=i):
            acc = evaluate(maps, steps=i + 1)[i]  # as decoding runs it, after the trained maps < i
            return {"heldout_top1": acc[0], "heldout_top5": sum(acc)}
        train(maps.maps[i], list(range(len(data["train"]))),
              make_step_loss(model, maps, i, data["train"], anchors, mask_earlier), cfg, part,
              meta={**meta, "map": i + 1}, desc=f"firp map {i + 1}/{maps.steps}", evaluate=evaluate_i, stop=stop,
              curve_path=folder / f"map{i + 1}_curve.jsonl")
        states.append(read_trained(part))
        curve += [{"map": i + 1, **row} for row in states[-1]["curve"]]
    first = states[0]["identity"]
    state = {"identity": {**first, "meta": meta, **identity_mode}, "module": maps.state_dict(),
             "step": sum(s["step"] for s in states), "log": [], "curve": curve,
             "wall_s": sum(s["wall_s"] for s in states), "done": True,
             "stopped": "; ".join(f"map {i + 1}: {s['stopped']}" for i, s in enumerate(states)),
             "maps": [{"steps": s["step"], "chosen_step": s.get("chosen_step", s["step"]), "stopped": s["stopped"],
                       "train_wall_s": s["wall_s"]} for s in states]}
    atomic_write(ckpt, lambda tmp: torch.save(state, tmp))
    if curve_path is not None:
        write_jsonl(curve_path, curve)


def train_maps(model, data: dict, out: Path, cfg, stop, layers: list[int], anchors: int = 16,
               mask_earlier: bool = False, eval_seqs: int = 16, curve_path: Path | None = None,
               mode: str = "separate") -> dict:
    """Train FIRP's maps for ``layers`` in ``mode`` (:data:`MODES`, the module docstring);
    returns the stats (also ``out/stats.json``)."""
    from common.training.loop import finish_with_accuracy

    from .decoding import maps_meta, new_maps

    check_options(anchors, eval_seqs, mode)
    maps = new_maps(model, layers)
    held = data["heldout"]
    curve_seqs, curve_starts = [s for s, _ in held[:eval_seqs]], [t for _, t in held[:eval_seqs]]

    def accuracy(m, steps=None):
        return step_accuracy(model, m, curve_seqs, curve_starts, topk=5, mask_earlier=mask_earlier, steps=steps)

    def evaluate(m):
        acc = accuracy(m)
        return {"heldout_top1": [a[0] for a in acc], "heldout_top5": [sum(a) for a in acc]}

    out = Path(out)
    ckpt = out / "maps.pt"
    meta = {**maps_meta(model, layers), "mask_earlier": mask_earlier}
    t0 = time.perf_counter()
    if mode == "joint":
        _train_joint(model, maps, data, ckpt, cfg, stop, meta, anchors, mask_earlier, evaluate, out / "curve.jsonl")
    else:
        _train_separate(model, maps, data, ckpt, cfg, stop, meta, anchors, mask_earlier, accuracy, out / "curve.jsonl")
    acc = step_accuracy(model, maps, [s for s, _ in held], [t for _, t in held], topk=10, mask_earlier=mask_earlier)
    return finish_with_accuracy(ckpt, maps, model, acc, out, curve_path, t0, layers=list(layers), steps_k=maps.steps,
                                mask_earlier=mask_earlier, mode=mode, anchors=anchors,
                                train_sequences=len(data["train"]), heldout_sequences=len(held),
                                model_layers=num_layers(model))


def _main(argv=None) -> None:
    from common.training import seqtrain
    from common.training.cli import component_main

    from .decoding import default_layers, new_maps

    def add_args(ap):
        ap.add_argument("--layers", default=None,
                        help="comma-separated prediction layers, one per step (default: the paper's depth fractions)")
        ap.add_argument("--steps-k", type=int, default=None,
                        help="prediction steps K (default: one per --layers entry, else 3 at the default layers)")
        ap.add_argument("--anchors", type=int, default=16, help="random anchors trained per sequence and step")
        ap.add_argument("--mask-earlier", action="store_true", help="step i does not see steps < i (Figure 7)")
        ap.add_argument("--eval-seqs", type=int, default=16, help="held-out sequences per curve point")
        ap.add_argument("--mode", default="separate",
                        help="separate: one training per map, K in all (the paper, section 3.3); "
                             "joint: one training of all maps on the K steps' loss (the committed maps)")

    def check_args(a):
        check_options(a.anchors, a.eval_seqs, a.mode)
        a.layers = parse_layers(a.layers)
        a.steps_k = check_steps(a.layers, a.steps_k, a.mask_earlier)

    def check_model(a, model):
        a.layers = a.layers or default_layers(model, a.steps_k)
        new_maps(model, a.layers)  # refuses layers the model does not have, before the corpus is built

    def run(a, model, tok, data, cfg, stop):
        stats = train_maps(model, data, a.out, cfg, stop, a.layers, a.anchors, a.mask_earlier, a.eval_seqs, a.curve_out,
                           a.mode)
        print("held-out top-1 per step:", [round(x, 3) for x in stats["heldout_top1"]])
        return stats

    component_main("train FIRP's maps on the model's own greedy answers", add_args, run,
                   (seqtrain.add_args, seqtrain.from_args, seqtrain.check_args), argv, lr=1e-3, batch_size=1, eval_every=50,
                   check_args=check_args, check_model=check_model)


if __name__ == "__main__":
    cli_main(_main)
