"""The skipped-layer set of self-speculative decoding (Draft & Verify, Zhang et al. 2024,
section 3.2), searched on a few calibration prompts: the set that maximises the tokens a
greedy step commits per unit of forward cost.

Objective (exact for greedy chains, no decoding needed): on the model's own greedy
continuation of each calibration prompt, one forward of the layer-skipping draft over the whole
sequence gives the draft's token at every position along the accepted path (while the draft
agrees, its inputs are the greedy tokens). A step at position ``p`` then accepts the ``a <=
gamma`` consecutive agreeing tokens and the full model adds one: ``a + 1`` tokens for a cost of
``1 + gamma * kept / d`` full forwards (one verification, ``gamma`` draft forwards through the
kept layers). The objective is total tokens over total cost (vanilla decoding: 1.0).

Search (seeded): the every-other-layer default first, then ``random`` random sets (each layer
skipped with a probability drawn per trial), then single-layer flips of the best set so far
(hill climbing) until ``trials``. The first and last layers are always kept, as in the default.
Where this differs from the paper: the paper searches attention and MLP sublayers separately
with Bayesian optimisation and measures speed; here whole layers, a random-then-local search,
and an analytic cost (no timing noise; what a CPU run pays per forward differs: see cost.fig).

Entry point::

    python -m common.components.skip_search --model smollm2-135m-instruct --out skip.json \\
        [--dataset sharegpt --prompts 8 --max-new-tokens 64 --gamma 4 --trials 200 --seed 0]

writes a JSON ``{"skip", "kept", "objective", "tokens_per_step", "model", "layers", "settings",
"history"}``; ``self_speculative`` takes it as ``skip=<file>``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from ..engine.forward import embed, logits_from_hidden, num_layers, run_layers
from ..errors import UserError, check_range, cli_main


def kept_segments(layers: list[int]) -> list[tuple[int, int]]:
    """Sorted layer indices -> contiguous ``[start, end)`` runs, e.g. [0, 2, 3] -> [(0, 1), (2, 4)]."""
    runs: list[tuple[int, int]] = []
    for i in layers:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def check_skip(skip, d: int, what: str = "skip") -> list[int]:
    """``skip`` as sorted distinct layer indices of a ``d``-layer model, at least one layer kept."""
    if not isinstance(skip, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                      and 0 <= i < d for i in skip):
        raise UserError(f"{what}={skip!r} is invalid; valid: a list of layer indices in 0..{d - 1} "
                        f"(model has {d} layers), or a file written by python -m common.components.skip_search")
    out = sorted(set(skip))
    if len(out) == d:
        raise UserError(f"{what} skips all {d} layers; valid: keep at least one")
    return out


def read_skip_file(path: str | Path, d: int) -> list[int]:
    """The skipped layers of a search result (``--out`` of this module) for a ``d``-layer model."""
    path = Path(path)
    hint = "rerun python -m common.components.skip_search for this model"
    if not path.is_file():
        raise UserError(f"skip file {path} does not exist; {hint}")
    try:
        found = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"skip file {path} is not JSON; delete it and {hint}") from None
    if not isinstance(found, dict) or "skip" not in found:
        raise UserError(f"skip file {path} has no 'skip' list; delete it and {hint}")
    if found.get("layers") != d:
        raise UserError(f"skip file {path} was searched on a {found.get('layers')}-layer model, this one has {d}; "
                        f"{hint}")
    return check_skip(found["skip"], d, f"skip (from {path})")


@torch.inference_mode()
def draft_agreement(model, seq: torch.Tensor, start: int, skip: list[int]) -> torch.Tensor:
    """``[n]`` bool: does the draft (``model`` without ``skip``) predict the greedy token at each
    answer position ``start + 1 .. L-1`` of ``seq`` (``[L]``: prompt then the model's greedy
    answer)? The answer's first token is the prefill's, never drafted."""
    d = num_layers(model)
    kept = [i for i in range(d) if i not in set(skip)]
    ids = seq[None]
    pos = torch.arange(ids.shape[1], device=ids.device)[None]
    h = embed(model, ids)
    for s, e in kept_segments(kept):
        h = run_layers(model, h, None, s, e, pos)
    guess = logits_from_hidden(model, h)[0].argmax(-1)                                   # [L]
    return guess[start:-1] == seq[start + 1:]


def simulate(agree: torch.Tensor, gamma: int) -> tuple[int, int]:
    """``(tokens, steps)`` of greedy chain drafting over one answer's ``[n]`` agreement flags
    (:func:`draft_agreement`; the prefill's token and step not counted)."""
    flags, p, tokens, steps = agree.tolist(), 0, 0, 0
    while p < len(flags):
        a = 0
        while a < gamma and p + a < len(flags) and flags[p + a]:
            a += 1
        take = min(a + 1, len(flags) - p)
        tokens, steps, p = tokens + take, steps + 1, p + take
    return tokens, steps


def score(model, seqs: list[tuple[torch.Tensor, int]], skip: list[int], gamma: int) -> dict:
    """The objective of one skipped set (module docstring) over calibration ``seqs``."""
    d = num_layers(model)
    tokens = steps = 0
    for seq, start in seqs:
        t, s = simulate(draft_agreement(model, seq, start, skip), gamma)
        tokens, steps = tokens + t, steps + s
    cost = steps * (1 + gamma * (d - len(skip)) / d)
    return {"skip": list(skip), "tokens_per_step": tokens / max(steps, 1),
            "objective": tokens / cost if cost else 0.0}


def search(model, seqs: list[tuple[torch.Tensor, int]], gamma: int = 4, trials: int = 200, random_trials: int = 50,
           seed: int = 0) -> dict:
    """The best skipped set found (module docstring) and the ``history`` of every trial."""
    check_range("gamma", gamma, 1)
    check_range("trials", trials, 1)
    check_range("random_trials", random_trials, 0)
    d = num_layers(model)
    inner = list(range(1, d - 1))
    rng = random.Random(seed)
    seen: dict[tuple[int, ...], dict] = {}
    history = []

    def trial(skip) -> dict:
        key = tuple(sorted(skip))
        if key not in seen:
            seen[key] = score(model, seqs, list(key), gamma)
        history.append({"trial": len(history), **seen[key]})
        return seen[key]

    best = trial([i for i in inner if i % 2])  # the every-other-layer default (self_spec's)
    while len(history) < trials:
        if len(history) <= random_trials:
            rate = rng.random()
            cand = [i for i in inner if rng.random() < rate]
        else:
            flip = rng.choice(inner) if inner else None
            cand = sorted(set(best["skip"]) ^ ({flip} if flip is not None else set()))
        res = trial(cand)
        if res["objective"] > best["objective"]:
            best = res
    return {**best, "kept": [i for i in range(d) if i not in set(best["skip"])], "layers": d, "history": history}


def calibration_sequences(model, tokenizer, dataset: str, prompts: int, max_new_tokens: int,
                          max_prompt_tokens: int) -> list[tuple[torch.Tensor, int]]:
    """``[(ids [prompt + greedy answer], answer start)]`` of the dataset's first ``prompts``."""
    from ..assets.data import load_dataset_samples
    from ..assets.prompts import encode_prompt

    out = []
    for sample in load_dataset_samples(dataset, prompts):
        ids = encode_prompt(tokenizer, sample.turns[0], max_prompt_tokens=max_prompt_tokens).to(model.device)
        with torch.inference_mode():
            full = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
        out.append((full[0], ids.shape[1]))
    return out


def _main(argv=None) -> None:
    import argparse

    from ..assets.models import load_model
    from ..records import write_json

    ap = argparse.ArgumentParser(description="search self-speculative decoding's skipped layers (Draft & Verify)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write (skip set and search history)")
    ap.add_argument("--dataset", default="sharegpt", help="calibration prompts (not an evaluation set)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens a step (self_speculative's default)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--random-trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "max_prompt_tokens", "gamma", "trials"):
        check_range(f"--{name.replace('_', '-')}", getattr(a, name), 1)
    check_range("--random-trials", a.random_trials, 0)
    if a.out.is_dir():
        raise UserError(f"--out {a.out} is a folder; valid: a JSON file path")
    model, tok = load_model(a.model, device=a.device)
    seqs = calibration_sequences(model, tok, a.dataset, a.prompts, a.max_new_tokens, a.max_prompt_tokens)
    res = search(model, seqs, a.gamma, a.trials, a.random_trials, a.seed)
    settings = {k: getattr(a, k) for k in ("dataset", "prompts", "max_new_tokens", "max_prompt_tokens", "gamma",
                                           "trials", "random_trials", "seed")}
    write_json(a.out, {"model": a.model, "settings": settings, **res})
    print(f"skip {res['skip']} (keeps {len(res['kept'])} of {res['layers']}): {res['tokens_per_step']:.2f} tokens "
          f"a step, objective {res['objective']:.3f} (vanilla 1.0)")


if __name__ == "__main__":
    cli_main(_main)
