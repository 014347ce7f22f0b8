"""Table 2 of BiLD: the configurations of the large and small models, read from the models.

    python -m bild.model_configs --profile embedded --out results/bild/raw/models.jsonl

One record per (task, role): layers (encoder + decoder for encoder-decoders), model width,
FFN width, attention heads, KV heads and head width (Figure 8's counts need them), vocabulary and
parameter count. Counts come from the model's config instantiated on the meta device (no
weights are read or allocated), so the paper's T5 and mT5 checkpoints only need their config
files; the embedded small model is the large model's config with its first ``small_layers``
layers (what :func:`common.components.draft_model.truncated_copy` keeps), counted with the embeddings and head
it shares.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from common.checks import ArgumentParser, check_out_path
from common.errors import UserError, cli_main
from common.records import JsonlWriter


def _config(name: str):
    from transformers import AutoConfig

    from common.assets.models import resolve

    try:
        return AutoConfig.from_pretrained(resolve(name))
    except OSError as e:
        raise UserError(f"model {name!r}: no config could be read ({str(e).splitlines()[0]})") from e


def describe(cfg) -> dict:
    """Layers, widths, heads, vocabulary and parameter count of a model config."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))
    cls = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(cfg)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())  # tied weights once
    get = lambda *names: next((getattr(cfg, n) for n in names if getattr(cfg, n, None) is not None), None)  # noqa: E731
    layers = (f"{cfg.num_layers} + {cfg.num_decoder_layers}" if seq2seq
              else str(get("num_hidden_layers", "n_layer")))
    return {"kind": "encoder-decoder" if seq2seq else "decoder-only", "layers": layers,
            "d_model": get("d_model", "hidden_size", "n_embd"), "ffn": get("d_ff", "intermediate_size"),
            "heads": get("num_heads", "num_attention_heads", "n_head"),
            "kv_heads": get("num_key_value_heads", "num_heads"), "head_dim": get("head_dim", "d_kv"),
            "vocab": cfg.vocab_size, "params": params}


def truncated_config(cfg, layers: int):
    """The config of the large model's first ``layers`` decoder layers (the embedded small model)."""
    n = getattr(cfg, "num_hidden_layers", None)
    if n is None or not 1 <= layers < n:
        raise UserError(f"small_layers={layers} is out of range; valid: 1..{(n or 2) - 1} (below the large model's depth)")
    small = copy.deepcopy(cfg)
    small.num_hidden_layers = layers
    if getattr(small, "layer_types", None):
        small.layer_types = small.layer_types[:layers]
    return small


def rows(bild_cfg) -> list[dict]:
    """Every (task, role) row of the profile's BiLD setup."""
    out = []
    for task in bild_cfg.tasks.values():
        large_name = task.large or bild_cfg.model
        large = _config(large_name)
        out.append({"task": task.name, "role": "large", "model": large_name, **describe(large)})
        if bild_cfg.small_layers is not None:
            out.append({"task": task.name, "role": "small", "model": f"{large_name}, first {bild_cfg.small_layers} layers",
                        **describe(truncated_config(large, bild_cfg.small_layers))})
        else:
            for variant in bild_cfg.variants:
                name = task.small[variant]
                out.append({"task": task.name, "role": f"small ({variant})", "model": name, **describe(_config(name))})
    return out


def main(argv=None) -> None:
    from common.config import load_profile

    from .config import from_profile

    ap = ArgumentParser(prog="python -m bild.model_configs", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="config profile whose bild section names the models")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    check_out_path(a.out)
    cfg = from_profile(load_profile(None, a.profile))
    with JsonlWriter(a.out) as w:
        for r in rows(cfg):
            w.write({**r, "profile": a.profile})
            print(f"{r['task']:>10} {r['role']:>17} {r['layers']:>8} layers  {r['params'] / 1e6:8.1f} M  {r['model']}")


if __name__ == "__main__":
    cli_main(main)
