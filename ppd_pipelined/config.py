"""PPD's experiment settings: the profile's ``ppd_pipelined:`` section as frozen dataclasses.

One config path (house style): ``config/config.yaml`` -> schema validation
(:func:`common.config.load_profile`) -> :func:`from_profile` here -> rule params / CLIs.
The ``__post_init__`` checks repeat the schema's ranges so that the dataclasses are safe to
build from Python too (tests, notebooks); layer indices are checked against the model's depth
where the model is loaded (:func:`common.engine.forward.check_layer`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from common.config import TrainConfig, section
from common.errors import UserError, check_layers, check_range

TASKS = ("squad", "wmt", "cnn_dm")          # the paper's three tasks (Table 1), fixed keys
METHODS = ("greedy", "top_k", "top_p")       # Appendix B's decoding methods
CLASSIFIERS = ("N", "Y")                     # N: final LM head reused; Y: head trained per layer
MAX_TOPK = 5                                 # records keep the early top-5: any k <= 5 downstream


def _check_k(name: str, k) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise UserError(f"{name}={k!r} must be an integer")
    check_range(name, k, 1, MAX_TOPK)


def check_p(name: str, p) -> None:
    """Raise UserError unless ``0 <= p <= 1``."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise UserError(f"{name}={p!r} is out of range; valid: [0, 1]")


def check_probed_layers(layers, depth: int | None = None) -> None:
    """Raise UserError unless the probed layers are distinct, non-empty and each in
    ``[1, depth)`` (``depth`` when known)."""
    if not layers:
        raise UserError("layers must name at least one probed layer")
    check_layers(layers, depth)
    if len(set(layers)) != len(layers):
        raise UserError(f"layers {list(layers)} repeat a layer")


@dataclass(frozen=True)
class TaskConfig:
    """One of Table 1's tasks on the profile's data: the paper's set or its offline stand-in."""
    name: str              # squad | wmt | cnn_dm
    dataset: str           # common.assets.data registry name
    template: str          # common.assets.prompts.TEMPLATES name
    n: int                 # prompts
    max_new_tokens: int    # 16 for SQuAD, 128 for WMT and CNN/DM in the paper

    def __post_init__(self):
        if self.name not in TASKS:
            raise UserError(f"unknown task {self.name!r}; valid: {', '.join(TASKS)}")
        check_range(f"{self.name}.n", self.n, 1)
        check_range(f"{self.name}.max_new_tokens", self.max_new_tokens, 1)


@dataclass(frozen=True)
class HeadsConfig(TrainConfig):
    """Table 4's recipe for the intermediate LM heads, scaled per profile: the data fields
    below, and the optimizer and schedule of :class:`~common.config.TrainConfig` (the
    profiles set them; the paper's are in the ``paper`` profile)."""
    dataset: str = "sharegpt"
    sequences: int = 64        # training conversations (first human turn + gpt reply)
    holdout: int = 8           # held-out conversations (the learning curve, the before/after check)
    max_len: int = 256         # tokens per sequence (paper: 2048)
    # Early stopping (common.training.loop.Stopping) on the held-out match with the final layer;
    # eval_every None: train every epoch without a curve (the paper's fixed 3 epochs).
    eval_every: int | None = None
    patience: int = 3
    min_delta: float = 0.005
    wall_budget_s: float | None = None

    def __post_init__(self):
        super().__post_init__()
        check_range("heads.sequences", self.sequences, 1)
        check_range("heads.holdout", self.holdout, 1)
        check_range("heads.max_len", self.max_len, 8)
        if self.eval_every is not None:
            check_range("heads.eval_every", self.eval_every, 1)


@dataclass(frozen=True)
class SamplingConfig:
    """Appendix B (Table 5): p_correct under greedy, top-k and top-p sampling (N head only)."""
    model: str
    tasks: tuple[str, ...] = ("cnn_dm", "squad")
    n: int = 100
    top_k: int = 3
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self):
        for t in self.tasks:
            if t not in TASKS:
                raise UserError(f"unknown task {t!r}; valid: {', '.join(TASKS)}")
        check_range("sampling.n", self.n, 1)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise UserError(f"sampling.top_k={self.top_k!r} must be an integer")
        check_range("sampling.top_k", self.top_k, 1)
        check_p("sampling.top_p", self.top_p)


@dataclass(frozen=True)
class Table3Config:
    """Section 5 (Table 3): greedy vs PPD with k + 1 real workers, through common.harness.bench."""
    model: str
    tasks: tuple[str, ...] = ("cnn_dm", "squad")
    ks: tuple[int, ...] = (1, 3)
    n: int = 4
    max_new_tokens: int = 128
    exit_layer: int | None = None   # None: d // 2 (the paper's Algorithm 1)
    backend: str = "gloo"

    def __post_init__(self):
        for t in self.tasks:
            if t not in TASKS:
                raise UserError(f"unknown task {t!r}; valid: {', '.join(TASKS)}")
        for k in self.ks:
            if isinstance(k, bool) or not isinstance(k, int):
                raise UserError(f"table3.k={k!r} must be an integer")
            check_range("table3.k", k, 1, 8)
        check_range("table3.n", self.n, 1)
        check_range("table3.max_new_tokens", self.max_new_tokens, 1)
        if self.exit_layer is not None:
            check_layers([self.exit_layer], name="exit_layer")
        if self.backend not in ("gloo", "serial"):
            raise UserError(f"unknown backend {self.backend!r}; valid: gloo, serial")


@dataclass(frozen=True)
class PPDConfig:
    """Everything the PPD experiments of one profile use."""
    model: str                           # Table 2 / 6-8 model (paper: Vicuna-13B)
    layers: tuple[int, ...]              # probed early-exit layers d_bar (hs index: after l layers)
    ks: tuple[int, ...]                  # top-k of the early prediction (Table 2: 1, 3, 5)
    classifiers: tuple[str, ...]
    tasks: Mapping[str, TaskConfig]
    heads: HeadsConfig
    sampling: SamplingConfig
    table3: Table3Config
    max_prompt_tokens: int = 1024
    mid_layer: int | None = None         # d/2, the layer of Figures 3-4 (must be probed)
    raw: Mapping = field(default_factory=dict, repr=False)

    def __post_init__(self):
        check_probed_layers(list(self.layers))
        for k in self.ks:
            _check_k("k", k)
        for c in self.classifiers:
            if c not in CLASSIFIERS:
                raise UserError(f"unknown classifier {c!r}; valid: {', '.join(CLASSIFIERS)}")
        check_range("max_prompt_tokens", self.max_prompt_tokens, 1)
        if self.mid_layer is not None and self.mid_layer not in self.layers:
            raise UserError(f"mid_layer={self.mid_layer} must be one of the probed layers {list(self.layers)}")
        missing = [t for t in TASKS if t not in self.tasks]
        if missing:
            raise UserError(f"ppd_pipelined.tasks lacks {', '.join(missing)}; every profile names all of "
                            f"{', '.join(TASKS)} (the artifacts read all three)")
        for t in (*self.sampling.tasks, *self.table3.tasks):
            if t not in self.tasks:
                raise UserError(f"task {t!r} is not configured under ppd_pipelined.tasks")

    def task(self, name: str) -> TaskConfig:
        if name not in self.tasks:
            raise UserError(f"unknown task {name!r}; valid: {', '.join(self.tasks)}")
        return self.tasks[name]


def from_mapping(c: Mapping) -> PPDConfig:
    """Build :class:`PPDConfig` from a profile's ``ppd_pipelined`` mapping (YAML)."""
    tasks = {name: TaskConfig(name=name, **dict(t)) for name, t in c["tasks"].items()}
    s, t3 = dict(c["sampling"]), dict(c["table3"])
    return PPDConfig(
        model=c["model"], layers=tuple(c["layers"]), ks=tuple(c.get("ks", (1, 3, 5))),
        classifiers=tuple(c.get("classifiers", CLASSIFIERS)), tasks=tasks,
        heads=HeadsConfig(**dict(c["heads"])),
        sampling=SamplingConfig(**{**s, "tasks": tuple(s.get("tasks", ("cnn_dm", "squad")))}),
        table3=Table3Config(**{**t3, "tasks": tuple(t3.get("tasks", ("cnn_dm", "squad"))),
                               "ks": tuple(t3.get("ks", (1, 3)))}),
        max_prompt_tokens=c.get("max_prompt_tokens", 1024), mid_layer=c.get("mid_layer"), raw=c)


def from_profile(profile) -> PPDConfig:
    """The PPD config of a :class:`common.config.Profile` (its ``raw['ppd_pipelined']``)."""
    return section(profile, "ppd_pipelined", from_mapping)
