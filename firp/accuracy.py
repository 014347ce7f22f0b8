"""Figure 3: top-k accuracy of the draft tokens of FIRP, early exit and Medusa, on the same split points.

The paper splits 100 generated answers at 50 random points each, gives each method the text
before the point and compares its ``K`` draft tokens with what the model then says greedily.
Here every split point of the held-out greedy answers counts (:func:`firp.train.split_accuracy`;
averaging over all points is what the paper's five random seeds approximate), and the three
methods are scored in one pass, so they answer for exactly the same points and labels:

* ``firp``: the trained maps (:mod:`firp.train`), pseudo states through the layers above ``t_i``;
* ``early_exit``: heads on the anchor's state entering ``t_i`` (:mod:`firp.exit_heads`);
* ``medusa``: the Medusa heads on the last layer's state (:mod:`common.components.medusa_heads`; its first ``K``),
  sharing the model's LM head; ``medusa_own``: heads with an LM head each (the paper's Medusa-1,
  like for like), when a second ``--medusa`` folder holds them.

Raw JSONL, one record per (method, step): ``acc`` (rank-``r`` hit rates, ``r < 10``), the layer
the step reads, the split points ``n``, the component's parameters and how it was trained::

    python -m firp.accuracy --model smollm2-135m-instruct --maps .cache/components/embedded/firp_maps/main \\
        --early-exit .cache/components/embedded/firp_early_exit --medusa .cache/components/embedded/medusa \\
        --corpus-dir results/corpus/embedded --out results/firp/raw/topk.jsonl
"""
from __future__ import annotations

from pathlib import Path

import torch

from common.checks import differences
from common.errors import UserError, cli_main
from common.paths import load_json
from common.engine.forward import final_norm, num_layers

from .train import anchor_logits, split_accuracy

TOPK = 10


def firp_predictor(model, maps, mask_earlier: bool = False):
    """``(cache, hidden, anchors [B], L) -> [B, K, V]``: the maps' pseudo-state logits."""
    def predict(cache, hidden, anchors, L):
        return anchor_logits(model, maps, cache, hidden, anchors, L, mask_earlier)
    return predict


def head_predictor(model, heads, layers: list[int] | None = None):
    """``(cache, hidden, anchors [B], L) -> [B, K, V]`` of :class:`common.components.medusa_heads.MedusaHeads`.

    ``layers`` None: every head reads the last layer's normed state (Medusa; ``hidden[d]`` is
    already normed); else head ``k`` reads the final norm of ``hidden[layers[k]]``, the state
    entering that layer (early exit), as :func:`common.components.medusa_heads.layer_inputs` trains it.
    """
    def predict(cache, hidden, anchors, L):
        if layers is None:
            return heads(hidden[-1][anchors]).transpose(0, 1)                     # [K, B, V] -> [B, K, V]
        return torch.stack([heads.head_logits(k, final_norm(model, hidden[layer][anchors]))
                            for k, layer in enumerate(layers)], dim=1)
    return predict


def load_heads(model, folder: Path):
    """``(heads, input_layers or None, meta)`` of a head checkpoint (Medusa or early exit)."""
    from common.components.medusa_heads import heads_meta, new_heads
    from common.training.loop import load_trained, read_trained

    state = read_trained(Path(folder) / "heads.pt", hint="train it first (python -m common.components.medusa_heads / firp.exit_heads)")
    meta = state["identity"]["meta"]
    want = heads_meta(model, int(meta.get("n_heads", 0)), bool(meta.get("share_lm_head", False)))
    if diff := differences({k: meta.get(k) for k in want}, want):
        raise UserError(f"heads at {folder} were trained for another model ({diff}); train them for this one")
    heads = new_heads(model, want["n_heads"], want["share_lm_head"])
    load_trained(heads, state)
    return heads, meta.get("input_layers"), meta


def _trained(folder: Path) -> dict:
    """How a component was trained, from the ``stats.json`` its trainer left beside it."""
    f = Path(folder) / "stats.json"
    s = load_json(f, "training stats", "train the component again (its trainer rewrites it)") if f.is_file() else {}
    return {k: s.get(k) for k in ("steps", "stopped", "train_wall_s", "params", "labels", "train_sequences")}


def _main(argv=None) -> None:
    from common.hardware import code_version, describe
    from common.records import JsonlWriter

    from .analysis import maps_cli

    def add_args(ap):
        ap.add_argument("--early-exit", type=Path, required=True, help="folder with heads.pt (python -m firp.exit_heads)")
        ap.add_argument("--medusa", type=Path, required=True, action="append",
                        help="folder with heads.pt (python -m common.components.medusa_heads); twice: heads sharing the LM head "
                             "and heads with their own (the paper's Medusa-1)")

    a, model, maps, meta, corpus = maps_cli(
        "FIRP Figure 3: draft-token top-k accuracy of FIRP, early exit and Medusa", argv, add_args)
    K = maps.steps
    early, early_layers, early_meta = load_heads(model, a.early_exit)
    if early_layers is None:
        raise UserError(f"{a.early_exit} must hold early-exit heads (python -m firp.exit_heads)")
    medusas = {}  # method -> (heads, folder, meta): "medusa" shares the LM head, "medusa_own" does not
    for folder in a.medusa:
        heads, layers, m = load_heads(model, folder)
        name = "medusa" if m["share_lm_head"] else "medusa_own"
        if layers is not None or name in medusas:
            raise UserError(f"{folder} must hold Medusa heads (python -m common.components.medusa_heads), at most one folder "
                            "sharing the LM head and one with their own; valid: --medusa SHARED [--medusa OWN]")
        medusas[name] = (heads, folder, m)
    for name, m in (("early-exit", early_meta), *((n, v[2]) for n, v in medusas.items())):
        if m["n_heads"] < K:
            raise UserError(f"the {name} heads have {m['n_heads']} heads, fewer than the maps' {K} steps")
    answers = corpus()  # after the checks above: it may have to be generated
    seqs = [torch.tensor(c["ids"], device=model.device) for c in answers]
    starts = [int(c["start"]) for c in answers]
    methods = {
        "firp": (firp_predictor(model, maps, bool(meta.get("mask_earlier", False))), list(meta["layers"]), a.maps,
                 {"params": sum(p.numel() for p in maps.parameters())}),
        "early_exit": (head_predictor(model, early, early_layers), list(early_layers), a.early_exit,
                       {"share_lm_head": early_meta["share_lm_head"]}),
        **{name: (head_predictor(model, heads), [num_layers(model)] * K, folder, {"share_lm_head": m["share_lm_head"]})
           for name, (heads, folder, m) in medusas.items()},
    }
    acc, n = split_accuracy(model, seqs, starts, K, {k: v[0] for k, v in methods.items()}, TOPK)
    if not n:
        raise UserError("no held-out answer is long enough for the prediction steps")
    prov = {"model": a.model, "hardware": describe(a.device), "code_version": code_version(),
            "heldout_sequences": len(seqs), "n": n}
    with JsonlWriter(a.out) as w:
        for name, (_, layers, folder, extra) in methods.items():
            trained = {**_trained(folder), **extra}
            for i in range(K):
                w.write({"method": name, "step": i + 1, "distance": i + 2, "layer": layers[i], "acc": acc[name][i],
                         "top1": acc[name][i][0], "component": str(folder), **trained, **prov})
    print(f"wrote {a.out}:", {k: [round(r[0], 3) for r in v] for k, v in acc.items()})


if __name__ == "__main__":
    cli_main(_main)
