"""BiLD's experiment settings: the profile's ``bild:`` section as frozen dataclasses.

One config path (house style): ``config/config.yaml`` -> schema validation
(:func:`common.config.load_profile`) -> :func:`from_profile` here -> rule params / CLIs.

Small models: in the embedded profile the large model's first ``small_layers`` layers + final
norm + head (the draft family of :mod:`common.components.draft_model`), trained twice (``unaligned``: on
ShareGPT's reference replies, as the paper fine-tunes its small models on the task's
references; ``aligned``: on the large model's own greedy outputs, the paper's prediction
alignment, section 3.5.1). In the paper profile, the paper's released checkpoints per task.

Early exit (``early_exit``, Figures 6 and 7): a causal model whose shared exit head is trained
twice on its frozen trunk (:mod:`bild.exits`: BiLD's averaged loss, CALM's weighted one), swept
on some of the tasks with ``bild`` at ``exit_layer`` and with ``calm``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from common.config import section
from common.errors import UserError, check_range

VARIANTS = ("unaligned", "aligned")
METRICS = ("bleu", "rouge_l")


def _threshold_list(name: str, values, lo: float, hi: float | None) -> tuple[float, ...]:
    if not values:
        raise UserError(f"{name} must list at least one threshold")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or (hi is not None and v > hi):
            raise UserError(f"{name} value {v!r} is out of range; valid: [{lo}, {hi if hi is not None else 'inf'})")
        out.append(float(v))
    if len(set(out)) != len(out):
        raise UserError(f"{name} {list(values)} repeats a value")
    return tuple(out)


@dataclass(frozen=True)
class TaskConfig:
    """One evaluation task: a dataset with references, its metric and the threshold grid."""
    name: str
    dataset: str
    n: int
    max_new_tokens: int
    metric: str
    fallback: tuple[float, ...]   # alpha_FB grid, each in [0, 1]
    rollback: tuple[float, ...]   # alpha_RB grid (nats), each >= 0
    template: str = "plain"       # prompt template (common.assets.prompts.TEMPLATES), e.g. T5's "summarize: "
    large: str | None = None      # paper profile: the task's fine-tuned large model
    small: Mapping[str, str] | None = None  # paper profile: {variant: checkpoint}

    def __post_init__(self):
        check_range(f"bild.tasks.{self.name}.n", self.n, 1)
        check_range(f"bild.tasks.{self.name}.max_new_tokens", self.max_new_tokens, 1)
        if self.metric not in METRICS:
            raise UserError(f"bild.tasks.{self.name}.metric {self.metric!r} is unknown; valid: {', '.join(METRICS)}")
        object.__setattr__(self, "fallback", _threshold_list(f"bild.tasks.{self.name}.fallback", self.fallback, 0.0, 1.0))
        object.__setattr__(self, "rollback", _threshold_list(f"bild.tasks.{self.name}.rollback", self.rollback, 0.0, None))

    def grid(self) -> list[tuple[float, float]]:
        """Every (alpha_FB, alpha_RB) setting of the sweep."""
        return [(f, r) for f in self.fallback for r in self.rollback]


EXIT_LOSSES = ("bild", "calm")   # the exit-head trainings (bild.exits): BiLD's early exit, CALM
EXIT_TRAIN_KEYS = ("labels", "per_sequence", "eval_positions", "lr", "batch_size", "max_epochs", "eval_every",
                   "patience", "min_delta", "wall_budget_s")


@dataclass(frozen=True)
class EarlyExitConfig:
    """Figure 6 (BiLD with the large model's first ``exit_layer`` layers as its small model) and
    Figure 7 (CALM on the same model family): one model per loss (``bild``, ``calm``), its
    shared exit head trained on the frozen trunk, swept on ``tasks`` (names of ``bild.tasks``)."""
    model: str
    exit_layer: int
    tasks: tuple[str, ...]
    fallback: tuple[float, ...]
    rollback: tuple[float, ...]
    calm_threshold: tuple[float, ...]
    calm_tau: tuple[float, ...]
    train: Mapping[str, Mapping]     # {loss: trainer settings}
    calm_min_exit: int = 1

    def __post_init__(self):
        check_range("bild.early_exit.exit_layer", self.exit_layer, 1)
        check_range("bild.early_exit.calm.min_exit", self.calm_min_exit, 1)
        if not self.tasks:
            raise UserError("bild.early_exit.tasks must name at least one bild task")
        for name, lo, hi in (("fallback", 0.0, 1.0), ("rollback", 0.0, None), ("calm_threshold", 0.0, 1.0),
                             ("calm_tau", 0.0, None)):
            object.__setattr__(self, name, _threshold_list(f"bild.early_exit.{name.replace('_', '.')}",
                                                           getattr(self, name), lo, hi))
        if set(self.train) != set(EXIT_LOSSES):
            raise UserError(f"bild.early_exit.train must hold exactly {', '.join(EXIT_LOSSES)}")
        for loss, t in self.train.items():
            bad = sorted(set(t) - set(EXIT_TRAIN_KEYS))
            if bad:
                raise UserError(f"bild.early_exit.train.{loss} has unknown keys {bad}; valid: {', '.join(EXIT_TRAIN_KEYS)}")

    def grid(self) -> list[tuple[float, float]]:
        """Every (alpha_FB, alpha_RB) of the early-exit sweep."""
        return [(f, r) for f in self.fallback for r in self.rollback]

    def calm_grid(self) -> list[tuple[float, float]]:
        """Every (lambda, tau) of the CALM sweep."""
        return [(lam, tau) for lam in self.calm_threshold for tau in self.calm_tau]


@dataclass(frozen=True)
class OracleConfig:
    """Figure 2's oracle study (:mod:`bild.oracle`): p_L thresholds below which the large model's
    token replaces the small model's (both models alone are always added), and at most ``n``
    prompts per task (None: the task's ``n``), the first of the sweep's."""
    thresholds: tuple[float, ...]
    n: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "thresholds", _threshold_list("bild.oracle.thresholds", self.thresholds, 0.0, 1.0))
        if self.n is not None:
            check_range("bild.oracle.n", self.n, 1)

    def prompts(self, task: "TaskConfig") -> int:
        return task.n if self.n is None else min(self.n, task.n)


@dataclass(frozen=True)
class ReducedVocabConfig:
    """Beyond the paper: the ``variant`` small model with an LM head over its training labels'
    ``keep`` most frequent tokens (:mod:`common.components.reduced_vocab`), swept on ``task`` beside the
    full head in one run (extra rows of Table 1). ``compact_layers``: also a shallower small
    model trained with that head from the start (``common.components.draft_model --keep``), at the size ratio
    of the paper's T5-small/T5-large pairs, swept in the same run."""
    variant: str
    keep: int
    task: str
    compact_layers: int | None = None

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise UserError(f"bild.reduced_vocab.variant {self.variant!r} is unknown; valid: {', '.join(VARIANTS)}")
        check_range("bild.reduced_vocab.keep", self.keep, 1)
        if self.compact_layers is not None:
            check_range("bild.reduced_vocab.compact_layers", self.compact_layers, 1)


@dataclass(frozen=True)
class BildConfig:
    model: str                       # the large model (embedded: the profile's model)
    small_layers: int | None         # embedded: the small model's depth (first k layers)
    variants: tuple[str, ...]
    max_small_tokens: int            # N of the paper (10)
    max_prompt_tokens: int
    tasks: Mapping[str, TaskConfig]
    train: Mapping | None = None     # embedded: small-model training settings
    handover: tuple[int, ...] = ()   # Figure 5's no-fallback ablation: hand over every N tokens
    spec_gamma: tuple[int, ...] = () # speculative sampling's windows on the same small model (section 4.2)
    oracle: OracleConfig | None = None  # Figure 2's oracle study
    early_exit: EarlyExitConfig | None = None  # Figures 6 and 7
    reduced_vocab: ReducedVocabConfig | None = None  # beyond the paper (embedded small models)
    rollback_rule: str | None = None  # every sweep's rule (bild.decoding.ROLLBACK_RULES); None: the decoder's (the paper's)

    def __post_init__(self):
        check_range("bild.max_small_tokens", self.max_small_tokens, 1)
        check_range("bild.max_prompt_tokens", self.max_prompt_tokens, 1)
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise UserError(f"bild.variants {list(self.variants)} is invalid; valid: a subset of {', '.join(VARIANTS)}")
        if self.small_layers is not None:
            check_range("bild.small_layers", self.small_layers, 1)
        for name in ("handover", "spec_gamma"):
            for v in getattr(self, name):
                check_range(f"bild.{name}", v, 1)
        for t in self.tasks.values():
            if self.small_layers is None and not (t.large and t.small and set(self.variants) <= set(t.small)):
                raise UserError(f"bild.tasks.{t.name}: without small_layers every task names its large model "
                                f"and a small checkpoint per variant ({', '.join(self.variants)})")

        rv = self.reduced_vocab
        if rv is not None:
            if self.small_layers is None:
                raise UserError("bild.reduced_vocab needs the embedded small models (small_layers); "
                                "the paper's checkpoints have no teacher cache to count tokens on")
            if rv.task not in self.tasks or rv.variant not in self.variants:
                raise UserError(f"bild.reduced_vocab names task {rv.task!r} and variant {rv.variant!r}; valid: "
                                f"a task of bild.tasks ({', '.join(self.tasks)}) and a variant of bild.variants "
                                f"({', '.join(self.variants)})")
        if self.early_exit is not None:
            unknown_tasks = [t for t in self.early_exit.tasks if t not in self.tasks]
            if unknown_tasks:
                raise UserError(f"bild.early_exit.tasks names {unknown_tasks}, not tasks of bild.tasks; "
                                f"valid: {', '.join(self.tasks)}")

    def task(self, name: str) -> TaskConfig:
        if name not in self.tasks:
            raise UserError(f"unknown bild task {name!r}; valid: {', '.join(self.tasks)}")
        return self.tasks[name]


def from_mapping(raw: Mapping) -> BildConfig:
    tasks = {name: TaskConfig(name=name, **{**t, "fallback": tuple(t["fallback"]), "rollback": tuple(t["rollback"])})
             for name, t in raw["tasks"].items()}
    return BildConfig(model=raw["model"], small_layers=raw.get("small_layers"), variants=tuple(raw["variants"]),
                      max_small_tokens=raw.get("max_small_tokens", 10), max_prompt_tokens=raw["max_prompt_tokens"],
                      tasks=tasks, train=raw.get("train"), handover=tuple(raw.get("handover", ())),
                      spec_gamma=tuple(raw.get("spec_gamma", ())),
                      oracle=OracleConfig(tuple(raw["oracle"]["thresholds"]), raw["oracle"].get("n"))
                      if raw.get("oracle") else None,
                      early_exit=_early_exit(raw["early_exit"]) if raw.get("early_exit") else None,
                      reduced_vocab=ReducedVocabConfig(**raw["reduced_vocab"]) if raw.get("reduced_vocab") else None,
                      rollback_rule=raw.get("rollback_rule"))


def _early_exit(raw: Mapping) -> EarlyExitConfig:
    calm = raw["calm"]
    return EarlyExitConfig(model=raw["model"], exit_layer=raw["exit_layer"], tasks=tuple(raw["tasks"]),
                           fallback=tuple(raw["fallback"]), rollback=tuple(raw["rollback"]),
                           calm_threshold=tuple(calm["threshold"]), calm_tau=tuple(calm["tau"]),
                           train={k: dict(v) for k, v in raw["train"].items()}, calm_min_exit=calm.get("min_exit", 1))


def from_profile(profile) -> BildConfig:
    """The BiLD config of a :class:`common.config.Profile` (its ``raw['bild']``)."""
    return section(profile, "bild", from_mapping)
