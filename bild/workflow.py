"""Workflow parameters: what the Snakemake rules of ``rules/bild.smk`` pass to the entry points.

The entry points are ``python -m common.components.draft_model`` (the embedded profile's small models),
``python -m bild.exits`` (the early-exit and CALM models' shared exit heads),
``python -m common.harness.bench`` (one sweep per task and small-model variant: the large model's
``vanilla`` beside ``bild`` at every (alpha_FB, alpha_RB) of the task's grid, interleaved per
prompt, so every latency is normalised within one run; one per early-exit task and exit loss:
the trained model's ``vanilla`` beside ``bild`` with ``exit_layer`` or ``calm`` at every
setting) and ``python -m bild.oracle`` (Figure 2's oracle study per task and variant).
:class:`RuleParams` turns a profile's :class:`~bild.config.BildConfig` into their arguments, so the rule file holds rules only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Mapping

from common.errors import UserError
from common.workflow.commands import bench_command

from .config import BildConfig, TaskConfig
from .exits import ExitLoss


def label(fallback: float, rollback: float) -> str:
    """The bench label of one setting, e.g. ``bild@fb0.5_rb2``."""
    return f"bild@fb{fallback:g}_rb{rollback:g}"


def sweep_command(model: str) -> str:
    """The benchmark command of a sweep of one task (``{params.t}``) on ``model`` (a Snakemake
    shell template), prompts cut on the left as the paper's seq2seq tasks are."""
    return bench_command("--dataset {params.t.dataset} --n {params.t.n} --template {params.t.template}",
                         "--max-new-tokens {params.t.max_new_tokens} --max-prompt-tokens {params.b.max_prompt_tokens}",
                         model=model, truncate="left")


def calm_label(threshold: float, tau: float) -> str:
    """The bench label of one CALM setting, e.g. ``calm@l0.9_t4``."""
    return f"calm@l{threshold:g}_t{tau:g}"


@dataclass(frozen=True)
class RuleParams:
    cfg: BildConfig
    components: str  # the profile's component cache folder (embedded small models live there)
    profile_model: str | None = None  # the profile's model (whose teacher cache the components rules build)
    # the aligned variant learns the corpus's greedy answers as text (rule teacher_answers: the
    # paper fine-tunes on the large model's generated outputs) rather than the pass's greedy labels
    answers_as_text: bool = False
    # What the workflow's shared helpers give (rules/common.smk; only the input and teacher
    # methods below read them): what a model needs on disk before it loads (``model_files(name)``),
    # a teacher cache's flags (``teacher_flags(corpus, teacher, heldout=None)``), the components'
    # settings by name (``corpus``, and ``teacher``, ``teacher_text``, ``teacher_answers``: one per
    # cache) and the files the shared teacher cache is built from (``teacher_inputs``).
    model_files: Callable[..., list[str]] | None = None
    teacher_flags: Callable[..., str] | None = None
    teachers: Mapping[str, Mapping | None] = field(default_factory=dict)
    teacher_inputs: Mapping[str, str] = field(default_factory=dict)

    # rules/bild.smk names the task wildcard ``btask`` (``task`` is constrained to PPD's tasks)
    def task(self, wildcards) -> TaskConfig:
        return self.cfg.task(wildcards.btask)

    def large(self, wildcards) -> str:
        """The large model of a ``{btask}``: the task's fine-tuned checkpoint or the profile's model."""
        return self.task(wildcards).large or self.cfg.model

    LABELS = {"unaligned": "text", "aligned": "greedy"}  # common.components.draft_model's hard labels per variant, on a pass

    def variant_labels(self, variant: str) -> str:
        """common.components.draft_model's hard labels for a small model of ``variant``: text where it learns a text
        set (the references; the corpus's answers with ``answers_as_text``), else :attr:`LABELS`."""
        return "text" if self.answers_as_text and variant == "aligned" else self.LABELS[variant]

    def labels(self, wildcards) -> str:
        return self.variant_labels(wildcards.variant)

    def teacher(self, variant: str) -> tuple[str, str]:
        """``(cache, flags)`` of a small model of ``variant``: the reference text for the unaligned
        one (rule teacher_text), the corpus's answers as text for the aligned one where the
        profile sets components.teacher_answers (rule teacher_answers), the shared cache otherwise."""
        if variant == "aligned" and self.answers_as_text:
            name = "teacher_answers"
        else:
            name = "teacher_text" if self.LABELS[variant] == "text" else "teacher"
        return f"{self.components}/{name}.pt", self.teacher_flags(self.teachers["corpus"], self.teachers[name])

    def small_teacher_cache(self, wildcards) -> str:
        return self.teacher(wildcards.variant)[0]

    def small_teacher_flags(self, wildcards) -> str:
        return self.teacher(wildcards.variant)[1]

    def sweep_inputs(self, wildcards) -> list[str]:
        """A sweep's large model and, where the profile trains them (``small_layers``), the
        trained small model of the variant."""
        small = ([] if self.cfg.small_layers is None
                 else [f"{self.components}/bild_small_{wildcards.variant}/model/config.json"])
        return [*self.model_files(self.large(wildcards)), *small]

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

    def rollback_rule(self) -> dict:
        """``{"rollback_rule": ...}`` where the profile pins one (``bild.rollback_rule``), else
        nothing: the decoder's default, the paper's rule."""
        return {"rollback_rule": self.cfg.rollback_rule} if self.cfg.rollback_rule else {}

    def settings(self, wildcards) -> dict[str, dict]:
        """``{label: options}`` of every decoder a sweep runs besides ``vanilla``: BiLD at each
        (alpha_FB, alpha_RB) of the grid; with the aligned small model also Figure 5's ablations
        (no rollback at each alpha_FB; no fallback, handing over every N tokens, at the grid's
        middle alpha_RB); with the unaligned one, speculative decoding on the same small model
        at each window, greedy and sampled at temperature 1 (section 4.2 compares it with
        unaligned BiLD)."""
        t, small, n = self.task(wildcards), self.small(wildcards), self.cfg.max_small_tokens
        out = {label(f, r): {"small": small, "fallback_threshold": f, "rollback_threshold": r, "max_small_tokens": n,
                             **self.rollback_rule()} for f, r in t.grid()}
        if wildcards.variant == "aligned":
            mid = sorted(t.rollback)[len(t.rollback) // 2]
            out.update({f"bild@fb{f:g}_norb": {"small": small, "fallback_threshold": f, "rollback": False,
                                               "max_small_tokens": n} for f in t.fallback})
            out.update({f"bild@handover{h}_rb{mid:g}": {"small": small, "fallback": False, "rollback_threshold": mid,
                                                       "max_small_tokens": h, **self.rollback_rule()}
                        for h in self.cfg.handover})
        else:
            # greedy (the large model's tokens exactly) and sampled at temperature 1 (the paper's
            # speculative sampling: its BLEU of 39.93 on IWSLT is not the greedy large model's 40.32)
            out.update({f"speculative@g{g}": {"draft": small, "gamma": g} for g in self.cfg.spec_gamma})
            out.update({f"speculative@g{g}_t1": {"draft": small, "gamma": g, "temperature": 1.0, "seed": 0}
                        for g in self.cfg.spec_gamma})
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

    # -- early exit (Figure 6) and CALM (Figure 7); the exit loss wildcard is ``exitloss`` --------
    def exit_dir(self, wildcards) -> str:
        """The trained exit model's folder (its ``model/`` is what the sweeps load)."""
        return f"{self.components}/bild_exit_{wildcards.exitloss}"

    def exit_model(self, wildcards) -> str:
        return f"{self.exit_dir(wildcards)}/model"

    def exit_shares_teacher(self) -> bool:
        """Whether the exit model is the profile's model, so its teacher cache is the shared one."""
        return self.cfg.early_exit.model == self.profile_model

    def exit_teacher(self, wildcards) -> dict[str, str]:
        """``{teacher, corpus}`` caches of the exit training: the components' shared ones when the
        model is the profile's, else the trainer's own (built by it, in its folder)."""
        if self.exit_shares_teacher():
            return {"teacher": f"{self.components}/teacher.pt", "corpus": f"{self.components}/corpus.pt"}
        return {"teacher": f"{self.exit_dir(wildcards)}/teacher.pt", "corpus": f"{self.exit_dir(wildcards)}/corpus.pt"}

    def exit_inputs(self, wildcards) -> dict:
        """An exit training's model and, when it is the profile's model, the shared teacher and
        its corpus (otherwise the trainer builds its own caches)."""
        shared = ({"teacher": self.exit_teacher(wildcards)["teacher"], **self.teacher_inputs}
                  if self.exit_shares_teacher() else {})
        return {"model": self.model_files(self.cfg.early_exit.model), **shared}

    def exit_teacher_flags(self, wildcards) -> str:
        """The exit training's teacher flags: the shared cache's when it trains the profile's
        model, else ShareGPT text with its own held-out corpus cache."""
        corpus, teacher = self.teachers["corpus"], self.teachers["teacher"]
        if self.exit_shares_teacher():
            return self.teacher_flags(corpus, teacher)
        return self.teacher_flags(corpus, {**teacher, "source": "sharegpt"}, self.exit_teacher(wildcards)["corpus"])

    def exit_train_flags(self, wildcards) -> str:
        """``python -m bild.exits`` flags of one loss's training (its own settings and stopping)."""
        ee, loss = self.cfg.early_exit, wildcards.exitloss
        t = ee.train[loss]
        flags = [f"--loss {loss}", f"--labels {t['labels']}",
                 f"--lr {t['lr']}", f"--batch-size {t['batch_size']}", f"--max-epochs {t['max_epochs']}",
                 f"--eval-every {t['eval_every']}", f"--patience {t['patience']}", f"--min-delta {t['min_delta']}"]
        if ExitLoss.parse(loss) is ExitLoss.BILD:
            flags.append(f"--exit-layer {ee.exit_layer}")
        if t.get("per_sequence"):
            flags.append(f"--per-sequence {t['per_sequence']}")
        if t.get("eval_positions"):
            flags.append(f"--eval-positions {t['eval_positions']}")
        if t.get("wall_budget_s"):
            flags.append(f"--wall-budget {t['wall_budget_s']}")
        return " ".join(flags)

    def exit_settings(self, wildcards) -> dict[str, dict]:
        """``{label: options}`` of an exit sweep besides ``vanilla`` (the trained model alone, the
        paper's fine-tuned reference): early-exit BiLD at every (alpha_FB, alpha_RB), or CALM at
        every (lambda, tau)."""
        ee = self.cfg.early_exit
        if ExitLoss.parse(wildcards.exitloss) is ExitLoss.BILD:
            return {label(f, r): {"exit_layer": ee.exit_layer, "fallback_threshold": f, "rollback_threshold": r,
                                  "max_small_tokens": self.cfg.max_small_tokens, **self.rollback_rule()}
                    for f, r in ee.grid()}
        return {calm_label(lam, tau): {"threshold": lam, "tau": tau, "min_exit": ee.calm_min_exit}
                for lam, tau in ee.calm_grid()}

    def exit_decoders(self, wildcards) -> str:
        return ",".join(["vanilla", *self.exit_settings(wildcards)])

    def exit_decoder_config(self, wildcards) -> str:
        return json.dumps(self.exit_settings(wildcards))

    # -- beyond the paper: the reduced-vocabulary small model (cfg.reduced_vocab) ----------------
    def reduced_dir(self) -> str:
        """The reduced small model's checkpoint folder (:mod:`common.components.reduced_vocab`)."""
        rv = self.cfg.reduced_vocab
        return f"{self.components}/bild_reduced_{rv.variant}_v{rv.keep}/model"

    def reduced_source(self) -> str:
        """The trained small model whose head is reduced."""
        return f"{self.components}/bild_small_{self.cfg.reduced_vocab.variant}/model"

    def reduced_labels(self) -> str:
        return self.variant_labels(self.cfg.reduced_vocab.variant)

    def compact_dir(self) -> str | None:
        """The compact small model's folder (``compact_layers`` layers trained with the reduced
        head), or None when the profile has none."""
        rv = self.cfg.reduced_vocab
        if rv is None or rv.compact_layers is None:
            return None
        return f"{self.components}/bild_compact_{rv.variant}_l{rv.compact_layers}_v{rv.keep}/model"

    def compact_suffix(self) -> str | None:
        """The label suffix of the compact model's settings in the reduced sweep (``_l2v8192``)."""
        rv = self.cfg.reduced_vocab
        return None if self.compact_dir() is None else f"_l{rv.compact_layers}v{rv.keep}"

    def reduced_settings(self) -> dict[str, dict]:
        """``{label: options}`` of the reduced-vocabulary sweep besides ``vanilla``: BiLD with the
        variant's full small model, with its reduced one (label suffix ``_v<keep>``) and with the
        compact one where configured (``_l<layers>v<keep>``) at every (alpha_FB, alpha_RB) of the
        task's grid, so all are normalised to one vanilla run."""
        rv, n = self.cfg.reduced_vocab, self.cfg.max_small_tokens
        out = {}
        smalls = [("", self.reduced_source()), (f"_v{rv.keep}", self.reduced_dir())]
        if self.compact_dir() is not None:
            smalls.append((self.compact_suffix(), self.compact_dir()))
        for suffix, small in smalls:
            out.update({label(f, r) + suffix: {"small": small, "fallback_threshold": f, "rollback_threshold": r,
                                               "max_small_tokens": n, **self.rollback_rule()}
                        for f, r in self.cfg.task(rv.task).grid()})
        return out

    def reduced_decoders(self, wildcards=None) -> str:
        return ",".join(["vanilla", *self.reduced_settings()])

    def reduced_decoder_config(self, wildcards=None) -> str:
        return json.dumps(self.reduced_settings())
