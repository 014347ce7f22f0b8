"""How close FIRP's pseudo states come to the real ones (Figure 4), layer by layer.

For every anchor ``q`` inside the held-out greedy answers, step ``i``'s pseudo state enters at
layer ``t_i`` and runs through the layers above it exactly as in decoding
(:func:`firp.train.anchor_logits` with a trace); after each layer ``l`` it is compared with
the real state of position ``q + 1 + i`` there (the model's own forward over its greedy text).
Also measured: the untrained start (the identity map: the anchor's own state moved forward),
so the table shows what training adds. Raw JSONL, one record per (maps, step, layer):

    python -m firp.analysis --model smollm2-135m-instruct --maps .cache/components/embedded/firp_maps/main \\
        --corpus-dir results/corpus/embedded --out results/firp/raw/cosine_main.jsonl
"""
from __future__ import annotations

from pathlib import Path

import torch

from common.errors import UserError, cli_main
from common.engine.forward import final_norm, num_layers
from common.training.seqtrain import teacher_forward

from .maps import FirpMaps
from .train import anchor_logits


@torch.inference_mode()
def cosine_by_layer(model, maps: FirpMaps, seqs: list[tuple[torch.Tensor, int]], mask_earlier: bool = False) -> list[dict]:
    """Mean cosine similarity of step ``i``'s pseudo states to the real states, per layer above
    ``t_i``: ``[{"step", "layer", "cosine", "n"}]`` (``layer`` = the layer whose output is
    compared; the last layer's after the final norm, as the forward returns it)."""
    K, d = maps.steps, num_layers(model)
    sums: dict[tuple[int, int], float] = {}
    count = 0
    for ids, start in seqs:
        L = ids.numel()
        anchors = torch.arange(max(start - 1, 0), L - K, device=ids.device)
        if anchors.numel() == 0:
            continue
        cache, hidden, _ = teacher_forward(model, ids, hidden_states=True)
        trace: list = []
        anchor_logits(model, maps, cache, hidden, anchors, L, mask_earlier, trace=trace)
        for i, per in enumerate(trace):
            for j, h in enumerate(per):
                layer = maps.layers[i] + j
                real = hidden[layer + 1][anchors + 1 + i]          # output of `layer` at q + 1 + i
                if layer == d - 1:  # the forward's last hidden state is taken after the final norm
                    h = final_norm(model, h)
                cos = torch.nn.functional.cosine_similarity(h.float(), real.float(), dim=-1)
                sums[(i, layer)] = sums.get((i, layer), 0.0) + float(cos.sum())
        count += anchors.numel()
    if not count:
        raise UserError("no held-out answer is long enough for the prediction steps")
    return [{"step": i + 1, "layer": layer, "cosine": v / count, "n": count} for (i, layer), v in sorted(sums.items())]


def maps_cli(description: str, argv, add_args=None):
    """The shared command line of FIRP's analyses (Figures 3 and 4): parse ``argv``, load the
    model and the trained maps of ``--maps``, and the held-out greedy answers: the sharded
    corpus's held-out shard (``--corpus-dir``: what every component's training measures on) or
    a greedy corpus cache (``--heldout-corpus``, built on first use).

    Returns:
        ``(args, model, maps, meta, corpus)``: ``maps`` loaded with its training's state,
        ``meta`` the checkpoint's meta (layers, mask_earlier), ``corpus()`` the held-out answers.
    """
    from common.checkpoints import check_meta
    from common.checks import ArgumentParser, check_device, check_positive_int
    from common.assets.models import load_model
    from common.training.loop import read_trained

    from .decoding import new_maps, trained_meta

    ap = ArgumentParser(description=description)
    ap.add_argument("--model", required=True)
    ap.add_argument("--maps", type=Path, required=True, help="folder with maps.pt (python -m firp.train)")
    if add_args is not None:
        add_args(ap)
    ap.add_argument("--corpus-dir", type=Path, default=None, help="the sharded corpus (python -m common.training.corpus): "
                    "its held-out shard")
    ap.add_argument("--heldout-corpus", type=Path, default=None, help="a greedy corpus cache (instead of --corpus-dir)")
    ap.add_argument("--heldout-prompts", type=int, default=32)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if (a.corpus_dir is None) == (a.heldout_corpus is None):
        raise UserError("give the held-out answers as --corpus-dir (the sharded corpus's held-out shard) or "
                        "--heldout-corpus (a greedy corpus cache), one of the two")
    # every cheap check before the model loads: the maps' file is read mapped, metadata only
    check_positive_int("--threads", a.threads)
    device = str(check_device(a.device))
    state = read_trained(a.maps / "maps.pt", hint="train it first (python -m firp.train)")
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok = load_model(a.model, device=device)
    meta = state["identity"]["meta"]
    check_meta(state, trained_meta(model, meta), f"maps at {a.maps}", f"train them for {a.model} (python -m firp.train)")
    maps = new_maps(model, meta["layers"])
    maps.load_state_dict(state["module"])
    # loaded when asked, after the caller's own checks (load_or_build may have to generate it)
    return a, model, maps, meta, lambda: heldout_answers(a, model, tok)


def heldout_answers(a, model, tokenizer) -> list[dict]:
    """The held-out greedy answers ``[{"ids": [L], "start": int}]`` of :func:`maps_cli`'s
    arguments ``a``: the held-out shard of the sharded corpus ``a.corpus_dir`` (refused unless
    written by this model), else the greedy corpus cache ``a.heldout_corpus`` (built on first use)."""
    if a.corpus_dir is not None:
        from common.training import corpus as corpus_mod
        from common.training.teacher import shard_sequences
        corpus_mod.open_corpus(a.corpus_dir, model=model)
        return shard_sequences(corpus_mod.heldout(a.corpus_dir))
    from common.training import corpus as corpus_mod
    return corpus_mod.load_or_build_set(a.heldout_corpus, model, tokenizer, n_prompts=a.heldout_prompts,
                                        max_new_tokens=a.answer_tokens)


def _main(argv=None) -> None:
    from common.hardware import code_version, describe
    from common.records import JsonlWriter

    from .decoding import new_maps

    a, model, trained, meta, corpus = maps_cli(
        "FIRP: cosine similarity of pseudo states to the real states, per layer", argv)
    seqs = [(torch.tensor(c["ids"], device=model.device), int(c["start"])) for c in corpus()]
    mask_earlier = bool(meta.get("mask_earlier", False))
    prov = {"model": a.model, "hardware": describe(a.device), "code_version": code_version(), "maps": str(a.maps),
            "layers": meta["layers"], "mask_earlier": mask_earlier}
    with JsonlWriter(a.out) as w:
        for name, maps in (("trained", trained), ("identity", new_maps(model, meta["layers"]))):
            for r in cosine_by_layer(model, maps, seqs, mask_earlier):
                w.write({"maps_state": name, **r, **prov})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    cli_main(_main)
