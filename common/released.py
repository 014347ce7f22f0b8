"""The papers' released components, converted into this repository's component folders.

Each converter reads a checkpoint folder exactly as its authors publish it (a local folder, or
a hub repository id, downloaded when the hub is on) and writes the folder the matching decoder
option reads, with a ``released.json`` naming its source:

* **Medusa-1** (FasterDecoding/Medusa, ``medusa/model/medusa_model.py``): ``config.json``
  (``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``) and
  ``medusa_lm_head.pt`` (or ``.safetensors``), the state dict of ``nn.ModuleList`` of heads,
  head ``k`` = ``nn.Sequential(ResBlock x L, nn.Linear(H, V, bias=False))``: keys
  ``{k}.{l}.linear.weight`` ``[H, H]``, ``{k}.{l}.linear.bias`` ``[H]`` and ``{k}.{L}.weight``
  ``[V, H]``. -> ``medusa``'s ``heads`` folder (``heads.pt``, ``tree_{16,32,63}.json``,
  ``stats.json``). The authors' ``[ResBlock(H)] * L`` repeats one block, so with ``L > 1`` it
  runs L times; this repository's heads have one block, so only ``L = 1`` (what the released
  Medusa-1 heads use) converts.
* **Parallel prompt decoding** (hmarkc/parallel-prompt-decoding, ``prompt/model/model.py``): a
  PEFT prompt-tuning adapter, ``adapter_config.json`` (``num_special_tokens`` m,
  ``virtual_tokens_per_special_token`` n, ``vt_attention_type``, ``aggregation_type``,
  ``use_custom_lm_head``, ``use_prefix_tuning``, ``num_exits``) and ``adapter_model.safetensors``
  (or ``.bin``) holding ``prompt_embeddings`` ``[m*n, H]``, prompt token major (their position
  ids repeat each prompt token's position n times); ``weighting_layers.pt`` (``{j}.weight``
  ``[1, n]``) with ``aggregation_type="weighted"``, ``custom_lm_head.pt`` (``weight`` ``[V, H]``)
  with a custom head. -> ``prompt_decoding``'s ``prompt_tokens`` folder (``prompts.pt``).
* **EAGLE**: the hook is :func:`convert_eagle`; it raises until the ``eagle`` decoder exists.

    python -m common.released medusa --src FasterDecoding/medusa-vicuna-7b-v1.3 --model vicuna-7b \
        --out .cache/components/paper/medusa_released [--teacher teacher.pt]
    python -m common.released prompt_tokens --src DIR --model vicuna-7b --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from .errors import UserError, cli_main
from .records import write_json

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
PEFT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# The authors' attention among a token's prompt tokens -> this repository's EPT mask, where they
# coincide. Their "decoder" mask is causal over all m*n virtual tokens (an EPT also sees the
# earlier EPTs of its own prompt token) and their "encoder" mask lets an EPT see only its own
# prompt token's EPTs; neither is one of prompt_decoding.prompts.MASKS but with n = 1 the
# "decoder" one is the causal chain every mask here gives.
PPD_MASKS = {"ensemble": "ensemble"}


# ---------------------------------------------------------------- reading the authors' folders
def source_folder(src: str | os.PathLike, files: tuple[str, ...]) -> Path:
    """A local folder, or a hub repository downloaded (only ``files`` and the configs) when
    ``src`` is an ``owner/name`` id that is not a folder here."""
    path = Path(src)
    if path.is_dir():
        return path
    if path.exists() or str(src).startswith((".", "/", "~")) or str(src).count("/") != 1:
        raise UserError(f"released checkpoint {src} is not a folder; valid: a folder as its authors publish it, "
                        "or a hub repository id owner/name")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise UserError(f"released checkpoint {src} needs the hub (HF_HUB_OFFLINE=1 here); valid: a local copy "
                        f"(huggingface-cli download {src} --local-dir DIR)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(src), allow_patterns=[*files, "*.json", "*.pt"]))
    except Exception as e:  # the hub's errors are many classes; each ends here as one line
        raise UserError(f"could not download released checkpoint {src}: {str(e).splitlines()[0]}") from e


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path} does not exist; the authors' checkpoint folder holds it")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from e


def _read_tensors(folder: Path, names: tuple[str, ...]) -> tuple[dict[str, torch.Tensor], Path]:
    """The first of ``names`` present in ``folder`` as a flat ``{key: tensor}`` (safetensors or
    a pickled state dict, read with ``weights_only``)."""
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(path)), path
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(f"{path} is not a state dict of tensors")
        return state, path
    raise UserError(f"{folder} holds none of {', '.join(names)}; valid: the folder as its authors publish it")


def _tensor(state: dict, key: str, shape: tuple[int, ...], path: Path) -> torch.Tensor:
    if key not in state:
        raise UserError(f"{path} has no tensor {key!r}; it has: {', '.join(sorted(state)[:12])}")
    t = state[key]
    if tuple(t.shape) != shape:
        raise UserError(f"{path}: {key!r} has shape {list(t.shape)}, not {list(shape)} (this base model's); "
                        "valid: a checkpoint released for this base model")
    return t.float()


def _check_base(model, stated: str | None, path: Path) -> None:
    """The base model the authors name must be this one (by its last path component, as
    :func:`common.training.fingerprint` names models)."""
    from .training import fingerprint

    base = fingerprint(model)["base"]
    if stated and Path(str(stated)).name != base:
        raise UserError(f"{path} was released for {stated}, not for this model ({base}); valid: the "
                        "checkpoint of the model the profile runs")


def _provenance(out: Path, kind: str, src, folder: Path, config: dict) -> None:
    write_json(out / "released.json", {"kind": kind, "source": str(src), "folder": str(folder), "config": config})


# ---------------------------------------------------------------- Medusa-1
def convert_medusa(src, model, out: str | os.PathLike, teacher: dict | None = None) -> dict:
    """Medusa-1 heads as their authors publish them -> a ``medusa`` heads folder for ``model``.

    Args:
        src: the authors' folder (``config.json`` + ``medusa_lm_head.pt``) or hub id.
        model: the base model (its hidden size, vocabulary and name are checked).
        teacher: a teacher cache (:func:`common.teacher.read_cache`): the heads' top-k
            accuracies are measured on its held-out answers, as after training, and the trees
            built for them; without one the trees are built for ``tree_search.PRIOR_ACC``.
    Returns:
        the stats written to ``out/stats.json``.
    """
    from .medusa import TREE_SIZES, HeadData, evaluate, heads_meta, new_heads
    from .training import save_trained
    from .tree import save_tree
    from .tree_search import PRIOR_ACC, best_tree, expected_accept_length

    folder = source_folder(src, MEDUSA_FILES)
    cfg = _read_json(folder / "config.json")
    for key in ("medusa_num_heads", "medusa_num_layers"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise UserError(f"{folder / 'config.json'}: {key} must be a positive integer; got {cfg.get(key)!r}")
    K, L = cfg["medusa_num_heads"], cfg["medusa_num_layers"]
    if L != 1:
        raise UserError(f"{folder / 'config.json'}: medusa_num_layers={L}; valid: 1 (Medusa-1's released heads; "
                        "this repository's heads have one residual block)")
    _check_base(model, cfg.get("base_model_name_or_path"), folder / "config.json")
    state, path = _read_tensors(folder, MEDUSA_FILES)
    H, V = model.config.hidden_size, model.config.vocab_size
    heads = new_heads(model, K, share_lm_head=False)
    with torch.no_grad():
        for k in range(K):
            block, out_proj = heads.blocks[k].linear, heads.out[k]
            block.weight.copy_(_tensor(state, f"{k}.0.linear.weight", (H, H), path))
            block.bias.copy_(_tensor(state, f"{k}.0.linear.bias", (H,), path))
            out_proj.weight.copy_(_tensor(state, f"{k}.{L}.weight", (V, H), path))
    expected = {f"{k}.{name}" for k in range(K) for name in ("0.linear.weight", "0.linear.bias", f"{L}.weight")}
    extra = sorted(set(state) - expected)
    if extra:
        raise UserError(f"{path} holds tensors beyond its {K} heads ({', '.join(extra[:4])}); valid: a Medusa-1 "
                        "head file whose config.json names every head")
    out = Path(out)
    save_trained(heads, out / "heads.pt", heads_meta(model, K, False))
    if teacher is not None:
        held = teacher["heldout"]
        acc = evaluate(heads, HeadData(held, held.answer_positions(), K, "text"))["heldout_topk"]
        source = "medusa top-k accuracy of the released heads on held-out self-distilled answers"
    else:
        acc = [row[:] for row in PRIOR_ACC[:K]]
        source = "tree_search.PRIOR_ACC (no teacher cache given: accuracies not measured)"
    stats = {"accuracy": acc, "accuracy_source": source, "meta": heads_meta(model, K, False),
             "released": str(src), "params": sum(p.numel() for p in heads.parameters()), "trees": {}}
    for n in TREE_SIZES:
        paths = best_tree(acc, n)
        stats["trees"][n] = expected_accept_length(paths, acc)
        save_tree(out / f"tree_{n}.json", paths, expected_accept_length=stats["trees"][n], source=source)
    write_json(out / "stats.json", stats)
    _provenance(out, "medusa", src, folder, cfg)
    return stats


# ---------------------------------------------------------------- parallel prompt decoding
def convert_prompt_tokens(src, model, out: str | os.PathLike) -> dict:
    """Prompt tokens as their authors publish them (a PEFT prompt-tuning adapter) -> a
    ``prompt_decoding`` ``prompt_tokens`` folder for ``model``; returns the checkpoint's meta.

    Refused (UserError naming the setting): masks that differ from this repository's (see
    :data:`PPD_MASKS`), adaptive weighting, prefix tuning and multi-exit ensembles."""
    from prompt_decoding.decoding import new_prompts, prompts_meta
    from prompt_decoding.prompts import Extras

    from .training import save_trained

    folder = source_folder(src, PEFT_FILES + ("weighting_layers.pt", "custom_lm_head.pt"))
    cpath = folder / "adapter_config.json"
    cfg = _read_json(cpath)
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
    _check_base(model, cfg.get("base_model_name_or_path"), cpath)
    H, V = model.config.hidden_size, model.config.vocab_size
    state, path = _read_tensors(folder, PEFT_FILES)
    key = next((k for k in state if k.split(".")[-1] == "prompt_embeddings"), "prompt_embeddings")
    emb = _tensor(state, key, (m * n, H), path)
    extras = Extras(aggregation=aggregation, head=bool(cfg.get("use_custom_lm_head")))
    prompts = new_prompts(model, m, n, mask, extras=extras)
    with torch.no_grad():
        # virtual token j*n + i is EPT i of prompt token j (their positions repeat_interleave n)
        prompts.embeddings.copy_(emb.reshape(m, n, H))
        if prompts.weights is not None:
            wstate, wpath = _read_tensors(folder, ("weighting_layers.pt",))
            prompts.weights.copy_(torch.stack([_tensor(wstate, f"{j}.weight", (1, n), wpath)[0] for j in range(m)]))
        if prompts.head is not None:
            hstate, hpath = _read_tensors(folder, ("custom_lm_head.pt",))
            prompts.head.weight.copy_(_tensor(hstate, "weight", (V, H), hpath))
    meta = {**prompts_meta(model, m, n, mask, extras), "released": str(src)}
    out = Path(out)
    save_trained(prompts, out / "prompts.pt", meta)
    _provenance(out, "prompt_tokens", src, folder, cfg)
    return meta


# ---------------------------------------------------------------- EAGLE (hook)
def convert_eagle(src, model, out: str | os.PathLike) -> dict:
    """EAGLE's draft head (SafeAILab/EAGLE: ``config.json`` + ``pytorch_model.bin``, one decoder
    layer over [feature, token embedding] with an ``fc`` [2H -> H]) -> the ``eagle`` decoder's
    head option. Not yet supported: this repository has no ``eagle`` decoder to load it into
    (issue 37 leaves the import to follow the comparators' issue). Raises UserError."""
    raise UserError(f"converting EAGLE's draft head ({src}) is not yet supported: there is no eagle decoder here "
                    "to load it; valid kinds: medusa, prompt_tokens")


CONVERTERS = {"medusa": convert_medusa, "prompt_tokens": convert_prompt_tokens, "eagle": convert_eagle}


def _main(argv=None) -> None:
    from .models import DTYPES, load_model

    ap = argparse.ArgumentParser(description="convert a paper's released component into this repository's format")
    ap.add_argument("kind", choices=sorted(CONVERTERS))
    ap.add_argument("--src", required=True, help="the authors' checkpoint folder, or its hub repository id")
    ap.add_argument("--model", required=True, help="the base model it was released for")
    ap.add_argument("--out", type=Path, required=True, help="the component folder to write")
    ap.add_argument("--teacher", type=Path, help="medusa: a teacher cache to measure the heads' accuracies on")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    if a.teacher is not None and a.kind != "medusa":
        raise UserError(f"--teacher applies to medusa only, not {a.kind}")
    model, _ = load_model(a.model, a.dtype, a.device)
    if a.kind == "medusa":
        from .teacher import read_cache

        result = convert_medusa(a.src, model, a.out, None if a.teacher is None else read_cache(a.teacher))
    else:
        result = CONVERTERS[a.kind](a.src, model, a.out)
    print(f"{a.kind} from {a.src} -> {a.out}: {json.dumps(result.get('trees', result), default=str)}")


if __name__ == "__main__":
    cli_main(_main)
