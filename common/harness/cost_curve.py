"""The hardware's cost curve: one verification forward of ``q`` new tokens, as decoders run it.

    python -m common.harness.cost_curve --model smollm2-135m-instruct --q 1,2,4,8,16,32,64 \
        --context 300 --out results/cross/raw/cost_curve.jsonl

For each ``q`` the forward is :meth:`common.engine.target.Target.verify` over a chain of ``q`` nodes
after a ``context``-token cache (the tree loop's path: explicit mask and positions), followed
by the cache edit that keeps nothing of it, so every repetition sees the same cache. The LM
head runs on the root's row only, as the greedy tree loop's lazy head does when nothing is
accepted (each accepted pair of levels adds one small head product, paid by the decoder, not
the curve); targets without a lazy head apply it to every node. The
``q`` values run interleaved (one of each per round, after warm-up rounds), so a slow drift
of a shared machine hits every ``q`` alike; the record per ``q`` holds the median and the
interquartile range in ms and ``ratio = T(q) / T(1)`` (``q = 1`` is always measured). This
curve is what a hardware-aware tree size (prompt decoding) and a limit column compare to.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import UserError, cli_main
from ..engine.fast import few_rows_kernels, stock_copy
from ..hardware import code_version, describe
from ..assets.models import load_model
from ..records import JsonlWriter
from ..engine.target import make_target
from ..engine.tree import build_tree, chain_paths


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def cost_curve(model, qs: list[int], context: int = 300, rounds: int = 25, warmup: int = 3,
               seed: int = 0) -> list[dict]:
    """Median ms of one verification forward per ``q`` (see the module docstring).

    Args:
        model: a model, or ``{label: model}`` to measure several forward paths interleaved
            (same prompt and tokens; each label's ratios are to its own ``T(1)``).
        qs: new-token counts (``1`` is added when missing: ratios are to ``T(1)``).
        context: cached tokens before the verified ones.
    Returns:
        one dict per label and ``q`` (sorted): ``q, ms, ms_q1, ms_q3, ratio, rounds, context``
        (and ``forward_path``: the label, when a mapping was given).
    """
    models = model if isinstance(model, dict) else {None: model}
    qs = sorted({1, *qs})
    g = torch.Generator(device="cpu").manual_seed(seed)
    first = next(iter(models.values()))
    vocab, dev = first.config.vocab_size, first.device
    prompt = torch.randint(3, vocab, (1, context), generator=g).to(dev)
    targets = {label: make_target(m) for label, m in models.items()}
    for target in targets.values():
        target.start(prompt)
    trees = {q: build_tree(chain_paths(q - 1)).to(dev) for q in qs}
    tokens = {q: torch.randint(3, vocab, (q,), generator=g).to(dev) for q in qs}
    times = {(label, q): [] for label in models for q in qs}
    for r in tqdm(range(warmup + rounds), desc="cost curve", unit="round"):
        for label, target in targets.items():
            for q in qs:
                _sync(dev)
                t0 = time.perf_counter()
                if target.lazy_head:  # as the greedy tree loop runs it: the LM head where the walk reads
                    _, v = target.verify(tokens[q], trees[q], head=False)
                    int(target.head_rows(v, [0]).argmax())
                else:
                    logits, _ = target.verify(tokens[q], trees[q])
                    int(logits[-1].argmax())  # what a decoder reads: forces the result
                _sync(dev)
                dt = time.perf_counter() - t0
                target.crop(context)
                if r >= warmup:
                    times[label, q].append(dt * 1e3)
    out = []
    for label in models:
        base = statistics.median(times[label, 1])
        for q in qs:
            qu = statistics.quantiles(times[label, q], n=4)
            med = statistics.median(times[label, q])
            row = {"q": q, "ms": med, "ms_q1": qu[0], "ms_q3": qu[2], "ratio": med / base,
                   "rounds": rounds, "context": context}
            out.append(row if label is None else {**row, "forward_path": label})
    return out


def _positive_ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        raise UserError(f"--q {text!r} is invalid; valid: comma-separated integers >= 1, e.g. 1,2,4,8")
    return vals


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="measure the verification forward's cost T(q) for q new tokens")
    ap.add_argument("--model", required=True)
    ap.add_argument("--q", default="1,2,4,8,16,32,64", help="comma-separated new-token counts")
    ap.add_argument("--context", type=int, default=300, help="cached tokens before the verified ones")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--paths", default="fast",
                    help="forward paths to measure, interleaved: fast (common.engine.fast, what decoders run), "
                         "stock (transformers' own modules, attention and cache), or fast,stock")
    ap.add_argument("--profile", default="adhoc", help="recorded in every record")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    qs = _positive_ints(a.q)
    if a.context < 1 or a.rounds < 4:
        raise UserError(f"--context={a.context} --rounds={a.rounds} are out of range; valid: context >= 1, rounds >= 4")
    if a.out.is_dir():
        raise UserError(f"--out {a.out} is a folder; valid: a JSONL file path")
    if a.threads is not None:
        if a.threads < 1:
            raise UserError(f"--threads={a.threads} is out of range; valid: >= 1")
        torch.set_num_threads(a.threads)
    paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    if not paths or set(paths) - {"fast", "stock"} or len(set(paths)) != len(paths):
        raise UserError(f"--paths {a.paths!r} is invalid; valid: fast, stock or fast,stock")
    model, _ = load_model(a.model, dtype=a.dtype, device=a.device, fast="fast" in paths)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and a.context + max(qs) > limit:
        raise UserError(f"--context {a.context} + q {max(qs)} exceeds the model's {limit} positions")
    meta = {"model": a.model, "device": describe(a.device), "dtype": a.dtype, "profile": a.profile,
            "threads": torch.get_num_threads(), "code_version": code_version()}
    models = {p: (model if p == "fast" or "fast" not in paths else stock_copy(model)) for p in paths}
    rows = cost_curve(models, qs, a.context, a.rounds)
    with JsonlWriter(a.out) as w:
        for row in rows:  # the fast path's few-row kernels, as its first small-q rounds chose them
            w.write({**row, **meta, **({"few_rows_kernels": few_rows_kernels()} if row.get("forward_path") == "fast" else {})})
    for row in rows:
        print(f"{row['forward_path']:>5} q={row['q']:>3}  {row['ms']:8.2f} ms  x{row['ratio']:.2f}")


if __name__ == "__main__":
    cli_main(main)
