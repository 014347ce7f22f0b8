"""Tiny random stand-ins of a profile's hub models, written as local copies of their repositories.

The paper-tiny profile runs the paper profile's rules on CPU in minutes: every model the paper
profile names (Vicuna, LLaMA-2, BiLD's fine-tuned T5/mT5 pairs, the draft) is replaced by a
randomly initialized model of the **same architecture and depth** (so every layer index in the
config stays valid) and a small width, and every released component (Medusa-1's heads,
parallel prompt decoding's prompt tokens) by random weights in its authors' file format for
that stand-in. Each is written where a local copy of its hub repository would be,
``<model_root>/<owner>/<name>``, which :func:`common.assets.models.resolve` and
:func:`common.components.released_heads.source_folder` read before the hub (``$DECODING_REPRO_MODELS``). The
profile's ``stand_ins`` says which, with what architecture and depth:

    stand_ins: {vicuna-7b: {arch: llama, layers: 32},
                kssteven/T5-large-xsum: {arch: t5, layers: 24},
                FasterDecoding/medusa-vicuna-7b-v1.3: {arch: medusa, base: vicuna-7b, heads: 5}, ...}

Every stand-in takes the embedded model's tokenizer (no other tokenizer is offline here), so
the paper datasets' text goes through a real tokenizer. Seeded by name: a rebuild writes the
same weights.

    python -m common.harness.stand_ins --profile paper-tiny --tokenizer smollm2-135m-instruct
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import zlib
from pathlib import Path

import torch

from ..config import load_profile
from ..errors import UserError, cli_main
from ..assets.models import MODELS, resolve
from ..paths import load_or_error
from ..records import write_json

HIDDEN = 64      # every stand-in's width: a 40-layer stand-in stays a few million parameters
HEADS = 4
DONE = "stand_ins.json"  # written last into model_root: what the workflow's rules wait for


def hub_id(name: str) -> str:
    """A registry name's hub id (a hub id stays itself): the stand-in's folder under the root."""
    spec = MODELS.get(name)
    if spec is not None and spec.hub_id is None:
        raise UserError(f"stand-in {name!r} is an embedded model; valid: a hub model (registry name or owner/name)")
    return spec.hub_id if spec is not None else name


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _special_ids(tok) -> dict:
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    bos = tok.bos_token_id if tok.bos_token_id is not None else eos
    return {"bos": bos, "eos": eos, "pad": pad}


def llama(name: str, layers: int, tok):
    """A LLaMA of ``layers`` layers, multi-head attention and an untied head, as Vicuna's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    ids = _special_ids(tok)
    torch.manual_seed(_seed(name))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                      pad_token_id=ids["pad"])
    return LlamaForCausalLM(cfg).eval()


def t5(name: str, layers: int, tok, multilingual: bool):
    """A T5 (v1.0: ReLU, tied head) or mT5 (v1.1: gated GELU, untied head) of ``layers``
    encoder and decoder layers."""
    from transformers import MT5Config, MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration

    ids = _special_ids(tok)
    torch.manual_seed(_seed(name))
    kw = dict(vocab_size=len(tok), d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=layers,
              num_decoder_layers=layers, num_heads=HEADS, decoder_start_token_id=ids["pad"], pad_token_id=ids["pad"],
              eos_token_id=ids["eos"], dropout_rate=0.0)
    if multilingual:
        return MT5ForConditionalGeneration(MT5Config(**kw, feed_forward_proj="gated-gelu",
                                                     tie_word_embeddings=False)).eval()
    return T5ForConditionalGeneration(T5Config(**kw, feed_forward_proj="relu", tie_word_embeddings=True)).eval()


def _base_dims(base: str, stand_ins: dict, root: Path) -> tuple[int, int]:
    """Hidden size and vocabulary of the stand-in a released component was made for."""
    if base not in stand_ins or stand_ins[base]["arch"] != "llama":
        raise UserError(f"a released stand-in's base {base!r} is not a llama stand-in of this profile; "
                        f"valid: {', '.join(k for k, v in stand_ins.items() if v['arch'] == 'llama')}")
    path = root / hub_id(base) / "config.json"

    def load(p: Path) -> tuple[int, int]:
        cfg = json.loads(p.read_text(encoding="utf-8"))
        dims = (cfg.get("hidden_size"), cfg.get("vocab_size")) if isinstance(cfg, dict) else (None, None)
        if not all(isinstance(d, int) and d > 0 for d in dims):
            raise ValueError("no positive hidden_size and vocab_size")
        return dims
    # written by this build before the components released for it; damaged: that stand-in is rebuilt
    return load_or_error(path, load, "stand-in config",
                         "delete its folder and build the stand-ins again (python -m common.harness.stand_ins)")


def write_medusa_release(folder: Path, state: dict, base: str, fmt: str = "pt", **config) -> Path:
    """A Medusa-1 release (common.components.released_heads's docstring): ``config.json`` and the heads' state dict
    (``{k}.0.linear.weight`` ``[H, H]``, ``{k}.0.linear.bias``, ``{k}.1.weight`` ``[V, H]``) as
    ``medusa_lm_head.pt`` (or ``.safetensors``), fp16 as released; ``config`` overrides the
    config's keys (tests write faulty releases with it)."""
    folder.mkdir(parents=True, exist_ok=True)
    heads = len({k.split(".")[0] for k in state})
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": 1,
                                                    "base_model_name_or_path": base,
                                                    "architectures": ["MedusaModel"], **config}))
    half = {k: v.detach().half().contiguous() for k, v in state.items()}
    if fmt == "pt":
        torch.save(half, folder / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file

        save_file(half, str(folder / "medusa_lm_head.safetensors"))
    return folder


def write_prompt_tokens_release(folder: Path, emb: torch.Tensor, m: int, n: int, base: str, fmt: str = "safetensors",
                                weights: dict | None = None, head: torch.Tensor | None = None, **config) -> Path:
    """A parallel-prompt-decoding release (common.components.released_heads's docstring): a PEFT prompt-tuning
    adapter, ``adapter_config.json`` and ``prompt_embeddings`` ``emb`` ``[m*n, H]`` (fp16) in
    ``adapter_model.safetensors`` (or ``.bin``); ``weights`` (``{j}.weight`` ``[1, n]``) make it a
    weighted aggregation, ``head`` ``[V, H]`` a custom LM head; ``config`` overrides its keys."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "PROMPT_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": m * n,
           "token_dim": emb.shape[1], "num_special_tokens": m, "virtual_tokens_per_special_token": n,
           "vt_attention_type": "ensemble", "aggregation_type": "weighted" if weights is not None else "mean",
           "use_custom_lm_head": head is not None, "use_prefix_tuning": False, "num_exits": 1,
           "base_model_name_or_path": base, **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    state = {"prompt_embeddings": emb.detach().half().contiguous()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(folder / "adapter_model.safetensors"))
    else:
        torch.save(state, folder / "adapter_model.bin")
    if weights is not None:
        torch.save(weights, folder / "weighting_layers.pt")
    if head is not None:
        torch.save({"weight": head.detach()}, folder / "custom_lm_head.pt")
    return folder


def medusa_released(folder: Path, name: str, base: str, heads: int, dims: tuple[int, int]) -> None:
    """Random Medusa-1 heads for ``base``'s stand-in, in their release format."""
    H, V = dims
    g = torch.Generator().manual_seed(_seed(name))
    state = {}
    for k in range(heads):
        state[f"{k}.0.linear.weight"] = torch.randn(H, H, generator=g) / H ** 0.5
        state[f"{k}.0.linear.bias"] = torch.zeros(H)
        state[f"{k}.1.weight"] = torch.randn(V, H, generator=g) / H ** 0.5
    write_medusa_release(folder, state, hub_id(base))


def prompt_tokens_released(folder: Path, name: str, base: str, m: int, n: int, dims: tuple[int, int]) -> None:
    """Random prompt tokens for ``base``'s stand-in, in their release format."""
    g = torch.Generator().manual_seed(_seed(name))
    write_prompt_tokens_release(folder, torch.randn(m * n, dims[0], generator=g), m, n, hub_id(base))


def build(stand_ins: dict, root: Path, tokenizer: str) -> dict:
    """Write every stand-in of ``stand_ins`` under ``root`` (models before the components
    released for them); each folder appears whole or not at all. Returns ``{name: folder}``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(tokenizer))
    written = {}
    models_first = sorted(stand_ins, key=lambda k: stand_ins[k]["arch"] in ("medusa", "prompt_tokens"))
    for name in models_first:
        spec = stand_ins[name]
        arch = spec["arch"]
        folder = root / hub_id(name)
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            if arch in ("llama", "t5", "mt5"):
                if "layers" not in spec:
                    raise UserError(f"stand-in {name!r} ({arch}) names no layers; valid: the original's depth")
                model = llama(name, spec["layers"], tok) if arch == "llama" else t5(name, spec["layers"], tok,
                                                                                    arch == "mt5")
                model.save_pretrained(tmp)
                tok.save_pretrained(tmp)
            else:
                missing = [k for k in (("base", "heads") if arch == "medusa" else ("base", "m", "n")) if k not in spec]
                if missing:
                    raise UserError(f"stand-in {name!r} ({arch}) names no {', '.join(missing)}")
                dims = _base_dims(spec["base"], stand_ins, root)
                if arch == "medusa":
                    medusa_released(tmp, name, spec["base"], spec["heads"], dims)
                else:
                    prompt_tokens_released(tmp, name, spec["base"], spec["m"], spec["n"], dims)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        written[name] = str(folder)
        print(f"{name}: {arch} -> {folder}", flush=True)
    return written


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="a profile with stand_ins and model_root (paper-tiny)")
    ap.add_argument("--tokenizer", default="smollm2-135m-instruct", help="the model whose tokenizer every stand-in takes")
    a = ap.parse_args(argv)
    p = load_profile(profile=a.profile)
    stand_ins, root = p.raw.get("stand_ins"), p.raw.get("model_root")
    if not stand_ins or not root:
        raise UserError(f"profile {a.profile!r} has no stand_ins and model_root; valid: a profile that names both "
                        "(paper-tiny)")
    root = Path(root)
    written = build(dict(stand_ins), root, a.tokenizer)
    write_json(root / DONE, {"profile": a.profile, "tokenizer": a.tokenizer, "hidden": HIDDEN, "stand_ins": written})


if __name__ == "__main__":
    cli_main(main)
