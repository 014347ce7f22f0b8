"""Workflow parameters: what the Snakemake rules of ``rules/ppd_pipelined.smk`` pass to the entry points.

The entry points themselves are ``python -m ppd_pipelined.templates`` (Table 1's prompts),
``python -m ppd_pipelined.heads`` (intermediate heads), ``python -m ppd_pipelined.matchrate``
(p_correct runs) and ``python -m common.harness.bench`` (Table 3). :class:`RuleParams` turns one
profile's :class:`~ppd_pipelined.config.PPDConfig` into their arguments, so the rule file holds
rules only (no functions, no lambdas); the model checkpoint a rule needs comes from
``model_files`` in rules/common.smk.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config import PPDConfig, TaskConfig


@dataclass(frozen=True)
class RuleParams:
    cfg: PPDConfig

    def task(self, wildcards) -> TaskConfig:
        """The task's settings (dataset, template, n, max_new_tokens) for a ``{task}`` wildcard."""
        return self.cfg.task(wildcards.task)

    @property
    def layers(self) -> str:
        return ",".join(map(str, self.cfg.layers))

    @property
    def classifiers(self) -> str:
        return ",".join(self.cfg.classifiers)

    @property
    def heads_config(self) -> str:
        """Table 4's recipe of this profile as JSON (HeadsConfig fields)."""
        return json.dumps(dict(self.cfg.raw["heads"]))

    @property
    def eval_datasets(self) -> str:
        """Evaluation sets kept out of the heads' training data."""
        return ",".join(sorted({t.dataset for t in self.cfg.tasks.values()}))

    @property
    def bench_decoders(self) -> str:
        return ",".join(["vanilla", *(f"ppd_pipelined@k{k}" for k in self.cfg.table3.ks)])

    @property
    def bench_config(self) -> str:
        """Options per decoder label: k sub-workers, exit layer, backend; the model's own LM head."""
        t3 = self.cfg.table3
        return json.dumps({f"ppd_pipelined@k{k}": {"k": k, "backend": t3.backend,
                                                   **({"exit_layer": t3.exit_layer} if t3.exit_layer else {})}
                           for k in t3.ks})

    @staticmethod
    def heads_dir(wildcards, output) -> str:
        """The heads' folder, read from the checkpoint path (rule ppdp_train_heads)."""
        return str(Path(output.heads).parent)
