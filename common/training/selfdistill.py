"""Command line for a small answer set: the model's greedy answers to a few ShareGPT first turns
in one cached file (``corpus.pt``, ``seqcorpus.pt``), for a model the sharded corpus was not made
by (a variant's own base model) or a profile that reads no shards.

The answers come from :func:`common.training.corpus.answer_set`, the corpus builder's one
generator (:func:`~common.training.corpus.greedy_answers`); this module only parses flags.

    python -m common.training.selfdistill --model smollm2-135m-instruct --out .cache/components/embedded/corpus.pt --prompts 32
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from . import corpus
from ..checks import check_device
from ..errors import check_range, cli_main
from ..assets.models import load_model


def _main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="build a small answer set (the base model's greedy answers)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--skip", type=int, default=0, help="answer the prompts after the first SKIP (held out)")
    ap.add_argument("--max-prompt-tokens", type=int, default=None, help="cut prompts to their last N tokens")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the model generates (cpu, cuda, cuda:N)")
    a = ap.parse_args(argv)
    check_range("--prompts", a.prompts, 1)
    check_range("--answer-tokens", a.answer_tokens, 1)
    check_range("--skip", a.skip, 0)
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok = load_model(a.model, device=str(check_device(a.device)))
    answers = corpus.load_or_build_set(a.out, model, tok, n_prompts=a.prompts, max_new_tokens=a.answer_tokens,
                                       skip=a.skip, max_prompt_tokens=a.max_prompt_tokens)
    print(f"{len(answers)} sequences, {sum(len(c['ids']) - c['start'] for c in answers)} answer tokens -> {a.out}")


if __name__ == "__main__":
    cli_main(_main)
