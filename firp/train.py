"""Training FIRP's maps (section 3.2, Eq. 4): only ``W_i, b_i`` learn, the model is frozen.

Data: the model's own greedy answers (:mod:`common.training.corpus`), so the teacher for
an anchor ``q`` is the model's own distribution along its greedy continuation. One frozen
forward over a sequence gives the cache, the real state of every position at every layer,
and the teacher's distributions; then, for every anchor of the sequence at once, step ``i``
(0-based) maps the anchors' real states at layer ``t_i`` to pseudo states at positions
``q + 1 + i`` and runs them through layers ``t_i .. d-1``, each seeing its anchor's prefix and
(unless ``mask_earlier``) its own earlier pseudo states, exactly as decoding runs them; the
loss is ``sum_i KL(teacher at q + 1 + i || pseudo state i)``, averaged over anchors. Gradients
reach ``W_i`` only through the frozen upper layers (and, through attention, from later steps).

Decisions the paper leaves open (documented here, used by the entry point): KL(teacher ||
student) as Medusa and prompt decoding use it; steps >= 2 see the earlier pseudo states during
training as they do in decoding; identity initialisation (:class:`firp.maps.FirpMaps`); AdamW
at lr 1e-3, 2% warmup then linear decay, no weight decay, gradient norm clipped at 1 (Medusa's
recipe); a step is ``--batch-size`` sequences with ``--anchors`` random anchors each, prompts
cut to 96 tokens and answers of 128 (the embedded corpus), early stopping on the held-out
step-1 top-1 instead of the paper's 2 fixed epochs (the layer sweeps of Figures 5-7 train a
fixed 2 epochs instead: config ``firp.variants``).

Figure 7's masked setting (``--mask-earlier``, "the second pseudo hidden state can not see the
first"): every step's pseudo state sees the real context up to its anchor and itself, none of
the earlier steps' pseudo states, in training, in the held-out accuracy and (read from the
checkpoint's meta) in decoding. The paper does not say whether its masked maps were also
trained masked; here they are, so the comparison is of two trained settings.

Entry point::

    python -m firp.train --model smollm2-135m-instruct --out DIR \
        --corpus .cache/.../seq_corpus.pt --heldout-corpus .cache/.../corpus.pt

writes ``DIR/maps.pt`` (a :mod:`common.training.loop` checkpoint that also holds ``acc``, the
held-out top-k accuracy per step the tree search reads), ``DIR/curve.jsonl``, ``DIR/stats.json``.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from common.engine.cache import crop_to
from common.errors import UserError, check_range, cli_main
from common.engine.forward import final_norm, num_layers, run_layers
from common.training.seqtrain import cuts_loss, teacher_forward

from .maps import FirpMaps


def anchor_logits(model, maps: FirpMaps, cache, hidden: list[torch.Tensor], anchors: torch.Tensor, length: int,
                  mask_earlier: bool = False, trace: list | None = None) -> torch.Tensor:
    """``[B, K, V]`` logits of every anchor's pseudo states (with gradients into ``maps``).

    ``cache`` holds the sequence's ``length`` positions and is restored to them on return.
    ``trace``: a list that receives, per step, the ``[B, H]`` pseudo states after each layer
    ``t_i .. d-1`` (the layers then run one at a time; same values).
    """
    d, B, dev = num_layers(model), anchors.numel(), anchors.device
    prefix = torch.arange(length, device=dev)[None, :] <= anchors[:, None]            # [B, L]
    own = torch.eye(B, dtype=torch.bool, device=dev)
    out = []
    for i, layer in enumerate(maps.layers):
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


def sequence_loss(model, maps: FirpMaps, ids: torch.Tensor, anchors: torch.Tensor, mask_earlier: bool = False):
    """Eq. 4 over the anchors of one greedy sequence ``[L]`` (anchors ``q <= L - 1 - K``)."""
    cache, hidden, teacher = teacher_forward(model, ids, hidden_states=True)
    student = anchor_logits(model, maps, cache, hidden, anchors, ids.numel(), mask_earlier).float().log_softmax(-1)
    rows = anchors[:, None] + 1 + torch.arange(maps.steps, device=ids.device)[None]
    return nn.functional.kl_div(student, teacher[rows], log_target=True, reduction="none").sum(-1).mean()


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
                  mask_earlier: bool = False) -> list[list[float]]:
    """``acc[i][r]`` of the maps' step ``i`` (:func:`split_accuracy`)."""
    def predict(cache, hidden, anchors, L):
        return anchor_logits(model, maps, cache, hidden, anchors, L, mask_earlier)
    return split_accuracy(model, seqs, starts, maps.steps, {"firp": predict}, topk)[0]["firp"]


def check_options(anchors: int, eval_seqs: int) -> None:
    """The trainer's own settings (the entry point checks them before loading anything)."""
    check_range("--anchors", anchors, 1)
    check_range("--eval-seqs", eval_seqs, 1)


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
    """``(maps, batch of sequence indices) -> loss``: Eq. 4 over ``anchors`` random anchors of each."""
    return cuts_loss(seqs, anchors, lambda maps: maps.steps + 1,
                     lambda maps, ids, q: sequence_loss(model, maps, ids, q, mask_earlier))


def train_maps(model, data: dict, out: Path, cfg, stop, layers: list[int], anchors: int = 16,
               mask_earlier: bool = False, eval_seqs: int = 16, curve_path: Path | None = None) -> dict:
    """Train FIRP's maps for ``layers``; returns the stats (also ``out/stats.json``)."""
    from common.training.loop import finish_with_accuracy, train

    from .decoding import maps_meta, new_maps

    check_options(anchors, eval_seqs)
    maps = new_maps(model, layers)
    held = data["heldout"]
    curve_seqs, curve_starts = [s for s, _ in held[:eval_seqs]], [t for _, t in held[:eval_seqs]]

    def evaluate(m):
        acc = step_accuracy(model, m, curve_seqs, curve_starts, topk=5, mask_earlier=mask_earlier)
        return {"heldout_top1": [a[0] for a in acc], "heldout_top5": [sum(a) for a in acc]}

    out = Path(out)
    ckpt = out / "maps.pt"
    meta = {**maps_meta(model, layers), "mask_earlier": mask_earlier}
    t0 = time.perf_counter()
    train(maps, list(range(len(data["train"]))), make_loss(model, data["train"], anchors, mask_earlier), cfg, ckpt,
          meta=meta, desc="firp maps", evaluate=evaluate, stop=stop, curve_path=out / "curve.jsonl")
    acc = step_accuracy(model, maps, [s for s, _ in held], [t for _, t in held], topk=10, mask_earlier=mask_earlier)
    return finish_with_accuracy(ckpt, maps, model, acc, out, curve_path, t0, layers=list(layers), steps_k=maps.steps,
                                mask_earlier=mask_earlier, anchors=anchors, train_sequences=len(data["train"]),
                                heldout_sequences=len(held), model_layers=num_layers(model))


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

    def check_args(a):
        check_options(a.anchors, a.eval_seqs)
        a.layers = parse_layers(a.layers)
        a.steps_k = check_steps(a.layers, a.steps_k, a.mask_earlier)

    def check_model(a, model):
        a.layers = a.layers or default_layers(model, a.steps_k)
        new_maps(model, a.layers)  # refuses layers the model does not have, before the corpus is built

    def run(a, model, tok, data, cfg, stop):
        stats = train_maps(model, data, a.out, cfg, stop, a.layers, a.anchors, a.mask_earlier, a.eval_seqs, a.curve_out)
        print("held-out top-1 per step:", [round(x, 3) for x in stats["heldout_top1"]])
        return stats

    component_main("train FIRP's maps on the model's own greedy answers", add_args, run,
                   (seqtrain.add_args, seqtrain.from_args), argv, lr=1e-3, batch_size=1, eval_every=50,
                   check_args=check_args, check_model=check_model)


if __name__ == "__main__":
    cli_main(_main)
