"""Command lines and flags several rules share, written once: the benchmark command of every
timing rule (:func:`bench_command`), the teacher cache's (:func:`teacher_command`), the small
answer sets' (:func:`answer_set_command`) and the trainers' flags built from a recipe of the
config (:func:`stopping_flags`, :func:`head_train_flags`, :func:`eagle_flags`, :func:`eagle3_flags`,
:func:`corpus_flags`).

A command is a Snakemake shell template: ``{params.x}``, ``{wildcards.x}``, ``{input}``,
``{output}`` and ``{log}`` are filled per job, so a rule passes the params its template names.
"""
from __future__ import annotations

from typing import Mapping


def bench_command(data: str, limits: str, model: str = "{params.p.model}", truncate: str = "",
                  aa: bool = False, extra: str = "") -> str:
    """``python -m common.harness.bench`` of one timing rule (decoders ``{params.decoders}``,
    their options ``{params.dcfg}``, the profile ``{params.p}``), resumable, logged.

    ``data`` names the prompts and their count (``--dataset ... --n ...`` or ``--prompts ...
    --n ...``, a template after them), ``limits`` the ``--max-new-tokens`` and
    ``--max-prompt-tokens``; ``truncate`` (``left``, ``last``) where prompts are cut; ``aa`` adds
    the A/A pair (``vanilla@aa``); ``extra``: more flags (a template, e.g. ``{params.sampling}``)."""
    return ("{params.env} {params.py} -m common.harness.bench --model " + model + " --decoders {params.decoders}"
            f" {data} {limits}" + (f" --truncate {truncate}" if truncate else "") + (f" {extra}" if extra else "") +
            " --dtype {params.p.dtype} --device {params.p.device} --threads {params.p.threads}"
            " --profile {params.p.name}" + (" --aa" if aa else "") +
            " --decoder-config '{params.dcfg}' --resume --out {output} > {log} 2>&1")


def section_bench_command(wildcard: str, aa: bool = False, sampled: bool = False) -> str:
    """:func:`bench_command` of a section's benchmark of one dataset (the ``wildcard``): its
    prompts ``{params.n}`` and lengths ``{params.b}`` (the section's ``bench`` or ``spec``);
    ``sampled``: its sampling flags ``{params.sampling}`` (:func:`sampling_flags`)."""
    return bench_command(f"--dataset {{wildcards.{wildcard}}} --n {{params.n}}",
                         "--max-new-tokens {params.b[max_new_tokens]} --max-prompt-tokens {params.b[max_prompt_tokens]}",
                         aa=aa, extra="{params.sampling}" if sampled else "")


def sampling_flags(bench: Mapping) -> str:
    """The benchmark's sampling flags from a section benchmark's ``sampling`` entry (none: greedy):
    ``temperature`` or ``category_temperatures``, ``acceptance``, ``top_p``, ``top_k``, ``seed``."""
    s = bench.get("sampling") or {}
    return " ".join(f"--{k.replace('_', '-')} {s[k]}" for k in
                    ("temperature", "category_temperatures", "acceptance", "top_p", "top_k", "seed") if k in s)


def teacher_command() -> str:
    """``python -m common.training.teacher`` of a teacher-cache rule (the profile's model
    ``{params.m}``, the cache's flags ``{params.flags}``, outputs ``cache`` and ``stats``), logged."""
    return ("{params.env} {params.py} -m common.training.teacher --model {params.m} --teacher {output.cache}"
            " {params.flags} --stats-out {output.stats} --device {params.dev} --threads {params.t} > {log} 2>&1")


def answer_set_command(out: str, prompts: str, skip: str = "", max_prompt_tokens: str = "", log: bool = True) -> str:
    """``python -m common.training.corpus answers`` of a rule: model ``{params.m}``'s greedy answers
    (``{params.c[answer_tokens]}`` tokens each) to ``prompts`` ShareGPT first turns after the
    first ``skip``, cached in ``out``; ``max_prompt_tokens`` cuts the prompts. Each argument is a
    template (``{output}``, ``{params.c[prompts]}``); ``log=False`` leaves the redirection to the
    caller (a rule chaining two sets into one log)."""
    return ("{params.env} {params.py} -m common.training.corpus answers --model {params.m}"
            f" --out {out} --prompts {prompts}" + (f" --skip {skip}" if skip else "") +
            (f" --max-prompt-tokens {max_prompt_tokens}" if max_prompt_tokens else "") +
            " --answer-tokens {params.c[answer_tokens]} --device {params.dev} --threads {params.t}" +
            (" > {log} 2>&1" if log else ""))


def stopping_flags(c: Mapping) -> str:
    """The early-stopping flags of a component's config (common.training.loop.Stopping)."""
    flags = f"--max-epochs {c['max_epochs']} --eval-every {c['eval_every']} --patience {c['patience']}" \
            f" --min-delta {c['min_delta']}"
    flags += f" --wall-budget {c['wall_budget_s']}" if c.get("wall_budget_s") else ""
    # a step cap also sets the length of the learning-rate schedule (common.training.loop)
    return flags + (f" --max-steps {c['max_steps']}" if c.get("max_steps") else "")


def head_train_flags(h: Mapping) -> str:
    """``common.components.medusa_heads`` trainer flags of a head recipe (components.medusa, or a
    section's override of it)."""
    share = " --share-lm-head" if h.get("share_lm_head") else ""
    return (f"--heads {h['heads']}{share} --labels {h['labels']} --train-vocab {h['train_vocab']} {stopping_flags(h)}"
            f" --lr {h['lr']} --batch-size {h['batch_size']}")


def eagle_flags(c: Mapping) -> str:
    """``common.components.eagle_head`` flags of the profile's recipe (components.eagle)."""
    flags = [stopping_flags(c), f"--lr {c['lr']} --batch-size {c['batch_size']}",
             f"--head-max-len {c['max_len']}", f"--noise {c['noise']}"]
    return " ".join(flags)


def eagle3_flags(c: Mapping) -> str:
    """``common.components.eagle3_head`` flags of the profile's recipe (components.eagle3): the
    stopping flags, the optimizer, the training-time test and the draft vocabulary; ``layers``
    ``corpus_tokens`` and ``precision`` only where set (null or absent: the trainer's defaults, the
    code's layers, the whole corpus, float32)."""
    flags = [stopping_flags(c), f"--lr {c['lr']} --batch-size {c['batch_size']}", f"--head-max-len {c['max_len']}",
             f"--ttt-steps {c['ttt_steps']} --step-decay {c['step_decay']} --draft-vocab {c['draft_vocab']}"]
    if c.get("layers"):
        flags.append("--layers " + ",".join(str(l) for l in c["layers"]))
    if c.get("corpus_tokens"):
        flags.append(f"--corpus-tokens {c['corpus_tokens']}")
    if c.get("precision"):
        flags.append(f"--precision {c['precision']}")
    return " ".join(flags)


def corpus_command() -> str:
    """``python -m common.training.corpus`` of a sharded corpus rule (corpus_shards, corpus_turns):
    the recipe's flags ``{params.flags}`` (:func:`corpus_flags`), the folder ``{params.out}``, the
    summary ``{output.stats}``; resumable by shard."""
    return ("{params.env} {params.py} -m common.training.corpus --model {params.m} --out {params.out} {params.flags}"
            " --stats-out {output.stats} --device {params.dev} --threads {params.t} > {log} 2>&1")


def corpus_flags(c: Mapping) -> str:
    """``common.training.corpus`` flags of a sharded corpus's recipe (``components.corpus_shards`` or
    ``components.corpus_turns``); ``dataset`` and ``heldout_answer_tokens`` only where set (the
    builder's defaults: ShareGPT first turns, the held-out answers as long as the others)."""
    flags = [f"--tokens {c['tokens']} --heldout {c['heldout']} --shard-prompts {c['shard_prompts']}",
             f"--answer-tokens {c['answer_tokens']} --max-prompt-tokens {c['max_prompt_tokens']}",
             f"--batch-size {c['batch_size']} --gen-dtype {c['gen_dtype']}"]
    if c.get("dataset"):
        flags.append(f"--dataset {c['dataset']}")
    if c.get("heldout_answer_tokens"):
        flags.append(f"--heldout-answer-tokens {c['heldout_answer_tokens']}")
    return " ".join(flags)
