"""Workflow parameters of ``rules/prompt_decoding.smk``: what its benchmark rule passes to
``python -m common.bench``. One run per dataset: ``vanilla``, Medusa at the profile's tree
sizes (the paper's baseline, heads trained for the same model) and prompt decoding at every
tree size (verified positions per step: candidates plus the prompt tokens they carry), dynamic
sparse trees and the static ones beside them, interleaved per prompt so every ratio is taken
within one run. The rule file holds rules only.
"""
from __future__ import annotations

import json
from typing import Mapping


def settings(bench: Mapping, components: str) -> dict[str, dict]:
    """``{label: options}`` of every decoder of a benchmark run besides ``vanilla``.

    Args:
        bench: the profile's ``prompt_decoding.bench`` section.
        components: the profile's component folder (``.cache/components/<profile>``).
    """
    prompts = f"{components}/prompt_tokens/main"
    out = {f"medusa@t{t}": {"heads": f"{components}/medusa", "tree": t} for t in bench.get("medusa", [])}
    out.update({f"prompt_decoding@t{n}": {"prompt_tokens": prompts, "tree": n} for n in bench["trees"]})
    out.update({f"prompt_decoding@static{n}": {"prompt_tokens": prompts, "tree": n, "shape": "static"}
                for n in bench.get("static", [])})
    return out


def decoders(bench: Mapping, components: str) -> str:
    return ",".join(["vanilla", *settings(bench, components)])


def decoder_config(bench: Mapping, components: str) -> str:
    return json.dumps(settings(bench, components))
