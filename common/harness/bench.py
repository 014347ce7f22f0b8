"""Benchmark harness: every decoder on the same prompts, interleaved, one JSONL record each.

    python -m common.harness.bench --model smollm2-135m-instruct --decoders vanilla,prompt_lookup \
        --dataset mt-bench --n 80 --max-new-tokens 128 --out results/cross/raw/bench.jsonl

Per prompt, the decoders run back to back (interleaved, not one decoder after another), so
slow drifts of a noisy machine hit every decoder alike. Each decoder is warmed up first.
The output file appears only when the run completes. Decoders, their configs, the device and
the output path are checked before the model loads; a prompt over ``--max-prompt-tokens`` or
the model's context is an error unless ``--truncate`` asks for a cut (recorded as
``prompt_truncated_from`` and said on stderr). ``--temperature``, ``--top-p``, ``--top-k`` and
``--seed`` set every decoder's sampling options (a label's own ``--decoder-config`` wins); every
record states the four values it decoded with (records without them are greedy).
``--category-temperatures mt-bench`` samples each prompt at its category's temperature instead
(FastChat's MT-Bench table, as the papers' non-greedy MT-Bench runs do; a decoder that cannot
sample runs greedy), and ``--acceptance typical`` puts every label whose decoder offers that rule
on it where a prompt samples (the papers' lossy typical acceptance; the records name the rule).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..checks import ArgumentParser, check_device, check_out_path, check_positive_int
from ..assets.data import CATEGORY_TEMPERATURES, category_temperature, load_dataset_samples
from ..decoders import DECODERS, decoder_class, get_decoder
from ..decoders.base import SAMPLING_OPTIONS
from ..errors import UserError, check_range, cli_main, unknown
from ..engine.fast import few_rows_kernels
from ..hardware import PeakMemory, code_version, describe
from ..assets.models import load_model
from ..assets.prompts import TEMPLATES, TRUNCATE, fit_prompt
from ..records import JsonlWriter, ResumeLog, check_start, content_digest
from .report import AA_LABEL, summarize

STANDARD = {"steps", "accept_lengths", "new_tokens", "wall_time"}


def parse_args(argv=None):
    ap = ArgumentParser(prog="python -m common.harness.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--decoders", required=True,
                    help="comma-separated registry names; NAME@LABEL runs NAME under its own label "
                         "and config (e.g. medusa@t16), so one run can compare settings")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="dataset registry name")
    src.add_argument("--prompts", help="JSONL file of questions (question_id, category, turns)")
    ap.add_argument("--n", type=int, default=None, help="first n prompts (default: all)")
    ap.add_argument("--template", default="plain",
                    help="prompt template around each first turn (common.assets.prompts.TEMPLATES; default: plain)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", default="1024",
                    help="an integer >= 1, or 'none' for no limit (the model's context still applies)")
    ap.add_argument("--truncate", default=None,
                    help="how to shorten a prompt over the limit: left / right (drop the start / end of its "
                         "text, keep the chat header) or last (keep its last tokens); default: error")
    ap.add_argument("--decoder-config", default="{}",
                    help='JSON: {"label": {option: value}}, each key one of the --decoders labels')
    samp = ap.add_argument_group("sampling (every decoder of the run; a label's --decoder-config wins)")
    samp.add_argument("--temperature", type=float, default=None, help="0 = greedy (the decoders' default)")
    samp.add_argument("--top-p", type=float, default=None, help="nucleus truncation in (0, 1]; 1 = off")
    samp.add_argument("--top-k", type=int, default=None, help="top-k truncation; 0 = off")
    samp.add_argument("--seed", type=int, default=None, help="seed of each decoder's own generator")
    samp.add_argument("--category-temperatures", default=None,
                      help="each prompt at its category's temperature from this table (mt-bench: FastChat's); "
                           "decoders that cannot sample run greedy; not with --temperature")
    samp.add_argument("--acceptance", default=None,
                      help="acceptance rule of every label whose decoder offers it, where a prompt samples "
                           "(e.g. typical, the papers' lossy option); a label's own acceptance wins")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--stock", action="store_true",
                    help="run transformers' stock forward path instead of common.engine.fast's (the strong "
                         "default every decoder shares); for before/after comparisons")
    ap.add_argument("--resume", action="store_true",
                    help="keep a per-prompt log of completed prompts (under the cache) and continue an "
                         "interrupted run with the same settings from it; records keep their own code_version")
    ap.add_argument("--aa", action="store_true",
                    help="the A/A pair: run vanilla a second time per prompt, last (label vanilla@aa), so the "
                         "tables can state the noise floor of every speedup (a group may list vanilla@aa instead)")
    ap.add_argument("--profile", default="adhoc", help="recorded in every record")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def parse_decoders(text: str) -> dict[str, str]:
    """``--decoders`` -> ``{label: registry name}``; every name registered, labels unique."""
    labels = [d.strip() for d in text.split(",") if d.strip()]
    if not labels:
        raise UserError(f"--decoders {text!r} names no decoder; valid: a comma-separated list of "
                        f"{', '.join(DECODERS)} (NAME@LABEL for a second setting)")
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise UserError(f"--decoders names {', '.join(dup)} more than once; valid: unique labels (NAME@LABEL)")
    names = {label: label.split("@")[0] for label in labels}
    for label, name in names.items():
        decoder_class(name)  # unknown name, or no registry at all: one error naming what is valid
        if "@" in label and not label.split("@", 1)[1]:
            raise UserError(f"decoder label {label!r} has an empty LABEL; valid: NAME or NAME@LABEL")
    return names


def parse_decoder_config(text: str, labels) -> dict[str, dict]:
    """``--decoder-config`` JSON -> ``{label: options}``, keyed only by the given labels.

    A key that matches no label used to be ignored silently (the run used defaults under
    the label it was meant to configure), so it is an error.
    """
    try:
        cfgs = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--decoder-config is not valid JSON ({e})") from None
    if not isinstance(cfgs, dict):
        raise UserError(f"--decoder-config must be a JSON object {{label: {{option: value}}}}; got "
                        f"{type(cfgs).__name__}")
    for key, opts in cfgs.items():
        if key not in labels:
            raise UserError(f"--decoder-config key {key!r} is not one of the --decoders labels; valid: "
                            f"{', '.join(labels)}")
        if not isinstance(opts, dict):
            raise UserError(f"--decoder-config[{key!r}] must be a JSON object of options; got "
                            f"{type(opts).__name__}")
    return cfgs


def parse_prompt_limit(text: str) -> int | None:
    """``--max-prompt-tokens``: an integer >= 1, or 'none' (no limit)."""
    if str(text).lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise UserError(f"--max-prompt-tokens {text!r} is out of range; valid: an integer >= 1, or 'none'")
    return value


def validate(args) -> tuple[dict[str, str], dict[str, dict]]:
    """Every check that needs no model, so bad input fails in seconds, before anything loads.

    Returns ``({label: decoder name}, {label: options})``.
    """
    check_range("max_new_tokens", args.max_new_tokens, 1)
    if args.template not in TEMPLATES:
        raise unknown("prompt template", args.template, TEMPLATES)
    check_positive_int("threads", args.threads)
    check_positive_int("n", args.n)
    args.max_prompt_tokens = parse_prompt_limit(args.max_prompt_tokens)
    if args.truncate is not None and args.truncate not in TRUNCATE:
        raise unknown("--truncate", args.truncate, TRUNCATE)
    check_device(args.device)
    check_out_path(args.out)
    names = parse_decoders(args.decoders)
    if getattr(args, "aa", False) and AA_LABEL not in names:
        if "vanilla" not in names:
            raise UserError(f"--aa pairs vanilla with itself, but --decoders {args.decoders!r} has no vanilla; "
                            f"valid: add vanilla to --decoders")
        # last in the per-prompt order: the pair brackets every other decoder of the prompt
        names[AA_LABEL] = "vanilla"
    check_per_prompt_sampling(args, names)
    return names, with_sampling(args, names, parse_decoder_config(args.decoder_config, list(names)))


def check_per_prompt_sampling(args, names: dict[str, str]) -> None:
    """``--category-temperatures`` and ``--acceptance``, checked before the model loads: a known
    table, not beside a run-level temperature; a registered rule that some label's decoder offers."""
    table, rule = getattr(args, "category_temperatures", None), getattr(args, "acceptance", None)
    if table is not None:
        if table not in CATEGORY_TEMPERATURES:
            raise unknown("--category-temperatures table", table, CATEGORY_TEMPERATURES)
        if args.temperature is not None:
            raise UserError("--category-temperatures sets each prompt's temperature; valid: drop --temperature, "
                            "or drop --category-temperatures")
    if rule is not None:
        offering = [label for label, name in names.items() if rule in offered_rules(name)]
        if not offering:
            every = sorted({r for name in DECODERS for r in offered_rules(name)})
            raise UserError(f"--acceptance {rule!r} is offered by none of --decoders {','.join(names)}; valid: "
                            f"{', '.join(every)} (each where its decoder offers it)")
        if table is None and not args.temperature:
            raise UserError(f"--acceptance {rule!r} applies where a prompt samples, but the run is greedy; valid: "
                            f"add --temperature or --category-temperatures")


def offered_rules(name: str) -> tuple[str, ...]:
    """The acceptance rules decoder ``name`` offers (``acceptance_rules``; none for a decoder
    without the option)."""
    return tuple(getattr(decoder_class(name), "acceptance_rules", ()))


def instance_configs(args, names: dict[str, str], cfgs: dict[str, dict], temperatures) -> dict[str, dict]:
    """``{label: {temperature or None: options}}``: one decoder instance per temperature a label
    decodes at. Without ``--category-temperatures`` one instance (key None) with the label's
    options; with it, a label that can sample and sets no temperature of its own gets one per
    temperature in ``temperatures`` (the prompts' categories), under ``--acceptance`` where it
    offers that rule and the temperature is above 0; the rest one greedy instance."""
    table, rule = getattr(args, "category_temperatures", None), getattr(args, "acceptance", None)
    out = {}
    for label, name in names.items():
        cfg = cfgs.get(label, {})
        if table is None or "temperature" in cfg or not decoder_class(name).can_sample():
            one = {**cfg, "acceptance": rule} if (rule and rule in offered_rules(name) and cfg.get("temperature")
                                                  and "acceptance" not in cfg) else cfg
            out[label] = {None: one}
            continue
        out[label] = {}
        for t in sorted(set(temperatures)):
            c = {**cfg, "temperature": t}
            if rule and t > 0 and rule in offered_rules(name) and "acceptance" not in cfg:
                c["acceptance"] = rule
            out[label][t] = c
    return out


def with_sampling(args, names: dict[str, str], cfgs: dict[str, dict]) -> dict[str, dict]:
    """Each label's options with the run's ``--temperature/--top-p/--top-k/--seed`` under its
    own, checked before any model loads (a range, or a decoder that cannot sample)."""
    run_level = {k: getattr(args, k, None) for k in SAMPLING_OPTIONS}
    run_level = {k: v for k, v in run_level.items() if v is not None}
    out = {}
    for label, name in names.items():
        cfg = {**run_level, **cfgs.get(label, {})}
        decoder_class(name).check_sampling(cfg)
        if cfg:
            out[label] = cfg
    return out


def run(args) -> list[dict]:
    names, cfgs = validate(args)
    # the code this process loaded: read now, not when the first record is written minutes later
    # (a commit made meanwhile, beside the run, would be named instead)
    args.code_version = code_version()
    check_start(args.out)  # refused now, not when the first record is written
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dataset = args.dataset or args.prompts
    samples = load_dataset_samples(dataset, n=args.n)
    if not samples:
        raise UserError(f"{dataset} has no prompts; valid: a dataset or --prompts file with at least one")
    torch.manual_seed(0)
    model, tok = load_model(args.model, dtype=args.dtype, device=args.device, fast=not args.stock)
    prompts = encode_prompts(args, samples, model, tok)
    table = getattr(args, "category_temperatures", None)
    temps = [category_temperature(table, s.category) for s in samples] if table else []
    variants = instance_configs(args, names, cfgs, temps)
    decoders: dict[str, dict] = {}
    try:
        for label, name in names.items():
            decoders[label] = {t: get_decoder(name, model, tok, **c) for t, c in variants[label].items()}
        return _bench(args, samples, prompts, decoders, dataset, variants, temps)
    finally:
        for inst in decoders.values():
            for d in inst.values():
                d.close()


def encode_prompts(args, samples, model, tok) -> list[tuple[torch.Tensor, int]]:
    """Each sample's first turn -> ``(ids [1, S] on the device, untruncated length)``.

    A prompt over ``--max-prompt-tokens`` is an error unless ``--truncate`` asks for a cut;
    with the ``max_new_tokens`` after it, it must fit the model's context (a longer one once
    ran minutes and returned one token). Every cut is said on stderr.
    """
    context = getattr(model.config, "max_position_embeddings", None)
    limit = args.max_prompt_tokens
    if context is not None:
        room = context - args.max_new_tokens
        if room < 1:
            raise UserError(f"max_new_tokens={args.max_new_tokens} leaves no room for a prompt in the model's "
                            f"context of {context} tokens; valid: 1..{context - 1}")
        if args.truncate is not None:   # a cut was asked for: cut to what fits the context too
            limit = room if limit is None else min(limit, room)
    out = []
    for s in samples:
        try:
            ids, full = fit_prompt(tok, s.turns[0], template=args.template, max_prompt_tokens=limit,
                                   truncate=args.truncate)
        except UserError as e:
            raise UserError(f"prompt {s.question_id!r}: {e}") from None
        if context is not None and ids.shape[1] + args.max_new_tokens > context:
            raise UserError(f"prompt {s.question_id!r} has {ids.shape[1]} tokens; with max_new_tokens="
                            f"{args.max_new_tokens} it exceeds the model's context of {context}; valid: "
                            f"prompt + max_new_tokens <= {context} (--truncate asks for a cut)")
        if ids.shape[1] < full:
            print(f"bench: prompt {s.question_id!r} truncated from {full} to {ids.shape[1]} tokens "
                  f"(--truncate {args.truncate})", file=sys.stderr)
        out.append((ids.to(args.device), full))
    return out


def variants_for_identity(variants: dict[str, dict]) -> dict[str, dict]:
    """A run's decoder options as its resume identity: ``{label: options}`` where a label has one
    instance (as before per-prompt temperatures existed), ``{label: {"t=<T>": options}}`` where
    it has one per temperature."""
    return {label: inst[None] if list(inst) == [None] else {f"t={t}": c for t, c in inst.items()}
            for label, inst in variants.items()}


def resume_log(args, names: dict, cfgs: dict) -> ResumeLog:
    """Where ``--resume`` keeps the completed prompts of a run writing ``args.out``, and the
    settings a continuation must share (everything that changes a record but the code). The
    hardware is one of them: a run's speedups are means over its prompts, so a continuation on
    another machine (a later session may get another CPU) would mix two machines' timings."""
    identity = {k: getattr(args, k) for k in ("model", "dataset", "prompts", "n", "template", "max_new_tokens", "max_prompt_tokens",
                                              "truncate", "dtype", "device", "threads", "stock", "profile")}
    # only where set: a greedy run's identity stays what it was, so its earlier resume logs still continue
    identity.update({k: getattr(args, k) for k in ("category_temperatures", "acceptance")
                     if getattr(args, k, None) is not None})
    return ResumeLog.for_output(args.out, {**identity, "hardware": describe(args.device), "decoders": names,
                                           "decoder_config": cfgs})


def component_digests(cfg: dict) -> dict[str, str]:
    """``{option: content digest}`` of the decoder options that name a file or folder (a draft,
    heads, a datastore): which weights a record decoded with, beyond their cache path."""
    return {k: content_digest(v) for k, v in sorted(cfg.items()) if isinstance(v, str) and Path(v).exists()}


def model_digest(model: str) -> dict[str, str]:
    """``{"model_digest": content digest}`` when the benchmarked model is a local folder (a trained
    component: BiLD's exit models), else nothing: its cache path alone does not say which weights a
    record decoded with once the component is retrained there."""
    return {"model_digest": content_digest(model)} if Path(model).is_dir() else {}


def _bench(args, samples, prompts, decoders, dataset, variants, temps=()) -> list[dict]:
    """Every prompt through every label's decoder, interleaved. ``decoders``/``variants``:
    ``{label: {temperature or None: decoder / its options}}`` (:func:`instance_configs`);
    ``temps``: each prompt's temperature where the run samples per category."""
    names = {label: next(iter(inst.values())).name for label, inst in decoders.items()}
    resume = resume_log(args, names, variants_for_identity(variants)) if args.resume else None
    done = resume.load() if resume else {}
    if done:
        print(f"bench: resuming {args.out}: {len(done)} of {len(samples)} prompts done ({resume.path})",
              file=sys.stderr)
    for inst in decoders.values():  # warm-up: allocator, kernels, lazy inits
        for d in inst.values():
            d.generate(prompts[0][0], min(8, args.max_new_tokens))
    device = describe(args.device)
    meta = {"model": args.model, "dataset": dataset, "profile": args.profile, "device": device,
            "code_version": args.code_version, "forward_path": "stock" if args.stock else "fast",
            "few_rows_kernels": {} if args.stock else few_rows_kernels(),  # chosen by the warm-up's steps
            "dtype": args.dtype, "max_new_tokens": args.max_new_tokens, **model_digest(args.model)}
    if getattr(args, "category_temperatures", None):
        meta["category_temperatures"] = args.category_temperatures
    components = {label: component_digests(next(iter(v.values()))) for label, v in variants.items()}
    records = []
    with JsonlWriter(args.out) as out:
        for i, (s, (ids, full)) in enumerate(tqdm(list(zip(samples, prompts)), desc="bench", unit="prompt")):
            if s.question_id in done:
                for rec in done[s.question_id]:
                    out.write(rec)
                    records.append(rec)
                continue
            unit = []
            for name, inst in decoders.items():
                key = temps[i] if temps and temps[i] in inst else None
                d, cfg = inst[key], variants[name][key]
                with PeakMemory(args.device) as mem:
                    o = d.generate(ids, args.max_new_tokens)
                st = o.stats
                rec = {"question_id": s.question_id, "category": s.category, "decoder": name, "tokens": o.tokens,
                       "new_tokens": st["new_tokens"], "steps": st["steps"],
                       "accept_lengths": st["accept_lengths"], "wall_time": st["wall_time"],
                       "peak_mem_bytes": mem.peak, "mem_growth_bytes": mem.growth,
                       "prompt_tokens": int(ids.shape[1]), **meta, **d.sampling,
                       "decoder_config": cfg, "components": components[name],
                       "extra": {k: v for k, v in st.items() if k not in STANDARD}}
                if d.tokenizer is not None:  # quality metrics read text, not ids (notebooks load no tokenizer)
                    rec["text"] = d.tokenizer.decode(o.tokens, skip_special_tokens=True)
                if s.reference is not None:
                    rec["reference"] = s.reference
                if full > ids.shape[1]:
                    rec["prompt_truncated_from"] = full
                out.write(rec)
                records.append(rec)
                unit.append(rec)
            if resume:
                resume.append(s.question_id, unit)
    if resume:
        resume.remove()  # the result is complete and in place
    return records


def main(argv=None) -> None:
    args = parse_args(argv)
    records = run(args)
    print(summarize(records).to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    cli_main(main)
