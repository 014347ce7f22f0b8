"""Workflow parameters: what the Snakemake rules of ``rules/prompt_decoding.smk`` pass to the entry points.

The entry points are ``python -m common.training.selfdistill`` (a variant's base model's own
greedy answers), ``python -m prompt_decoding.train`` (one training per variant of config
``prompt_decoding.variants``) and ``python -m common.harness.bench`` (the section's benchmark;
pd.spec's, whose drafter is variant ``draft``'s base). :class:`RuleParams` turns the profile's
``prompt_decoding`` section into their arguments; the wildcard of a variant is ``pdv``, of a
pd.spec dataset ``pdspec``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Mapping

from common.errors import UserError
from common.workflow.commands import stopping_flags

SPEC_VARIANT = "draft"  # pd.spec's prompt tokens: the variant whose base is the draft


@dataclass(frozen=True)
class RuleParams:
    section: Mapping  # the profile's prompt_decoding section (``profile.raw["prompt_decoding"]``)
    model: str  # the profile's model
    components: str  # the profile's component cache folder (.cache/components/<profile>)
    # what a model (default: the profile's) needs on disk before it loads (rules/common.smk's model_files)
    model_files: Callable[..., list[str]]
    # the in-forward trainers' shared data files (rules/common.smk's seq_inputs(): name -> path)
    corpora: Mapping[str, str] = field(default_factory=dict)
    profile: str = ""  # the profile's name, for error lines

    def config(self, variant: str) -> dict:
        """The training settings of ``variant``: ``train`` with the variant's overrides."""
        return {**self.section["train"], **self.section["variants"][variant]}

    def train_config(self, wildcards) -> dict:
        return self.config(wildcards.pdv)

    def stopping_flags(self, wildcards) -> str:
        return stopping_flags(self.train_config(wildcards))

    def base(self, variant: str) -> str:
        """The model a variant trains on (its ``base``): the profile's model by default, the
        distilled draft (rule distill_draft) for ``draft``, else the model name or hub id given."""
        base = self.config(variant).get("base")
        if base is None:
            return self.model
        return f"{self.components}/draft/model" if base == "draft" else base

    def base_files(self, variant: str) -> list[str]:
        """What a variant's base model needs on disk before it loads (none for a hub model)."""
        base = self.config(variant).get("base")
        return [f"{self.components}/draft/model/config.json"] if base == "draft" else self.model_files(base)

    def train_model(self, wildcards) -> str:
        return self.base(wildcards.pdv)

    def base_corpora_inputs(self, wildcards) -> list[str]:
        return self.base_files(wildcards.pdv)

    def train_inputs(self, wildcards) -> dict:
        """The corpora (for a variant with a ``base``, that model's own greedy answers, rule
        pd_base_corpora, and the model itself), and the finished training a variant with
        ``init_from`` starts from."""
        c = self.train_config(wildcards)
        if c.get("base"):
            own = f"{self.components}/prompt_tokens/{wildcards.pdv}"
            ins = {"corpus": f"{own}/corpus.pt", "seqcorpus": f"{own}/seqcorpus.pt",
                   "base": self.base_files(wildcards.pdv)}
        else:
            ins = dict(self.corpora)
        if c.get("init_from"):
            ins["init"] = f"{self.components}/prompt_tokens/{c['init_from']}/prompts.pt"
        return ins

    def variant_flags(self, wildcards) -> str:
        """A variant's appendix options (prompt_decoding.train's flags), only where they differ
        from the paper's method."""
        c = self.train_config(wildcards)
        flags = [] if c.get("distill", True) else ["--no-distill"]
        if c.get("aggregation", "average") != "average":
            flags.append(f"--aggregation {c['aggregation']}")
        if c.get("head"):
            flags.append("--head")
        if c.get("prefix"):
            flags.append(f"--prefix {c['prefix']}")
        if c.get("exits", 1) != 1:
            flags.append(f"--exits {c['exits']}")
        if c.get("init_from"):
            flags.append(f"--init-from {self.train_inputs(wildcards)['init']}")
        return " ".join(flags)

    # -- pd.spec (section 5.3) --------------------------------------------------------------------
    def spec_options(self) -> dict[str, dict]:
        """pd.spec's benchmark: ``{label: options}``, ``speculative@g<gamma>`` and
        ``pd_speculative@g<gamma>`` (config prompt_decoding.spec), both drafting with the base of
        variant ``draft`` (pd_speculative with that variant's prompt tokens); vanilla has none.
        UserError when the profile has no such variant."""
        if not (self.section["variants"].get(SPEC_VARIANT) or {}).get("base"):
            raise UserError(f"config profiles/{self.profile}/prompt_decoding/variants: pd.spec needs a variant "
                            f"{SPEC_VARIANT!r} with a base (its draft), e.g. {SPEC_VARIANT}: {{base: draft}}")
        spec, draft = self.section["spec"], self.base(SPEC_VARIANT)
        opts = {f"speculative@g{g}": {"draft": draft, "gamma": g} for g in spec["gamma"]}
        tokens = f"{self.components}/prompt_tokens/{SPEC_VARIANT}"
        opts.update({f"pd_speculative@g{g}": {"draft": draft, "prompt_tokens": tokens, "gamma": g, "tree": spec["tree"]}
                     for g in spec["pd_gamma"]})
        return opts

    def spec_inputs(self) -> list[str]:
        """The model, the draft and the draft's prompt tokens."""
        return [*self.model_files(), *self.base_files(SPEC_VARIANT),
                f"{self.components}/prompt_tokens/{SPEC_VARIANT}/prompts.pt"]

    def spec_decoders(self) -> str:
        return ",".join(["vanilla", *self.spec_options()])

    def spec_config(self) -> str:
        return json.dumps(self.spec_options())

    def spec_prompts(self, wildcards) -> int:
        return self.section["spec"]["datasets"][wildcards.pdspec]
