"""Self-distillation corpus: the base model's own greedy answers to ShareGPT prompts.

Medusa heads, the distilled draft model, FIRP's maps and prompt tokens all learn to predict
what the *base model* will say next. This corpus is exactly what decoding sees (the model's
own greedy continuations), so the Medusa heads and the draft are *measured* on it (the
held-out set of :mod:`common.training.teacher`); they *train* on the cheaper teacher-forced pass over
real text. The corpus takes the first ``n_prompts`` ShareGPT prompts; the teacher's training
text starts after them.
"""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import torch
from tqdm import tqdm

from ..checks import check_device
from ..assets.data import load_dataset_samples
from ..errors import UserError, check_range, cli_main
from ..assets.models import load_model
from ..assets.prompts import encode_prompt


def build_corpus(model, tokenizer, n_prompts: int, max_new_tokens: int, max_prompt_tokens: int = 256,
                 batch_size: int = 8, dataset: str = "sharegpt", skip: int = 0) -> list[dict]:
    """Greedy answers, batched with left padding (training data, not a benchmark), to the
    ``n_prompts`` prompts after the first ``skip`` (a training corpus skips the held-out ones).

    Returns:
        ``n_prompts`` dicts ``{"ids": [prompt + answer ids], "start": len(prompt)}``.
    """
    check_range("n_prompts", n_prompts, 1)
    check_range("max_new_tokens", max_new_tokens, 1)
    check_range("skip", skip, 0)
    samples = load_dataset_samples(dataset, n=skip + n_prompts)[skip:]
    if len(samples) < n_prompts:
        raise UserError(f"{dataset} has {len(samples) + skip} samples, fewer than skip + n_prompts = {skip + n_prompts}")
    prompts = [encode_prompt(tokenizer, s.turns[0], max_prompt_tokens=max_prompt_tokens)[0] for s in samples]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    out = []
    for i in tqdm(range(0, len(prompts), batch_size), desc="self-distill corpus", unit="batch"):
        chunk = prompts[i:i + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=model.device)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(chunk):
            ids[j, width - len(p):], mask[j, width - len(p):] = p, 1
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, temperature=None, top_p=None, top_k=None)
        for j, p in enumerate(chunk):
            answer = gen[j, width:].tolist()
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            out.append({"ids": p.tolist() + answer, "start": len(p)})
    return out


def cache_key(**kw) -> dict:
    """:func:`build_corpus`'s settings as a cache key: only those that differ from its defaults
    (``None`` meaning the default), so every caller names one corpus by one key."""
    defaults = {k: p.default for k, p in inspect.signature(build_corpus).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {k: v for k, v in kw.items() if v is not None and (k not in defaults or v != defaults[k])}


def load_or_build(path: Path, model, tokenizer, **kw) -> list[dict]:
    """Cache the corpus in ``path`` (git-ignored): it is costly and shared by several trainers.
    ``kw``: :func:`build_corpus`'s settings (defaults and ``None`` do not enter the key)."""
    kw = cache_key(**kw)
    path = Path(path)
    if path.is_file():
        data = torch.load(path)
        if data["kw"] == kw:
            return data["corpus"]
    corpus = build_corpus(model, tokenizer, **kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"kw": kw, "corpus": corpus}, path)
    return corpus


def _main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="build the self-distillation corpus (base model's greedy answers)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--skip", type=int, default=0, help="answer the prompts after the first SKIP (held out)")
    ap.add_argument("--max-prompt-tokens", type=int, default=None, help="cut prompts to their last N tokens")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the model generates (cpu, cuda, cuda:N)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok = load_model(a.model, device=str(check_device(a.device)))
    corpus = load_or_build(a.out, model, tok, n_prompts=a.prompts, max_new_tokens=a.answer_tokens, skip=a.skip,
                           max_prompt_tokens=a.max_prompt_tokens)
    print(f"{len(corpus)} sequences, {sum(len(c['ids']) - c['start'] for c in corpus)} answer tokens -> {a.out}")


if __name__ == "__main__":
    cli_main(_main)
