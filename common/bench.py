"""Benchmark harness: every decoder on the same prompts, interleaved, one JSONL record each.

    python -m common.bench --model smollm2-135m-instruct --decoders vanilla,prompt_lookup \
        --dataset mt-bench --n 80 --max-new-tokens 128 --out results/cross/raw/bench.jsonl

Per prompt, the decoders run back to back (interleaved, not one decoder after another), so
slow drifts of a noisy machine hit every decoder alike. Each decoder is warmed up first.
The output file appears only when the run completes.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from .data import load_dataset_samples
from .decoders import get_decoder
from .errors import UserError, check_range, cli_main
from .hardware import PeakMemory, describe
from .models import load_model
from .prompts import encode_prompt
from .records import JsonlWriter, read_jsonl
from .report import summarize

STANDARD = {"steps", "accept_lengths", "new_tokens", "wall_time"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--decoders", required=True,
                    help="comma-separated registry names; NAME@LABEL runs NAME under its own label "
                         "and config (e.g. ppd_pipelined@k3), so one run can compare settings")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="dataset registry name")
    src.add_argument("--prompts", help="JSONL file of questions (question_id, category, turns)")
    ap.add_argument("--n", type=int, default=None, help="first n prompts (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--decoder-config", default="{}", help='JSON: {"decoder": {option: value}}')
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", default="adhoc", help="recorded in every record")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def run(args) -> list[dict]:
    check_range("max_new_tokens", args.max_new_tokens, 1)
    if args.threads:
        check_range("threads", args.threads, 1)
        torch.set_num_threads(args.threads)
    try:
        cfgs = json.loads(args.decoder_config)
    except json.JSONDecodeError as e:
        raise UserError(f"--decoder-config is not valid JSON ({e})")
    names = [d for d in args.decoders.split(",") if d]
    dataset = args.dataset or args.prompts
    samples = load_dataset_samples(dataset, n=args.n)
    torch.manual_seed(0)
    model, tok = load_model(args.model, dtype=args.dtype, device=args.device)
    decoders = {n: get_decoder(n.split("@")[0], model, tok, **cfgs.get(n, {})) for n in names}
    try:
        return _bench(args, samples, model, tok, decoders, dataset)
    finally:
        for d in decoders.values():
            d.close()


def _bench(args, samples, model, tok, decoders, dataset) -> list[dict]:
    prompts = [encode_prompt(tok, s.turns[0], max_prompt_tokens=args.max_prompt_tokens).to(args.device)
               for s in samples]
    for d in decoders.values():  # warm-up: allocator, kernels, lazy inits
        d.generate(prompts[0], min(8, args.max_new_tokens))
    device = describe(args.device)
    meta = {"model": args.model, "dataset": dataset, "profile": args.profile, "device": device,
            "dtype": args.dtype, "max_new_tokens": args.max_new_tokens}
    cfgs = json.loads(args.decoder_config)
    records = []
    with JsonlWriter(args.out) as out:
        for s, ids in tqdm(list(zip(samples, prompts)), desc="bench", unit="prompt"):
            for name, d in decoders.items():
                with PeakMemory(args.device) as mem:
                    o = d.generate(ids, args.max_new_tokens)
                st = o.stats
                rec = {"question_id": s.question_id, "decoder": name, "tokens": o.tokens,
                       "new_tokens": st["new_tokens"], "steps": st["steps"],
                       "accept_lengths": st["accept_lengths"], "wall_time": st["wall_time"],
                       "peak_mem_bytes": mem.peak, "prompt_tokens": int(ids.shape[1]), **meta,
                       "decoder_config": cfgs.get(name, {}),
                       "extra": {k: v for k, v in st.items() if k not in STANDARD}}
                out.write(rec)
                records.append(rec)
    return records


def main(argv=None) -> None:
    args = parse_args(argv)
    records = run(args)
    print(summarize(records).to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    cli_main(main)
