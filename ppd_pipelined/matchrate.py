"""Match rate p_correct (Table 2, 5, 6-8): early top-k at layer d_bar vs the final layer's token.

The model decodes with its full depth and a KV cache, one forward per token with
``output_hidden_states=True``, which gives every layer's state of the current position at
once. For every generated token ``x_t`` (chosen from the final logits: greedy, top-k or top-p
sampling) and every probed layer ``l``, the early prediction is the classifier applied to that
same forward's ``hs[l]`` through the final norm: ``N`` = the model's own LM head, ``Y`` = the
head trained for layer ``l`` (:mod:`ppd_pipelined.heads`). ``hs[l]`` (``l < d``) is the raw
output of ``l`` layers, the state PPD's exit classifier sees at ``exit_layer = l``; ``hs[d]``
is already normed and is never probed.

Raw records (one JSONL line per prompt x method) keep, per token, the rank of the chosen
token in each early logit vector and the early top-5 ids, so any k <= 5 (``rank < k``) and any
bucketing by position is computed downstream by the notebooks. The heads run once per
sequence on all its probed states (one ``[T, H] x [H, V]`` product per layer and classifier),
not once per token; the states are the decoding forward's own.

    python -m ppd_pipelined.matchrate --model smollm2-135m-instruct --task cnn_dm \
        --prompts results/ppd_pipelined/raw/prompts_cnn_dm.jsonl --layers 8,15,23,26,28 \
        --classifiers N,Y --heads .cache/ppd_pipelined/embedded/heads.pt --method greedy \
        --max-new-tokens 128 --out results/ppd_pipelined/raw/matchrate_cnn_dm_greedy.jsonl

Position ``i`` (0-based) of a record is the ``i + 1``-th generated token; position 0 comes
from the prompt's forward, and PPD's decoder can only use positions ``>= 1`` (the first token
has no predecessor being decoded): ``matches`` of :class:`~ppd_pipelined.decoding.PipelinedDecoder`
equals ``rank[1:] < k`` here.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from common.checks import ArgumentParser, check_device, check_out_path, check_positive_int
from common.assets.data import load_jsonl
from common.errors import UserError, check_range, cli_main
from common.engine.forward import logits_from_hidden, num_layers
from common.hardware import code_version, describe, device_clock
from common.assets.prompts import TRUNCATE, fit_prompt
from common.records import JsonlWriter, check_start, read_jsonl

from .config import CLASSIFIERS, MAX_TOPK, METHODS, TASKS, check_p, check_probed_layers


def choose(logits: torch.Tensor, method: str, top_k: int = 3, top_p: float = 0.95,
           generator: torch.Generator | None = None) -> int:
    """The next token from final logits ``[V]``: argmax, top-k or top-p (nucleus) sampling at T = 1."""
    if method == "greedy":
        return int(logits.argmax())
    probs = torch.softmax(logits.float(), -1)
    if method == "top_k":
        p, idx = probs.topk(top_k)
    elif method == "top_p":
        p, idx = probs.sort(descending=True)
        keep = (p.cumsum(-1) - p) < top_p     # the smallest prefix whose mass reaches top_p
        keep[0] = True
        p, idx = p[keep], idx[keep]
    else:
        raise UserError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")
    return int(idx[torch.multinomial(p / p.sum(), 1, generator=generator)])


@torch.inference_mode()
def decode_with_probes(model, input_ids: torch.Tensor, layers, max_new_tokens: int, method: str = "greedy",
                       *, top_k: int = 3, top_p: float = 0.95, generator=None, eos=()) -> dict:
    """Decode with the full model and keep every probed layer's state of each step.

    Returns:
        ``tokens`` (chosen, length T <= max_new_tokens, EOS included), ``argmax`` (the final
        layer's top-1 at each step), ``probes`` ``[T, L, H]`` raw ``hs[l]`` of the position
        that predicts each token, and ``decode_s``.
    """
    cache = DynamicCache(config=model.config)
    ids, tokens, argmax, probes = input_ids, [], [], []
    t0 = device_clock(input_ids.device)
    for _ in range(max_new_tokens):
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, output_hidden_states=True,
                    logits_to_keep=1)
        probes.append(torch.stack([out.hidden_states[l][0, -1] for l in layers]))
        logits = out.logits[0, -1]
        tok = choose(logits, method, top_k, top_p, generator)
        tokens.append(tok)
        argmax.append(int(logits.argmax()))
        if tok in eos:
            break
        ids = torch.tensor([[tok]], device=input_ids.device)
    return {"tokens": tokens, "argmax": argmax, "probes": torch.stack(probes), "decode_s": device_clock(input_ids.device) - t0}


@torch.inference_mode()
def early_ranks(model, probes: torch.Tensor, tokens, head=None) -> tuple[list[int], list[list[int]]]:
    """Rank of each chosen token in the early logits and the early top-5, for one layer.

    Args:
        probes: ``[T, H]`` raw states of one layer; ``tokens``: the T chosen tokens.
        head: the classifier after the final norm (None: the model's LM head).
    Returns:
        ``rank[T]`` (0 = the early top-1; ``rank < k`` <=> a top-k match) and ``top5[T][5]``.
    """
    logits = logits_from_hidden(model, probes.unsqueeze(0), head)[0].float()   # [T, V]
    tgt = torch.as_tensor(tokens, device=logits.device)
    chosen = logits.gather(1, tgt[:, None])
    rank = (logits > chosen).sum(-1)
    return rank.tolist(), logits.topk(MAX_TOPK, dim=-1).indices.tolist()


def match_record(model, probes: torch.Tensor, tokens, layers, classifiers, heads=None) -> dict:
    """``{classifier: {str(layer): {"rank": [...], "top5": [[...]]}}}`` for one sequence."""
    out = {}
    for c in classifiers:
        out[c] = {}
        for i, l in enumerate(layers):
            head = heads.head(l) if c == "Y" else None
            rank, top5 = early_ranks(model, probes[:, i], tokens, head)
            out[c][str(l)] = {"rank": rank, "top5": top5}
    return out


def match_rate(ranks, k: int) -> float:
    """Fraction of tokens whose chosen token is in the early top-k."""
    ranks = list(ranks)
    return sum(r < k for r in ranks) / len(ranks) if ranks else float("nan")


# ---------------------------------------------------------------- CLI
def parse_args(argv=None):
    ap = ArgumentParser(prog="python -m ppd_pipelined.matchrate",
                        description="match rate p_correct: early top-k vs the final layer")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, type=Path, help="rendered prompts (ppd_pipelined.templates)")
    ap.add_argument("--task", required=True)
    ap.add_argument("--layers", required=True, help="comma-separated probed layers (1..d-1)")
    ap.add_argument("--classifiers", default="N", help="N (final LM head), Y (trained heads), or N,Y")
    ap.add_argument("--heads", type=Path, default=None, help="heads checkpoint (needed for Y)")
    ap.add_argument("--method", default="greedy")
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--truncate", choices=TRUNCATE, default=None,
                    help="how to cut a prompt over --max-prompt-tokens (default: such a prompt is an error); "
                         "'last' keeps the last tokens (the committed embedded records were made so)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", default="adhoc")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def _parse_layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--layers {text!r} must be comma-separated integers") from None


def _model_depth(name: str) -> int | None:
    """The model's layer count from its config alone (no weights), or None where the config
    cannot be read without loading (e.g. a hub id offline: the loader then says why)."""
    from transformers import AutoConfig

    from common.assets.models import resolve

    src = resolve(name)  # an unknown model or a folder that is no model folder: UserError here
    try:
        return getattr(AutoConfig.from_pretrained(src), "num_hidden_layers", None)
    except (OSError, ValueError):
        return None


def validate(a) -> tuple[list[int], list[str]]:
    """Check every argument that needs no model weights; UserError on the first bad one."""
    if a.task not in TASKS:
        raise UserError(f"unknown task {a.task!r}; valid: {', '.join(TASKS)}")
    if a.method not in METHODS:
        raise UserError(f"unknown method {a.method!r}; valid: {', '.join(METHODS)}")
    layers = _parse_layers(a.layers)
    check_positive_int("n", a.n)
    check_positive_int("threads", a.threads)
    check_device(a.device)
    check_out_path(a.out)
    # The depth from the config, so the message says 1..29, not 1..d-1, and before loading.
    check_probed_layers(layers, _model_depth(a.model))
    classifiers = [c for c in a.classifiers.split(",") if c]
    for c in classifiers:
        if c not in CLASSIFIERS:
            raise UserError(f"unknown classifier {c!r}; valid: {', '.join(CLASSIFIERS)}")
    if "Y" in classifiers and a.heads is None:
        raise UserError("classifier Y needs --heads (a checkpoint of ppd_pipelined.heads)")
    check_range("top_k", a.top_k, 1)
    check_p("top_p", a.top_p)
    check_range("max_new_tokens", a.max_new_tokens, 1)
    check_range("max_prompt_tokens", a.max_prompt_tokens, 1)
    return layers, classifiers


def run(a) -> list[dict]:
    layers, classifiers = validate(a)
    version = code_version()  # the code this process loaded (read now: a commit made beside the run is not it)
    check_start(a.out)
    samples = load_jsonl(a.prompts)[: a.n]  # a damaged prompt file: one error line, before the model loads
    # the same lines again, as raw dicts, for the record's dataset fields (load_jsonl keeps only a Sample's)
    src = read_jsonl(a.prompts, "fix or regenerate the prompt file")[: a.n]
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    from common.assets.models import load_model
    model, tok = load_model(a.model, dtype=a.dtype, device=a.device)
    check_probed_layers(layers, num_layers(model))
    heads = None
    if "Y" in classifiers:
        from .heads import load_heads
        heads = load_heads(model, a.heads)
        missing = [l for l in layers if l not in heads.layers]
        if missing:
            raise UserError(f"heads checkpoint {a.heads} has no head for layer(s) {missing}; trained: {heads.layers}")
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    meta = {"model": a.model, "profile": a.profile, "device": describe(a.device), "dtype": a.dtype,
            "code_version": version, "task": a.task, "method": a.method, "layers": layers, "depth": num_layers(model),
            "classifiers": classifiers, "max_new_tokens": a.max_new_tokens,
            "method_params": {"top_k": a.top_k} if a.method == "top_k" else
            {"top_p": a.top_p} if a.method == "top_p" else {}, "prompts": str(a.prompts)}
    from tqdm import tqdm
    records = []
    with JsonlWriter(a.out) as w:
        for i, (s, info) in enumerate(tqdm(list(zip(samples, src)), desc=f"p_correct {a.task}/{a.method}",
                                           unit="prompt")):
            ids, full = fit_prompt(tok, s.turns[0], max_prompt_tokens=a.max_prompt_tokens, truncate=a.truncate)
            ids = ids.to(a.device)
            if full > ids.shape[1]:
                print(f"prompt {s.question_id}: {full} tokens truncated to {ids.shape[1]} ({a.truncate})", file=sys.stderr)
            gen = torch.Generator(device=a.device).manual_seed(a.seed * 100_003 + i)
            t0 = time.perf_counter()
            d = decode_with_probes(model, ids, layers, a.max_new_tokens, a.method, top_k=a.top_k,
                                   top_p=a.top_p, generator=gen, eos=eos)
            t1 = device_clock(ids.device)
            early = match_record(model, d["probes"], d["tokens"], layers, classifiers, heads)
            rec = {"question_id": s.question_id, **meta, "dataset": info.get("dataset"),
                   "paper_dataset": info.get("paper_dataset"), "stand_in": info.get("stand_in"),
                   "template": info.get("template"), "seed": a.seed * 100_003 + i,
                   "prompt_tokens": int(ids.shape[1]), "new_tokens": len(d["tokens"]),
                   "prompt_truncated_from": full if full > ids.shape[1] else None,
                   "tokens": d["tokens"], "final_argmax": d["argmax"], "early": early,
                   "decode_s": d["decode_s"], "heads_s": device_clock(ids.device) - t1}
            w.write(rec)
            records.append(rec)
    return records


def main(argv=None) -> None:
    a = parse_args(argv)
    records = run(a)
    layers = records[0]["layers"]
    for c in records[0]["classifiers"]:
        ranks = {l: [r for rec in records for r in rec["early"][c][str(l)]["rank"]] for l in layers}
        print(c, " ".join(f"L{l}:k1={match_rate(v, 1):.3f}" for l, v in ranks.items()))


if __name__ == "__main__":
    cli_main(main)
