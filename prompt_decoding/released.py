"""Parallel prompt decoding's released prompt tokens, converted into this package's component folder.

The authors (hmarkc/parallel-prompt-decoding, ``prompt/model/model.py``) publish a PEFT
prompt-tuning adapter: ``adapter_config.json`` (``num_special_tokens`` m,
``virtual_tokens_per_special_token`` n, ``vt_attention_type``, ``aggregation_type``,
``use_custom_lm_head``, ``use_prefix_tuning``, ``num_exits``) and ``adapter_model.safetensors``
(or ``.bin``) holding ``prompt_embeddings`` ``[m*n, H]``, prompt token major (their position ids
repeat each prompt token's position n times); ``weighting_layers.pt`` (``{j}.weight`` ``[1, n]``)
with ``aggregation_type="weighted"``, ``custom_lm_head.pt`` (``weight`` ``[V, H]``) with a custom
head. The folder readers are :mod:`common.components.released_heads`'s.

    python -m prompt_decoding.released --src DIR --model vicuna-7b --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from common.checkpoints import save_trained
from common.errors import UserError, cli_main
from common.components.released_heads import check_base, read_json, read_tensors, source_folder, tensor_of, write_provenance

from .decoding import new_prompts, prompts_meta
from .prompt_tokens import Extras

PEFT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# The authors' attention among a token's prompt tokens -> this repository's EPT mask, where they
# coincide. Their "decoder" mask is causal over all m*n virtual tokens (an EPT also sees the
# earlier EPTs of its own prompt token) and their "encoder" mask lets an EPT see only its own
# prompt token's EPTs; neither is one of prompt_decoding.prompt_tokens.MASKS but with n = 1 the
# "decoder" one is the causal chain every mask here gives.
PPD_MASKS = {"ensemble": "ensemble"}


def convert_prompt_tokens(src, model, out: str | os.PathLike) -> dict:
    """Prompt tokens as their authors publish them (a PEFT prompt-tuning adapter) -> a
    ``prompt_decoding`` ``prompt_tokens`` folder for ``model``; returns the checkpoint's meta.

    Refused (UserError naming the setting): masks that differ from this repository's (see
    :data:`PPD_MASKS`), adaptive weighting, prefix tuning and multi-exit ensembles."""
    folder = source_folder(src, PEFT_FILES + ("weighting_layers.pt", "custom_lm_head.pt"))
    cpath = folder / "adapter_config.json"
    cfg = read_json(cpath)
    m, n = cfg.get("num_special_tokens", 1), cfg.get("virtual_tokens_per_special_token", 1)
    if not (isinstance(m, int) and isinstance(n, int) and m >= 1 and n >= 1):
        raise UserError(f"{cpath}: num_special_tokens and virtual_tokens_per_special_token must be positive "
                        f"integers; got {m!r}, {n!r}")
    attention = str(cfg.get("vt_attention_type", "decoder")).lower()
    mask = PPD_MASKS.get(attention) or ("ensemble" if attention == "decoder" and n == 1 else None)
    if mask is None:
        raise UserError(f"{cpath}: vt_attention_type={attention!r} with {n} virtual tokens per prompt token is "
                        "not supported; valid: 'ensemble' (the paper's), or 'decoder' with 1 virtual token")
    aggregation = {"mean": "average", "weighted": "learned"}.get(str(cfg.get("aggregation_type", "mean")).lower())
    if aggregation is None:
        raise UserError(f"{cpath}: aggregation_type={cfg.get('aggregation_type')!r} is not supported; valid: mean, "
                        "weighted")
    if cfg.get("use_prefix_tuning") or int(cfg.get("num_exits", 1) or 1) > 1:
        raise UserError(f"{cpath}: prefix tuning and multi-exit ensembles are accuracy ablations (Appendix B) "
                        "that decoding here refuses; valid: use_prefix_tuning false, num_exits 1")
    check_base(model, cfg.get("base_model_name_or_path"), cpath)
    H, V = model.config.hidden_size, model.config.vocab_size
    state, path = read_tensors(folder, PEFT_FILES)
    key = next((k for k in state if k.split(".")[-1] == "prompt_embeddings"), "prompt_embeddings")
    emb = tensor_of(state, key, (m * n, H), path)
    extras = Extras(aggregation=aggregation, head=bool(cfg.get("use_custom_lm_head")))
    prompts = new_prompts(model, m, n, mask, extras=extras)
    with torch.no_grad():
        # virtual token j*n + i is EPT i of prompt token j (their positions repeat_interleave n)
        prompts.embeddings.copy_(emb.reshape(m, n, H))
        if prompts.weights is not None:
            wstate, wpath = read_tensors(folder, ("weighting_layers.pt",))
            prompts.weights.copy_(torch.stack([tensor_of(wstate, f"{j}.weight", (1, n), wpath)[0] for j in range(m)]))
        if prompts.head is not None:
            hstate, hpath = read_tensors(folder, ("custom_lm_head.pt",))
            prompts.head.weight.copy_(tensor_of(hstate, "weight", (V, H), hpath))
    meta = {**prompts_meta(model, m, n, mask, extras), "released": str(src)}
    out = Path(out)
    save_trained(prompts, out / "prompts.pt", meta)
    write_provenance(out, "prompt_tokens", src, folder, cfg)
    return meta


def _main(argv=None) -> None:
    from common.assets.models import DTYPES, load_model

    ap = argparse.ArgumentParser(description="convert parallel prompt decoding's released prompt tokens")
    ap.add_argument("--src", required=True, help="the authors' adapter folder, or its hub repository id")
    ap.add_argument("--model", required=True, help="the base model it was released for")
    ap.add_argument("--out", type=Path, required=True, help="the prompt_tokens folder to write")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    model, _ = load_model(a.model, a.dtype, a.device)
    meta = convert_prompt_tokens(a.src, model, a.out)
    print(f"prompt_tokens from {a.src} -> {a.out}: {json.dumps(meta, default=str)}")


if __name__ == "__main__":
    cli_main(_main)
