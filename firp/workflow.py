"""Workflow parameters: what the Snakemake rules of ``rules/firp.smk`` pass to the entry points.

The entry points are ``python -m firp.train`` (one training of the K affine maps per variant of
config ``firp.variants``: ``main``, what decoding uses, and the layer sweeps of Figures 5-7),
``python -m firp.exit_heads`` (Figure 3's early-exit baseline), ``python -m firp.accuracy``
(Figure 3's scoring) and ``python -m common.harness.bench`` (the section's benchmark).
:class:`RuleParams` turns the profile's ``firp`` section into their arguments; the wildcard of a
variant is ``firpv``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from common.workflow.commands import stopping_flags


def layer_flags(c: Mapping) -> str:
    """``--layers a,b,c`` when a training config ``c`` fixes them (none: the paper's fractions
    of depth), and ``--mask-earlier`` for a masked one (Figure 7)."""
    flags = [f"--layers {','.join(map(str, c['layers']))}"] if c.get("layers") else []
    return " ".join(flags + (["--mask-earlier"] if c.get("mask_earlier") else []))


@dataclass(frozen=True)
class RuleParams:
    section: Mapping  # the profile's firp section (``profile.raw["firp"]``)

    def config(self, variant: str) -> dict:
        """The training settings of ``variant``: ``train`` with the variant's overrides."""
        return {**self.section["train"], **self.section["variants"][variant]}

    def train_config(self, wildcards) -> dict:
        return self.config(wildcards.firpv)

    def stopping_flags(self, wildcards) -> str:
        return stopping_flags(self.train_config(wildcards))

    def layer_flags(self, wildcards) -> str:
        return layer_flags(self.train_config(wildcards))

    def mode_flags(self, wildcards) -> str:
        """``--mode joint`` where the config pins the joint training (the committed maps); nothing
        for the default, the paper's separate training (firp/train.py)."""
        mode = self.train_config(wildcards).get("mode", "separate")
        return "" if mode == "separate" else f"--mode {mode}"

    def exit_flags(self) -> str:
        """The early-exit heads' steps and input layers: the main maps' (``--steps-k K [--layers ...]``)."""
        c = self.config("main")
        return f"--steps-k {c['steps_k']}" + (f" --layers {','.join(map(str, c['layers']))}" if c.get("layers") else "")

    @staticmethod
    def early_folder(wildcards, input) -> str:
        """The early-exit heads' folder, read from the rule's input ``early`` (their checkpoint)."""
        return str(Path(input.early).parent)

    @staticmethod
    def medusa_flags(wildcards, input) -> str:
        """``--medusa`` once per Medusa component the Figure 3 scoring reads (shared head; own heads)."""
        return " ".join(f"--medusa {Path(input[k]).parent}" for k in ("medusa", "medusa_own") if k in input.keys())
