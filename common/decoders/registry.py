"""Decoder registry: ``get_decoder(name, model, tokenizer, **cfg)``.

Decoders register through the ``decoding_repro.decoders`` entry-point group of the installed
distribution (``pyproject.toml``): each package lists its own classes there, and nothing in
``common`` imports a paper package. A class is imported only when it is asked for. This module
imports no decoder (the contract in :mod:`common.decoders.base` asks it which decoders serve a
model kind, for its error messages).
"""
from __future__ import annotations

from importlib.metadata import entry_points

from ..errors import UserError, unknown

GROUP = "decoding_repro.decoders"


def _discover() -> dict[str, str]:
    """name -> ``module:Class`` of every registered decoder."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


DECODERS: dict[str, str] = _discover()


def decoder_class(name: str) -> type:
    """The :class:`~common.decoders.base.Decoder` subclass registered as ``name``."""
    if not DECODERS:
        raise UserError(f"no decoders are registered (entry-point group {GROUP!r}); install the "
                        "repository first: bash tools/setup.sh (or pip install -e .)")
    if name not in DECODERS:
        raise unknown("decoder", name, DECODERS)
    ep = next(e for e in entry_points(group=GROUP) if e.name == name)
    cls = ep.load()
    if cls.name != name:
        raise UserError(f"entry point {name!r} loads {ep.value} whose name is {cls.name!r}; fix pyproject.toml")
    return cls


def get_decoder(name: str, model, tokenizer=None, **cfg):
    """Instantiate the decoder registered as ``name``."""
    return decoder_class(name)(model, tokenizer, **cfg)
