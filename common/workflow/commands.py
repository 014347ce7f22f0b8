"""Command lines and flags several rules share, written once: the benchmark command of every
timing rule (:func:`bench_command`) and the trainers' flags built from a recipe of the config
(:func:`stopping_flags`, :func:`head_train_flags`, :func:`eagle_flags`).

A command is a Snakemake shell template: ``{params.x}``, ``{wildcards.x}``, ``{input}``,
``{output}`` and ``{log}`` are filled per job, so a rule passes the params its template names.
"""
from __future__ import annotations

from typing import Mapping


def bench_command(data: str, limits: str, model: str = "{params.p.model}", truncate: str = "",
                  aa: bool = False) -> str:
    """``python -m common.harness.bench`` of one timing rule (decoders ``{params.decoders}``,
    their options ``{params.dcfg}``, the profile ``{params.p}``), resumable, logged.

    ``data`` names the prompts and their count (``--dataset ... --n ...`` or ``--prompts ...
    --n ...``, a template after them), ``limits`` the ``--max-new-tokens`` and
    ``--max-prompt-tokens``; ``truncate`` (``left``, ``last``) where prompts are cut; ``aa`` adds
    the A/A pair (``vanilla@aa``)."""
    return ("{params.env} {params.py} -m common.harness.bench --model " + model + " --decoders {params.decoders}"
            f" {data} {limits}" + (f" --truncate {truncate}" if truncate else "") +
            " --dtype {params.p.dtype} --device {params.p.device} --threads {params.p.threads}"
            " --profile {params.p.name}" + (" --aa" if aa else "") +
            " --decoder-config '{params.dcfg}' --resume --out {output} > {log} 2>&1")


def section_bench_command(wildcard: str, aa: bool = False) -> str:
    """:func:`bench_command` of a section's benchmark of one dataset (the ``wildcard``): its
    prompts ``{params.n}`` and lengths ``{params.b}`` (the section's ``bench`` or ``spec``)."""
    return bench_command(f"--dataset {{wildcards.{wildcard}}} --n {{params.n}}",
                         "--max-new-tokens {params.b[max_new_tokens]} --max-prompt-tokens {params.b[max_prompt_tokens]}",
                         aa=aa)


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
