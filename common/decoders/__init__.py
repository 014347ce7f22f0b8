"""Decoders: the contract (:mod:`.base`), the tree loop (:mod:`.tree_loop`), the registry
(:mod:`.registry`: ``get_decoder(name, model, tokenizer, **cfg)`` over the
``decoding_repro.decoders`` entry points) and the baseline methods beside them."""
from __future__ import annotations

from .base import NO_LEGACY, DecodeOutput, Decoder, Option, eos_ids
from .registry import DECODERS, GROUP, decoder_class, get_decoder

__all__ = ["DECODERS", "DecodeOutput", "Decoder", "GROUP", "Option", "decoder_class", "eos_ids", "get_decoder"]
