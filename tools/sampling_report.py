"""Lossless sampling, checked against the target's exact distribution (issue 80).

On a tiny random LLaMA made peaked (its final norm scaled, so a few tokens carry most of the
mass and drafts are accepted now and then), the exact distribution of the first
:data:`COUNTED` generated tokens is enumerated: every prefix's next-token distribution,
processed as transformers processes it (its own ``Temperature``/``TopK``/``TopP`` warpers, in
that order: an independent reference, not the code under test). Every registered lossless
decoder, on each of its ``test_configs``, then draws ``N`` sequences with seeds ``0..N-1`` and
a G-test compares their counts with the exact distribution (cells expected below
:data:`MIN_EXPECTED` pooled; a sequence of probability 0 fails outright). Two negative
controls show that the same test at the same ``N`` has power: a wrong acceptance rule (a draft
token kept with probability ``p(x)`` instead of ``min(1, p(x)/q(x))``, through ``speculative``)
and ``vanilla`` at the wrong temperature. ``tests/decoders/test_sampling_exact.py`` runs this check at
a CI-sized ``N`` (``pytest -m distribution``: 10 000); this script runs it at ``--draws``
(default 10 000) and writes one JSON record:

    python tools/sampling_report.py --out .cache/sampling/report.json [--draws 10000]
        [--decoders eagle,medusa] [--model smollm2-135m-instruct --real-draws 500 --prompts 3
         --device cpu --dtype float32 --threads 2]

With ``--model``, also a seeded temperature-1 run of every chosen lossless decoder (its first
test option set: random untrained components, as exactness must not depend on them) on a few
prompts, its first :data:`REAL_COUNTED` tokens compared with ``vanilla``'s by a two-sample
G-test per prompt: reported, never asserted (the real model's distribution cannot be
enumerated). ``--no-controls`` leaves the controls out, ``--controls-only`` runs only them: the
workflow's rule ``sampling_part`` (rules/cross.smk, profile section ``sampling_report``) writes one
record per part, ``<results_root>/cross/raw/sampling/<decoder>.json`` and ``controls.json``, so
hours of draws are kept (and committed) decoder by decoder; artifact ``cross.sampling`` merges
them (:func:`common.harness.sampling_tables.merge_records`). A record under ``results/`` comes only from committed code
(:func:`common.records.traced_path`), refused at the start rather than after hours of draws.
"""
from __future__ import annotations

import contextlib
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.assets.models import DTYPES  # noqa: E402
from common.checks import ArgumentParser, check_device, check_out_path, check_positive_int  # noqa: E402
from common.decoders import DECODERS, decoder_class, get_decoder  # noqa: E402
from common.engine import acceptance as acc  # noqa: E402
from common.errors import UserError, cli_main  # noqa: E402
from common.hardware import code_version, describe  # noqa: E402
from common.records import check_start, write_json  # noqa: E402

# -- the tiny model and what is counted -------------------------------------------------------
# The final norm's weight is multiplied by PEAK: at init the logits are ~0 (a near-uniform
# distribution over 96 tokens, no draft ever accepted, no cell populated); x40 gives the first
# token a top probability ~0.5 and entropy ~1.5 nats, so 3-token sequences populate ~50 cells
# at 10 000 draws.
PEAK = 40.0
# Repeats itself, so n-gram, suffix and lookup drafters propose from the first step.
PROMPT = (1, 5, 6, 7, 5, 6, 7, 5)
COUNTED = 3
# One token more than counted: the first step after the prefill may then propose a tree two
# levels deep, so the counted tokens 2 and 3 can both come from accepted draft nodes (with
# COUNTED new tokens only depth-1 nodes and the bonus token would be exercised).
MAX_NEW = COUNTED + 1
# The two processed distributions every decoder is tested on: plain temperature 1, and
# temperature, top-k and top-p together (transformers' order; each truncates here).
SETTINGS = {"t1": {"temperature": 1.0},
            "t0.9_k6_p0.95": {"temperature": 0.9, "top_k": 6, "top_p": 0.95}}
# Per test. About 100 tests (decoders x option sets x settings) run, all seeded, so a correct
# decoder fails by chance with probability ~1e-3 per test only when its code changes; a broken
# rule gives p-values many orders below (the controls show how far).
ALPHA = 1e-3
# progress bars on stderr: the command line's hours of draws show them, the tests' short checks do not
PROGRESS = False
MIN_EXPECTED = 5.0
# The negative controls: vanilla at this temperature tested against the temperature-1
# distribution (KL 0.4 nats over the 3 counted tokens; 1.25 gives 0.1, too close to be
# rejected far below alpha at CI draws), and a wrong acceptance rule.
WRONG_TEMPERATURE = 1.5
WRONG_RULE = "accept_p"
# Decoders that must sample (not merely refuse): the reference and the chain rule.
MUST_SAMPLE = ("vanilla", "speculative")
REAL_COUNTED = 2
REAL_PROMPTS = ("Name three colours.", "Write a haiku about rain.", "What is 17 times 3?",
                "Give one tip for learning to cook.")


def peaked_llama(seed: int = 0):
    """The tiny random LLaMA of the lossless tests (4 layers, vocab 96, layer weights x10 so
    its output depends on the context) with its final norm scaled by :data:`PEAK` (fp32)."""
    from common.assets.models import tiny_llama
    model = tiny_llama(seed=seed, scale=10.0)
    with torch.no_grad():
        model.model.norm.weight.mul_(PEAK)
    return model


def processed(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``[B, V]`` logits -> ``[B, V]`` float64 probabilities through transformers' own warpers
    (temperature, then top-k, then top-p, as ``generate`` chains them): the reference."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
    scores = TemperatureLogitsWarper(temperature)(None, logits.float())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores.double(), dim=-1)


@torch.no_grad()
def exact_distribution(model, prompt=PROMPT, counted: int = COUNTED, eos: set[int] = frozenset(),
                       chunk: int = 1024, **setting) -> dict[tuple[int, ...], float]:
    """The exact probability of every sequence of the first ``counted`` new tokens.

    Level by level: each live prefix (probability > 0, not ended by an EOS) is extended by
    every token of its processed next-token distribution, one batched forward per level. A
    sequence that ends with an EOS is shorter (decoders stop there).

    Returns:
        ``{token tuple: probability}`` in descending probability; the probabilities sum to 1.
    """
    dist: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(counted):
        live = [s for s in dist if not (s and s[-1] in eos)]
        nxt = {s: p for s, p in dist.items() if s and s[-1] in eos}
        for i in range(0, len(live), chunk):
            part = live[i:i + chunk]
            ids = torch.tensor([list(prompt) + list(s) for s in part], device=model.device)
            probs = processed(model(ids).logits[:, -1], **setting).cpu()   # [B, V]
            for s, row in zip(part, probs):
                base = dist[s]
                for tok in torch.nonzero(row).flatten().tolist():
                    nxt[s + (tok,)] = base * float(row[tok])
        dist = nxt
    return dict(sorted(dist.items(), key=lambda kv: kv[1], reverse=True))


# -- the test statistic -----------------------------------------------------------------------
def chi2_sf(statistic: float, dof: int) -> float:
    """P(chi-square with ``dof`` degrees of freedom >= ``statistic``) (regularised upper
    incomplete gamma; torch has it, scipy is not a dependency)."""
    if dof <= 0:
        return 1.0
    # G of identical counts sums to 0 up to rounding, which can land just below it (-9e-13 on two
    # identical 500-draw samples): gammaincc of a negative argument is NaN, the tail of 0 is 1
    statistic = max(statistic, 0.0)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def pooled_cells(expected: dict, min_expected: float = MIN_EXPECTED) -> list[list]:
    """Cells for a chi-square-type test: keys with ``expected >= min_expected`` alone, the rest
    in one pooled cell (merged into the smallest kept cell while it is itself too small).

    Returns:
        a list of cells, each a list of keys.
    """
    order = sorted(expected, key=expected.get, reverse=True)
    cells = [[k] for k in order if expected[k] >= min_expected]
    rest = [k for k in order if expected[k] < min_expected]
    if rest:
        if sum(expected[k] for k in rest) >= min_expected or not cells:
            cells.append(rest)
        else:
            cells[-1] = cells[-1] + rest
    return cells


def g_test(counts: Counter, exact: dict, min_expected: float = MIN_EXPECTED) -> dict:
    """G-test of observed sequence ``counts`` against the ``exact`` distribution (a dict in
    descending probability, as :func:`exact_distribution` returns it: the cells are its
    leading sequences expected ``>= min_expected`` times, the rest one pooled cell, merged
    into the last kept cell while it is itself too small).

    Returns:
        ``statistic``, ``dof``, ``p_value``, ``samples``, ``cells`` and ``impossible`` (draws of
        sequences with exact probability 0: any makes ``p_value`` 0).
    """
    n = sum(counts.values())
    impossible = sum(c for s, c in counts.items() if exact.get(s, 0.0) <= 0)
    cells: list[list[float]] = []                      # [observed, expected] per kept sequence
    for s, p in exact.items():                         # descending: stop at the first small one
        if n * p < min_expected:
            break
        cells.append([counts.get(s, 0), n * p])
    rest = [n - impossible - sum(o for o, _ in cells), n - sum(e for _, e in cells)]  # the pooled tail
    if rest[1] >= min_expected or not cells:
        cells.append(rest)
    elif rest[1] > 0:
        cells[-1] = [cells[-1][0] + rest[0], cells[-1][1] + rest[1]]
    g = sum(2 * o * math.log(o / e) for o, e in cells if o)
    dof = len(cells) - 1
    return {"statistic": g, "dof": dof, "p_value": 0.0 if impossible else chi2_sf(g, dof),
            "samples": n, "cells": len(cells), "impossible": impossible}


def two_sample_g(a: Counter, b: Counter, min_expected: float = MIN_EXPECTED) -> dict:
    """Two-sample G-test of homogeneity (are ``a`` and ``b`` draws of one distribution?):
    the 2 x cells contingency table, cells whose smaller expected count is below
    ``min_expected`` pooled."""
    na, nb = sum(a.values()), sum(b.values())
    keys = set(a) | set(b)
    frac = {k: (a.get(k, 0) + b.get(k, 0)) / (na + nb) for k in keys}
    cells = pooled_cells({k: min(na, nb) * f for k, f in frac.items()}, min_expected)
    g = 0.0
    for cell in cells:
        f = sum(frac[k] for k in cell)
        for obs, n in ((sum(a.get(k, 0) for k in cell), na), (sum(b.get(k, 0) for k in cell), nb)):
            if obs:
                g += 2 * obs * math.log(obs / (n * f))
    dof = len(cells) - 1
    g = max(g, 0.0)  # a sum of terms that cancel exactly for identical samples, up to rounding
    return {"statistic": g, "dof": dof, "p_value": chi2_sf(g, dof), "samples": [na, nb], "cells": len(cells)}


# -- drawing ------------------------------------------------------------------------------------
def rule_of(decoder) -> str:
    """The acceptance rule a decoder samples with (the target's own draw where it has none)."""
    rule = getattr(decoder, "rule", None)
    return rule.name if rule is not None else "target"


def draw(decoder, ids: torch.Tensor, seeds, counted: int = COUNTED, max_new: int = MAX_NEW,
         desc: str | None = None) -> Counter:
    """Counts of the first ``counted`` tokens over one ``generate`` per seed; ``desc``: a progress
    bar on stderr under that name (hours of draws at the record's size), none without it.

    One instance serves every seed: the contract draws from a generator made afresh at each
    call from ``cfg["seed"]`` (``Decoder.generator``), so setting the seed between calls equals
    constructing the decoder with it (a construction costs as much as a draw); :func:`check_config`
    checks that equality on one seed for every option set.
    """
    counts: Counter = Counter()
    for s in tqdm(seeds, desc=desc, unit="draw", disable=desc is None, mininterval=30):
        decoder.cfg["seed"] = s
        counts[tuple(decoder.generate(ids, max_new).tokens[:counted])] += 1
    return counts


def config_label(cfg: dict) -> str:
    """An option set in a line: paths by their last part, models by their class."""
    def short(v):
        if isinstance(v, torch.nn.Module):
            return type(v).__name__
        if isinstance(v, (str, Path)) and ("/" in str(v)):
            return Path(v).name
        if isinstance(v, dict):
            return {k: short(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [short(x) for x in v]
        return v
    return ",".join(f"{k}={short(v)}" for k, v in cfg.items()) or "defaults"


def check_config(name: str, cfg: dict, model, exacts: dict, n: int, prompt=PROMPT) -> list[dict]:
    """One decoder option set on every setting of ``exacts``: a row each with the rule used,
    the G-test's result, the seconds per draw, and whether the same seed gave the same tokens
    (a fresh instance against a re-seeded one). A decoder that cannot sample must refuse with
    UserError (any other error propagates): its row says ``cannot sample`` and why."""
    ids = torch.tensor([list(prompt)], device=model.device)
    rows = []
    for label, setting in SETTINGS.items():
        row = {"decoder": name, "config": config_label(cfg), "setting": label, **setting}
        try:
            dec = get_decoder(name, model, **cfg, **setting, seed=0)
            dec.generate(ids, MAX_NEW)
        except UserError as e:
            rows.append({**row, "status": "cannot sample", "reason": str(e)})
            continue
        try:
            t0 = time.perf_counter()
            counts = draw(dec, ids, range(n), desc=f"{name} [{row['config']}] {label}" if PROGRESS else None)
            seconds = (time.perf_counter() - t0) / n
            fresh = get_decoder(name, model, **cfg, **setting, seed=n - 1)   # dec's seed is n - 1 now
            again = fresh.generate(ids, MAX_NEW).tokens
            fresh.close()
            same = tuple(again[:COUNTED]) == tuple(dec.generate(ids, MAX_NEW).tokens[:COUNTED])
        finally:
            dec.close()
        rows.append({**row, "status": "tested", "rule": rule_of(dec), **g_test(counts, exacts[label]),
                     "seconds_per_draw": seconds, "same_seed_same_tokens": same})
    return rows


def check_decoder(name: str, model, workdir: Path, n: int, exacts: dict) -> list[dict]:
    """Every test option set of ``name`` (:func:`check_config`); a ``cannot run`` row (with the
    reason) for an option set the decoder refuses on the tiny model, or for all when it refuses
    to build them."""
    cls = decoder_class(name)
    ids = torch.tensor([list(PROMPT)], device=model.device)
    # a refusal (UserError: another model kind, too few layers) is listed with its reason; a
    # crash is a bug and propagates
    try:
        cfgs = cls.test_configs(model, workdir)
    except UserError as e:
        return [{"decoder": name, "status": "cannot run", "reason": f"test_configs: {e}"}]
    rows = []
    for cfg in cfgs:
        try:
            get_decoder(name, model, **cfg).generate(ids, MAX_NEW)
        except UserError as e:
            rows.append({"decoder": name, "config": config_label(cfg), "status": "cannot run", "reason": str(e)})
            continue
        rows.extend(check_config(name, cfg, model, exacts, n))
    return rows


def lossless_decoders() -> list[str]:
    """Every registered lossless decoder, by name (new ones are covered as they register)."""
    return sorted(n for n in DECODERS if decoder_class(n).lossless)


def exact_distributions(model) -> dict:
    """The exact distribution under each of :data:`SETTINGS`, and at temperature 1 for the
    wrong-temperature control (the ``t1`` one)."""
    eos = set()
    eos_id = getattr(model.generation_config, "eos_token_id", None)
    if eos_id is not None:
        eos = set(eos_id) if isinstance(eos_id, (list, tuple)) else {int(eos_id)}
    return {label: exact_distribution(model, eos=eos, **setting) for label, setting in SETTINGS.items()}


# -- the negative controls -----------------------------------------------------------------------
class AcceptP(acc.RULES["tree_speculative"]):
    """Deliberately wrong: a draft token is kept with probability ``p(x)``, not
    ``min(1, p(x) / q(x))`` (the negative control; never registered outside :func:`wrong_rule`)."""

    name = WRONG_RULE

    def accept_probability(self, p_x: float, q_x: float) -> float:
        return p_x


@contextlib.contextmanager
def wrong_rule(decoder_name: str = "speculative"):
    """:class:`AcceptP` registered and allowed for ``decoder_name`` while the block runs."""
    cls = decoder_class(decoder_name)
    rules_before = cls.acceptance_rules
    acc.RULES[WRONG_RULE] = AcceptP
    cls.acceptance_rules = (*rules_before, WRONG_RULE)
    try:
        yield
    finally:
        cls.acceptance_rules = rules_before
        del acc.RULES[WRONG_RULE]


def control_rows(model, n: int, exacts: dict) -> list[dict]:
    """Both negative controls, each G-tested against the temperature-1 distribution at ``n``
    draws: ``speculative`` with :class:`AcceptP` and the target as its own draft (the right rule
    keeps every draft token; this one keeps ``x`` with ``p(x)``; a near copy as the draft hides
    the error better: its rejections resample a residual that is nearly ``p`` again), and
    ``vanilla`` at :data:`WRONG_TEMPERATURE`."""
    ids = torch.tensor([list(PROMPT)], device=model.device)
    with wrong_rule("speculative"):
        dec = get_decoder("speculative", model, draft=model, temperature=1.0, acceptance=WRONG_RULE)
        wrong = draw(dec, ids, range(n), desc="control: accept_p" if PROGRESS else None)
    hot = draw(get_decoder("vanilla", model, temperature=WRONG_TEMPERATURE), ids, range(n),
               desc="control: wrong temperature" if PROGRESS else None)
    return [{"control": f"speculative (draft: the target) with acceptance={WRONG_RULE} (keeps x with p(x))",
             "rule": WRONG_RULE, **g_test(wrong, exacts["t1"])},
            {"control": f"vanilla at temperature {WRONG_TEMPERATURE} against temperature 1", "rule": "target",
             **g_test(hot, exacts["t1"])}]


# -- the real model (reported, never asserted) --------------------------------------------------
def real_model_rows(model_name: str, n: int, prompts: int, workdir: Path, decoders: list[str] | None = None,
                    device: str = "cpu", dtype: str = "float32") -> list[dict]:
    """Every lossless decoder of ``decoders`` (default: all) at temperature 1 (seeds ``0..n-1``,
    its first test option set) against ``vanilla`` on the first ``prompts`` of
    :data:`REAL_PROMPTS`: a two-sample G-test of the first :data:`REAL_COUNTED` tokens per
    prompt, on ``model_name`` loaded on ``device`` in ``dtype``."""
    from common.assets.models import load_model
    from common.assets.prompts import encode_prompt
    model, tok = load_model(model_name, dtype=dtype, device=device)
    rows = []
    for text in REAL_PROMPTS[:prompts]:
        ids = encode_prompt(tok, text).to(model.device)
        ref = draw(get_decoder("vanilla", model, tok, temperature=1.0), ids, range(n), REAL_COUNTED, REAL_COUNTED)
        for name in decoders or lossless_decoders():
            if name == "vanilla":
                continue
            row = {"decoder": name, "prompt": text}
            try:
                cfg = decoder_class(name).test_configs(model, workdir)[0]
                dec = get_decoder(name, model, tok, **cfg, temperature=1.0)
                counts = draw(dec, ids, range(n), REAL_COUNTED, REAL_COUNTED + 1,
                              desc=f"{name} on {model_name}" if PROGRESS else None)
                dec.close()
            except UserError as e:
                rows.append({**row, "status": "not run", "reason": str(e)})
                continue
            rows.append({**row, "status": "tested", "rule": rule_of(dec), **two_sample_g(counts, ref)})
    return rows


def lossy_rules(decoders: list[str]) -> dict[str, list[str]]:
    """Registered sampling rules that are not lossless (Medusa's ``typical``), each with the
    chosen decoders that offer it: what the lossless rows leave out, by design."""
    offers = {d: getattr(decoder_class(d), "acceptance_rules", ()) for d in decoders}  # vanilla has no rules
    lossy = {name: [d for d in decoders if name in offers[d]] for name, rule in sorted(acc.RULES.items())
             if not rule.lossless and "positive" in rule.temperatures}
    return {name: decs for name, decs in lossy.items() if decs}


def report(n: int, decoders: list[str], model_name: str | None, real_draws: int, prompts: int,
           device: str = "cpu", dtype: str = "float32", threads: int = 1, version: str | None = None,
           controls: bool = True) -> dict:
    """The whole check (or one part of it) as one JSON-ready record. ``device``, ``dtype``,
    ``threads``: the real model's run (the tiny model's is on the CPU, one thread); ``version``:
    :func:`code_version` read when the run started (a commit made during hours of draws is not
    the code that drew); ``controls``: run the negative controls (``False``: ``controls`` is
    empty, as in a per-decoder part the workflow merges with its controls part)."""
    version = version or code_version()
    lossy = lossy_rules(decoders)
    torch.set_num_threads(1)  # tiny-model ops: a second thread only spin-waits
    model = peaked_llama()
    exacts = exact_distributions(model)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r for name in decoders for r in check_decoder(name, model, Path(tmp) / name, n, exacts)]
        controls = control_rows(model, n, exacts) if controls else []
        out = {"alpha": ALPHA, "min_expected": MIN_EXPECTED, "counted_tokens": COUNTED, "max_new_tokens": MAX_NEW,
               "prompt": list(PROMPT), "model": f"tiny_llama(seed=0, scale=10), final norm x{PEAK}",
               "settings": SETTINGS, "draws": n, "device": describe("cpu"), "threads": torch.get_num_threads(),
               "code_version": version, "decoders": rows, "controls": controls,
               "lossy_rules": lossy,
               "failed": [f"{r['decoder']} [{r['config']}] {r['setting']}" for r in rows
                          if r["status"] == "tested" and not (r["p_value"] >= ALPHA and r["same_seed_same_tokens"])],
               "controls_rejected": bool(controls) and all(c["p_value"] < ALPHA for c in controls)}
        if model_name:
            torch.set_num_threads(threads)
            out["real_model"] = {"model": model_name, "draws": real_draws, "counted_tokens": REAL_COUNTED,
                                 "device": describe(device), "dtype": dtype, "threads": torch.get_num_threads(),
                                 "rows": real_model_rows(model_name, real_draws, prompts, Path(tmp) / "real",
                                                         decoders, device, dtype)}
    return out


def main(argv=None) -> None:
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the JSON record to write")
    ap.add_argument("--draws", type=int, default=10_000, help="sequences per decoder option set and setting")
    ap.add_argument("--decoders", default=None, help="comma-separated lossless decoders (default: all)")
    ap.add_argument("--model", default=None, help="also the two-sample run on this model (e.g. smollm2-135m-instruct)")
    ap.add_argument("--real-draws", type=int, default=500, help="draws per decoder and prompt on --model")
    ap.add_argument("--prompts", type=int, default=3, help=f"prompts on --model (1..{len(REAL_PROMPTS)})")
    ap.add_argument("--device", default="cpu", help="--model's device (the tiny model's check runs on the CPU)")
    ap.add_argument("--dtype", default="float32", help="--model's dtype")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the --model run (the tiny model's: 1)")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--no-controls", action="store_true", help="leave the negative controls out (a decoder part)")
    part.add_argument("--controls-only", action="store_true",
                      help="only the negative controls (no decoder, no --model run): the controls part")
    args = ap.parse_args(argv)
    global PROGRESS
    PROGRESS = True
    out = check_out_path(args.out)
    check_positive_int("--draws", args.draws)
    check_positive_int("--real-draws", args.real_draws)
    check_positive_int("--threads", args.threads)
    if not 1 <= args.prompts <= len(REAL_PROMPTS):
        raise UserError(f"--prompts {args.prompts} is out of range; valid: 1..{len(REAL_PROMPTS)}")
    if args.dtype not in DTYPES:
        raise UserError(f"--dtype {args.dtype!r} is not supported; valid: {', '.join(DTYPES)}")
    if args.model:
        check_device(args.device)
    if args.controls_only and (args.decoders is not None or args.model):
        raise UserError("--controls-only runs no decoder and no --model; valid: drop --decoders and --model, "
                        "or drop --controls-only")
    every = lossless_decoders()
    chosen = every if args.decoders is None else [d.strip() for d in args.decoders.split(",") if d.strip()]
    bad = [d for d in chosen if d not in every]
    if bad or not chosen:
        raise UserError(f"--decoders {args.decoders!r}: {', '.join(bad) or 'none given'} not a registered lossless "
                        f"decoder; valid: {', '.join(every)}")
    if args.controls_only:
        chosen = []
    check_start(out)  # a record under results/ from uncommitted code: refused now, not after hours of draws
    version = code_version()
    record = report(args.draws, chosen, args.model, args.real_draws, args.prompts, args.device, args.dtype,
                    args.threads, version, controls=not args.no_controls)
    write_json(out, record)   # atomic: a killed run leaves no half-written record
    for r in record["decoders"]:
        print(format_row(r))
    for c in record["controls"]:
        print(f"control {c['control']}: G={c['statistic']:.1f} dof={c['dof']} p={c['p_value']:.2e}")
    print(f"wrote {out}; failed: {', '.join(record['failed']) or 'none'}")


def format_row(r: dict) -> str:
    """One row in a line (the test prints the same lines)."""
    head = f"{r['decoder']} [{r.get('config', '-')}]"
    if r["status"] != "tested":
        return f"{head} {r.get('setting', '')}: {r['status']}: {r['reason']}"
    return (f"{head} {r['setting']}: rule={r['rule']} G={r['statistic']:.1f} dof={r['dof']} p={r['p_value']:.3g} "
            f"n={r['samples']} {r['seconds_per_draw'] * 1e3:.0f} ms/draw"
            + ("" if r["same_seed_same_tokens"] else " SAME SEED, OTHER TOKENS"))


if __name__ == "__main__":
    cli_main(main)
