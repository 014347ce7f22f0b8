"""BiLD's oracle study (section 3.1, Figure 2): how much of the large model does a small model need?

    python -m bild.oracle --large smollm2-135m-instruct --small .cache/components/embedded/bild_small_unaligned/model \
        --dataset sharegpt-summarize --n 20 --max-new-tokens 128 --thresholds 0.1,0.3,0.5 \
        --out results/bild/raw/oracle_summarize_unaligned.jsonl

The small model decodes greedily while the large model scores every step on the same prefix
(teacher-forced: the oracle assumes the large model's prediction is available at every step).
Where the large model's probability of the small model's token, ``p_L(y_small)``, is below the
threshold, the large model's argmax takes its place. A threshold of 0 never engages the large
model (the small model alone); an infinite one always does (the large model's greedy output).

One record per prompt and threshold (both ends always included: ``setting`` ``small`` and
``large``, the rest ``oracle``): the tokens, the text, the reference, ``engaged`` (tokens where
the large model's prediction was taken, ``p_L(y_small) < threshold``) and ``changed`` (those
where it differs from the small model's), and provenance as :mod:`common.harness.bench` records have.

All thresholds of a prompt run in one pass (:func:`oracle_decode`): they share every step until
their choices differ, which only happens where the two models' tokens differ; there the group
of thresholds splits, one side continues on the live caches and the other restarts later from
its prefix (one prefill of each model). Each threshold's tokens are exactly those of its own
separate run (tests compare with a direct recomputation).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from common.checks import ArgumentParser, check_device, check_out_path, check_positive_int
from common.errors import UserError, check_range, cli_main
from common.engine.target import make_target


@dataclass
class _Group:
    """Thresholds that made the same choice at every step so far (ascending ``thresholds``)."""
    thresholds: list[float]
    tokens: list[int] = field(default_factory=list)
    p_small: list[float] = field(default_factory=list)   # p_L(y_small) at each step
    differs: list[bool] = field(default_factory=list)    # large argmax != small argmax at each step


def oracle_decode(large, small, prompt: torch.Tensor, thresholds, max_new_tokens: int,
                  eos=()) -> dict[float, dict]:
    """Decode ``prompt`` once per threshold with the oracle rule, sharing common prefixes.

    At each step, with ``y_s`` the small model's argmax, ``y_l`` the large model's argmax and
    ``p = p_L(y_s)`` on the same prefix, a threshold ``t`` takes ``y_l`` if ``p < t``, else ``y_s``.

    Args:
        large, small: models of the same kind and vocabulary (causal LMs or encoder-decoders).
        prompt: ``[1, S]`` long ids on the models' device.
        thresholds: values >= 0 (``math.inf``: always the large model's token).
        eos: ids that end a sequence (kept).
    Returns:
        ``{t: {"tokens": [T], "engaged": int, "changed": int}}`` per threshold; ``engaged``
        counts steps with ``p < t``, ``changed`` those of them with ``y_l != y_s``.
    """
    L, Sm = make_target(large), make_target(small)
    pending = [_Group(sorted(set(float(t) for t in thresholds)))]
    out: dict[float, dict] = {}

    def done(g: _Group) -> bool:
        return g.tokens[-1] in eos or len(g.tokens) >= max_new_tokens

    def finish(g: _Group) -> None:
        for t in g.thresholds:
            engaged = [p < t for p in g.p_small]
            out[t] = {"tokens": list(g.tokens), "engaged": sum(engaged),
                      "changed": sum(e and d for e, d in zip(engaged, g.differs))}

    with torch.inference_mode():
        while pending:
            g = pending.pop()
            # (Re)start both models on the group's prefix (a fresh cache: the one pass before
            # went down another branch).
            ll, _ = L.start(prompt)
            ls, _ = Sm.start(prompt)
            if g.tokens:
                ll, ls = L.sync(g.tokens), Sm.sync(g.tokens)
            while True:
                ys, yl = int(ls.argmax()), int(ll.argmax())
                p = float(torch.softmax(ll.float(), -1)[ys])
                if yl != ys:
                    take = [t for t in g.thresholds if p < t]     # a suffix of the ascending list
                    keep = g.thresholds[: len(g.thresholds) - len(take)]
                    if take and keep:  # the group splits: ``keep`` restarts later from its prefix
                        other = _Group(keep, g.tokens + [ys], g.p_small + [p], g.differs + [True])
                        if done(other):
                            finish(other)
                        else:
                            pending.append(other)
                        g.thresholds = take
                    tok = yl if take else ys
                else:
                    tok = ys
                g.tokens.append(tok)
                g.p_small.append(p)
                g.differs.append(yl != ys)
                if done(g):
                    break
                step = torch.tensor([[tok]], device=prompt.device)
                ll, ls = L.extend(step)[0][-1], Sm.extend(step)[0][-1]
            finish(g)
    return out


def setting(threshold: float) -> str:
    """The record's ``setting``: ``small`` (never engaged), ``large`` (always) or ``oracle``."""
    return "small" if threshold == 0 else "large" if math.isinf(threshold) else "oracle"


def parse_thresholds(text: str) -> list[float]:
    """``--thresholds`` -> sorted values in (0, 1]; 0 and the large model alone are always added."""
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--thresholds {text!r} must be comma-separated numbers in [0, 1]") from None
    if not vals:
        raise UserError(f"--thresholds {text!r} names no threshold; valid: comma-separated numbers in [0, 1]")
    for v in vals:
        if not 0.0 <= v <= 1.0:
            raise UserError(f"--thresholds value {v!r} is out of range; valid: [0, 1]")
    return sorted(set(vals))


def parse_args(argv=None):
    ap = ArgumentParser(prog="python -m bild.oracle", description=__doc__.splitlines()[0])
    ap.add_argument("--large", required=True, help="the large model (registry name, hub id or folder)")
    ap.add_argument("--small", required=True, help="the small model (same vocabulary and kind)")
    ap.add_argument("--dataset", required=True, help="dataset registry name (with references)")
    ap.add_argument("--n", type=int, default=None, help="first n prompts (default: all)")
    ap.add_argument("--template", default="plain")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", default="1024")
    ap.add_argument("--truncate", default=None, help="left / right / last (common.assets.prompts); default: error")
    ap.add_argument("--thresholds", required=True, help="comma-separated p_L thresholds in [0, 1]")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="adhoc", help="recorded in every record")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true",
                    help="keep each finished prompt in a log under the cache and continue an interrupted run")
    return ap.parse_args(argv)


def validate(a) -> list[float]:
    """Every check that needs no model; returns the thresholds with both ends added."""
    from common.harness.bench import parse_prompt_limit
    from common.errors import unknown
    from common.assets.prompts import TEMPLATES, TRUNCATE

    check_range("max_new_tokens", a.max_new_tokens, 1)
    check_positive_int("n", a.n)
    check_positive_int("threads", a.threads)
    if a.template not in TEMPLATES:
        raise unknown("prompt template", a.template, TEMPLATES)
    if a.truncate is not None and a.truncate not in TRUNCATE:
        raise unknown("--truncate", a.truncate, TRUNCATE)
    a.max_prompt_tokens = parse_prompt_limit(a.max_prompt_tokens)
    check_device(a.device)
    check_out_path(a.out)
    return sorted({0.0, *parse_thresholds(a.thresholds), math.inf})


def main(argv=None) -> None:
    from common.harness.bench import encode_prompts
    from common.assets.data import load_dataset_samples
    from common.decoders.base import eos_ids
    from common.decoders.speculative import resolve_draft
    from common.hardware import code_version, describe
    from common.assets.models import load_model
    from common.records import JsonlWriter, ResumeLog

    a = parse_args(argv)
    thresholds = validate(a)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    samples = load_dataset_samples(a.dataset, n=a.n)
    if not samples:
        raise UserError(f"{a.dataset} has no prompts; valid: a dataset with at least one")
    if any(s.reference is None for s in samples):
        raise UserError(f"{a.dataset} has prompts without a reference; the oracle study scores outputs against them")
    torch.manual_seed(a.seed)  # greedy throughout; seeded all the same
    large, tok = load_model(a.large, dtype=a.dtype, device=a.device, fast=True)
    small = resolve_draft(a.small, large)  # same dtype, device, forward path; vocabulary and kind checked
    prompts = encode_prompts(a, samples, large, tok)
    eos = eos_ids(large, tok)
    meta = {"model": a.large, "small": a.small, "dataset": a.dataset, "profile": a.profile,
            "device": describe(a.device), "code_version": code_version(), "dtype": a.dtype,
            "max_new_tokens": a.max_new_tokens, "seed": a.seed}
    # --resume: every argument that changes a record is the log's identity (a log of other
    # settings is refused, not mixed in); the log goes once the result is complete.
    resume = ResumeLog.for_output(a.out, {k: str(v) for k, v in vars(a).items() if k not in ("out", "resume")}) \
        if a.resume else None
    done = resume.load() if resume else {}
    if done:
        print(f"oracle: resuming {a.out}: {len(done)} of {len(samples)} prompts done ({resume.path})", file=sys.stderr)
    with JsonlWriter(a.out) as w:
        for s, (ids, full) in tqdm(list(zip(samples, prompts)), desc="oracle", unit="prompt", file=sys.stderr):
            if s.question_id in done:
                for rec in done[s.question_id]:
                    w.write(rec)
                continue
            res = oracle_decode(large, small, ids, thresholds, a.max_new_tokens, eos)
            unit = []
            for t in thresholds:
                r = res[t]
                rec = {"question_id": s.question_id, "setting": setting(t),
                       "threshold": None if math.isinf(t) else t, "tokens": r["tokens"],
                       "new_tokens": len(r["tokens"]), "engaged": r["engaged"], "changed": r["changed"],
                       "text": tok.decode(r["tokens"], skip_special_tokens=True), "reference": s.reference,
                       "prompt_tokens": int(ids.shape[1]), **meta}
                if full > ids.shape[1]:
                    rec["prompt_truncated_from"] = full
                w.write(rec)
                unit.append(rec)
            if resume:
                resume.append(s.question_id, unit)
    if resume:
        resume.remove()  # the result is complete and in place


if __name__ == "__main__":
    cli_main(main)
