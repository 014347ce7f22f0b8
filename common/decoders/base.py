"""The decoder contract every method implements.

``Decoder(model, tokenizer, **cfg).generate(input_ids, max_new_tokens) -> DecodeOutput``.
``tokens`` are the new token ids only; generation stops after the first EOS (kept) or at
``max_new_tokens``. ``stats`` holds at least ``steps`` (target-model forwards after the
prefill, counted as Spec-Bench does: the prefill is step 1), ``accept_lengths`` (tokens
committed per step; they sum to ``new_tokens``), ``new_tokens`` and ``wall_time`` (s).
Methods add their own keys (e.g. ``matches`` for pipelined decoding).

Options are declared once per class (:meth:`Decoder.options`), each with its type and range
(:class:`Option`; a bare default declares its own type), and checked on construction, so a
wrong-typed or out-of-range setting fails before anything runs. ``model_kinds`` says which
models a decoder serves (``causal``, ``seq2seq``); ``lossless`` marks decoders whose greedy
output must equal ``vanilla``'s token for token (the lossless test runs every such decoder,
with the option sets :meth:`Decoder.test_configs` gives for a tiny random model).

Sampling is part of the contract: every decoder takes :data:`SAMPLING_OPTIONS` (``temperature``,
``seed``, ``top_p``, ``top_k``; declared here once, merged into every decoder's options). At
temperature 0 a decoder is greedy; above it, a decoder that can sample (:meth:`Decoder.can_sample`)
draws only from its own ``torch.Generator`` seeded by ``seed`` (:meth:`Decoder.generator`), so
the same seed gives the same tokens, and a decoder that cannot ends with one error naming those
that can.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoints import check_meta, read_trained
from ..errors import UserError
from ..hardware import device_clock
from ..engine.target import make_target, model_kind
from .registry import DECODERS, decoder_class


@dataclass
class DecodeOutput:
    """New tokens and run statistics of one ``generate`` call."""
    tokens: list[int]
    stats: dict = field(default_factory=dict)


def eos_ids(model, tokenizer=None) -> set[int]:
    """All EOS ids the model's generation config (or tokenizer) declares."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


_TYPE_NAMES = {bool: "true/false", int: "an integer", float: "a number", str: "a string",
               list: "a list", Path: "a path", torch.nn.Module: "a model object"}


# Option.legacy's "none": a record without the option is not judged on it.
NO_LEGACY = "<no legacy value>"


@dataclass(frozen=True)
class Option:
    """One decoder option: default, accepted types, range or choices.

    Attributes:
        default: the value when the option is not given (``None`` means "not set" and is
            always accepted).
        types: accepted Python types; ``bool`` is never taken for ``int``/``float`` and an
            ``int`` is taken where ``float`` is accepted.
        lo, hi: inclusive bounds for numbers; ``choices``: the valid values (for strings).
        check: extra check ``(value) -> None`` raising UserError (e.g. list contents).
        legacy: the value runs made before the option existed used (their records do not name
            it); :func:`common.harness.report.stale_settings` reads a record without the option
            as having run with it. ``NO_LEGACY`` (the default): such a record is not judged on it.
    """
    default: Any = None
    types: tuple = ()
    lo: float | None = None
    hi: float | None = None
    choices: tuple | None = None
    check: Callable[[Any], None] | None = None
    legacy: Any = NO_LEGACY

    def valid(self) -> str:
        """What is valid, in words, for error messages."""
        if self.choices is not None:
            return "one of " + ", ".join(map(repr, self.choices))
        what = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in self.types) or "any value"
        if self.lo is not None and self.hi is not None:
            what += f" in [{self.lo}, {self.hi}]"
        elif self.lo is not None:
            what += f" >= {self.lo}"
        return what + (" or null" if self.default is None and self.types else "")

    def validate(self, decoder: str, name: str, value) -> None:
        if value is None and self.default is None:
            return
        ok = not self.types or any(_is(value, t) for t in self.types)
        if ok and self.choices is not None:
            ok = value in self.choices
        if ok and isinstance(value, (int, float)) and not isinstance(value, bool):
            ok = (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)
        if not ok:
            raise UserError(f"decoder {decoder!r} option {name}={value!r} is invalid; valid: {self.valid()}")
        if self.check is not None:
            self.check(value)


def _is(value, t) -> bool:
    if isinstance(value, bool):
        return t is bool
    if t is float:
        return isinstance(value, (int, float))
    return isinstance(value, t)


def _check_top_p(value) -> None:
    # Option bounds are inclusive; top-p 0 would keep no token (transformers refuses it too)
    if not value > 0:
        raise UserError(f"top_p={value!r} is out of range; valid: a number in (0, 1]")


# The sampling options of every decoder (transformers' names and meanings): the temperature
# (0 = greedy), the seed of the decoder's own generator, nucleus and top-k truncation
# (common.engine.acceptance.process applies them in transformers' order).
SAMPLING_OPTIONS = {"temperature": Option(0.0, (float,), lo=0.0), "seed": Option(0, (int,), lo=0),
                    "top_p": Option(1.0, (float,), lo=0.0, hi=1.0, check=_check_top_p),
                    "top_k": Option(0, (int,), lo=0)}


def as_option(default) -> Option:
    """A bare default declares an option of its own type (None: any value)."""
    if isinstance(default, Option):
        return default
    if default is None:
        return Option(None)
    t = float if isinstance(default, float) else type(default)
    return Option(default, (t,))


class Decoder:
    """Base class: holds the model and its :class:`~common.engine.target.Target`, checks options,
    times ``_generate``."""

    name = "base"
    lossless = False  # True when greedy output must equal vanilla greedy exactly
    model_kinds: tuple[str, ...] = ("causal",)

    def __init__(self, model, tokenizer=None, **cfg):
        self.model, self.tokenizer = model, tokenizer
        kind = model_kind(model)
        if kind not in self.model_kinds:
            need = " or ".join({"causal": "a causal LM", "seq2seq": "an encoder-decoder"}[k] for k in self.model_kinds)
            raise UserError(f"decoder {self.name!r} needs {need}; got {type(model).__name__} ({kind}); "
                            f"decoders for {kind} models: {', '.join(decoders_for(kind))}")
        self.eos = eos_ids(model, tokenizer)
        # the sampling options are every decoder's, whether or not its options() merges them
        declared = {**{k: as_option(v) for k, v in SAMPLING_OPTIONS.items()},
                    **{k: as_option(v) for k, v in self.options().items()}}
        unused = set(cfg) - set(declared)
        if unused:
            raise UserError(f"decoder {self.name!r} has no option(s) {sorted(unused)}; "
                            f"valid: {sorted(declared) or 'none'}")
        self.check_sampling(cfg)
        for k, v in cfg.items():
            declared[k].validate(self.name, k, v)
        self.cfg = {**{k: o.default for k, o in declared.items()}, **cfg}
        self.target = make_target(model)

    @classmethod
    def options(cls) -> dict:
        """Configurable options: name -> :class:`Option` or a bare default; a subclass merges
        ``super().options()`` (the sampling options come from here)."""
        return dict(SAMPLING_OPTIONS)

    @classmethod
    def can_sample(cls) -> bool:
        """Whether the decoder samples at temperature > 0 (else it refuses that temperature)."""
        return False

    @classmethod
    def check_sampling(cls, cfg: dict) -> None:
        """The sampling options in ``cfg``, checked without a model (the benchmark checks them
        before loading one): each in range, and temperature > 0 only where the decoder samples."""
        for k, opt in SAMPLING_OPTIONS.items():
            if k in cfg:
                opt.validate(cls.name, k, cfg[k])
        t = cfg.get("temperature", 0.0)
        if t > 0 and not cls.can_sample():
            raise UserError(f"decoder {cls.name!r} cannot sample (temperature={t}; valid: 0); decoders that "
                            f"sample: {', '.join(decoders_that_sample())}")

    @property
    def sampling(self) -> dict:
        """The run's sampling settings: temperature, top_p, top_k, seed (for records)."""
        return {k: self.cfg[k] for k in SAMPLING_OPTIONS}

    def generator(self) -> torch.Generator:
        """A fresh generator on the model's device seeded by ``seed``: one per ``generate``
        call, so a call's tokens depend on its seed only, not on the calls before it."""
        return torch.Generator(device=self.device).manual_seed(int(self.cfg["seed"]))

    @classmethod
    def test_configs(cls, model, workdir: Path) -> list[dict]:
        """Option sets that exercise this decoder on a tiny random ``model`` (building any
        component it needs, untrained, under ``workdir``); the lossless test runs each."""
        return [{}]

    @property
    def device(self) -> torch.device:
        return self.model.device

    def trained_component(self, option: str, filename: str, train_cmd: str, meta_for) -> tuple[Path, dict]:
        """The finished checkpoint an option names (a folder holding ``filename``), checked to
        belong to this model: ``meta_for(stored meta) -> the meta this model would give it``.

        Returns:
            ``(folder, checkpoint state)`` (:func:`common.checkpoints.read_trained`).
        """
        folder = self.cfg[option]
        if folder is None:
            raise UserError(f"decoder {self.name!r} needs {option}=<folder with {filename}> (train: {train_cmd})")
        folder = Path(folder)
        state = read_trained(folder / filename, hint=f"train it first ({train_cmd})")
        check_meta(state, meta_for(state["identity"]["meta"]), f"{option} at {folder}",
                   f"train one for this model ({train_cmd})")
        return folder, state

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        """Decode up to ``max_new_tokens`` after ``input_ids`` (``[1, S]`` long)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise UserError(f"max_new_tokens={max_new_tokens!r} is out of range; valid: an integer >= 1")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise UserError(f"input_ids must have shape [1, S]; got {list(input_ids.shape)}")
        input_ids = input_ids.to(self.device)
        t0 = device_clock(self.device)  # both ends wait for a GPU's queued work (hardware.device_clock)
        with torch.inference_mode():
            out = self._generate(input_ids, max_new_tokens)
        out.stats["wall_time"] = device_clock(self.device) - t0
        out.stats["new_tokens"] = len(out.tokens)
        if out.stats.get("accept_lengths") is not None:
            assert sum(out.stats["accept_lengths"]) == len(out.tokens), "accept_lengths must sum to new_tokens"
        return out

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        raise NotImplementedError

    def close(self) -> None:
        """Release resources held across calls (worker processes); a no-op by default."""

    def truncate(self, tokens: list[int], max_new_tokens: int) -> tuple[list[int], bool]:
        """Cut ``tokens`` after the first EOS or at the budget; return (tokens, finished)."""
        for i, t in enumerate(tokens):
            if t in self.eos:
                return tokens[: min(i + 1, max_new_tokens)], True
        return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


def decoders_that_sample() -> list[str]:
    """Registered decoder names that sample at temperature > 0 (imports each decoder class)."""
    return [n for n in DECODERS if decoder_class(n).can_sample()]


def decoders_for(kind: str) -> list[str]:
    """Registered decoder names serving models of ``kind`` (imports each decoder class)."""
    return [n for n in DECODERS if kind in decoder_class(n).model_kinds]
