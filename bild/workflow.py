"""Workflow parameters: what the Snakemake rules of ``rules/bild.smk`` pass to the entry points.

The entry points are ``python -m common.draft`` (the embedded profile's small models),
``python -m common.bench`` (one sweep per task and small-model variant: the large model's
``vanilla`` beside ``bild`` at every (alpha_FB, alpha_RB) of the task's grid, interleaved per
prompt, so every latency is normalised within one run) and ``python -m bild.oracle`` (Figure
2's oracle study per task and variant). :class:`RuleParams` turns a profile's
:class:`~bild.config.BildConfig` into their arguments, so the rule file holds rules only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from common.errors import UserError

from .config import BildConfig, TaskConfig


def label(fallback: float, rollback: float) -> str:
    """The bench label of one setting, e.g. ``bild@fb0.5_rb2``."""
    return f"bild@fb{fallback:g}_rb{rollback:g}"


@dataclass(frozen=True)
class RuleParams:
    cfg: BildConfig
    components: str  # the profile's component cache folder (embedded small models live there)

    # rules/bild.smk names the task wildcard ``btask`` (``task`` is constrained to PPD's tasks)
    def task(self, wildcards) -> TaskConfig:
        return self.cfg.task(wildcards.btask)

    def large(self, wildcards) -> str:
        """The large model of a ``{btask}``: the task's fine-tuned checkpoint or the profile's model."""
        return self.task(wildcards).large or self.cfg.model

    LABELS = {"unaligned": "text", "aligned": "greedy"}  # common.draft's hard labels per variant

    def labels(self, wildcards) -> str:
        return self.LABELS[wildcards.variant]

    def train(self, draft: dict) -> dict:
        """The small models' training settings: the draft's (same family, same trainer),
        overridden by the profile's ``bild.train``."""
        return {**draft, **(self.cfg.train or {})}

    def small(self, wildcards) -> str:
        """The small model of a ``{btask}``/``{variant}``: a trained folder or a checkpoint id."""
        t = self.task(wildcards)
        if self.cfg.small_layers is None:
            return t.small[wildcards.variant]
        return f"{self.components}/bild_small_{wildcards.variant}/model"

    def settings(self, wildcards) -> dict[str, dict]:
        """``{label: options}`` of every decoder a sweep runs besides ``vanilla``: BiLD at each
        (alpha_FB, alpha_RB) of the grid; with the aligned small model also Figure 5's ablations
        (no rollback at each alpha_FB; no fallback, handing over every N tokens, at the grid's
        middle alpha_RB); with the unaligned one, speculative decoding on the same small model
        at each window (section 4.2 compares it with unaligned BiLD)."""
        t, small, n = self.task(wildcards), self.small(wildcards), self.cfg.max_small_tokens
        out = {label(f, r): {"small": small, "fallback_threshold": f, "rollback_threshold": r, "max_small_tokens": n}
               for f, r in t.grid()}
        if wildcards.variant == "aligned":
            mid = sorted(t.rollback)[len(t.rollback) // 2]
            out.update({f"bild@fb{f:g}_norb": {"small": small, "fallback_threshold": f, "rollback": False,
                                               "max_small_tokens": n} for f in t.fallback})
            out.update({f"bild@handover{h}_rb{mid:g}": {"small": small, "fallback": False, "rollback_threshold": mid,
                                                       "max_small_tokens": h} for h in self.cfg.handover})
        else:
            out.update({f"speculative@g{g}": {"draft": small, "gamma": g} for g in self.cfg.spec_gamma})
        return out

    def oracle_thresholds(self, wildcards) -> str:
        """``--thresholds`` of ``python -m bild.oracle`` (Figure 2)."""
        return ",".join(f"{t:g}" for t in self._oracle().thresholds)

    def oracle_n(self, wildcards) -> int:
        """Prompts of a task's oracle study: the first of its sweep's."""
        return self._oracle().prompts(self.task(wildcards))

    def _oracle(self):
        if self.cfg.oracle is None:
            raise UserError("the profile's bild section has no oracle: {thresholds: [...]} (Figure 2)")
        return self.cfg.oracle

    def decoders(self, wildcards) -> str:
        return ",".join(["vanilla", *self.settings(wildcards)])

    def decoder_config(self, wildcards) -> str:
        return json.dumps(self.settings(wildcards))
