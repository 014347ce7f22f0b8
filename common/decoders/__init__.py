"""Decoder registry: ``get_decoder(name, model, tokenizer, **cfg)``.

Names map to ``module:Class`` strings so paper packages register decoders without
``common`` importing them eagerly.
"""
from __future__ import annotations

import importlib

from ..errors import unknown
from .base import DecodeOutput, Decoder, eos_ids

DECODERS: dict[str, str] = {
    "vanilla": "common.decoders.greedy:Vanilla",
    "hf_generate": "common.decoders.hf:HFGenerate",
    "prompt_lookup": "common.decoders.hf:PromptLookup",
    "speculative": "common.decoders.speculative:Speculative",
    "self_speculative": "common.decoders.self_spec:SelfSpeculative",
    "hf_assisted": "common.decoders.assisted:HFAssisted",
    "medusa": "common.medusa:Medusa",
    "ppd_pipelined": "ppd_pipelined.decoding:PipelinedDecoder",
}


def decoder_class(name: str) -> type[Decoder]:
    if name not in DECODERS:
        raise unknown("decoder", name, DECODERS)
    mod, cls = DECODERS[name].split(":")
    return getattr(importlib.import_module(mod), cls)


def get_decoder(name: str, model, tokenizer=None, **cfg) -> Decoder:
    """Instantiate the decoder registered as ``name``."""
    return decoder_class(name)(model, tokenizer, **cfg)


__all__ = ["DECODERS", "DecodeOutput", "Decoder", "decoder_class", "eos_ids", "get_decoder"]
