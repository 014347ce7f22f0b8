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
* **Parallel prompt decoding**'s prompt tokens: converted by the prompt-decoding package's own
  ``released`` module (a paper package's component converts in its package, with these readers): a
  PEFT prompt-tuning adapter, ``adapter_config.json`` (``num_special_tokens`` m,
  ``virtual_tokens_per_special_token`` n, ``vt_attention_type``, ``aggregation_type``,
  ``use_custom_lm_head``, ``use_prefix_tuning``, ``num_exits``) and ``adapter_model.safetensors``
  (or ``.bin``) holding ``prompt_embeddings`` ``[m*n, H]``, prompt token major (their position
  ids repeat each prompt token's position n times); ``weighting_layers.pt`` (``{j}.weight``
  ``[1, n]``) with ``aggregation_type="weighted"``, ``custom_lm_head.pt`` (``weight`` ``[V, H]``)
  with a custom head. -> that package's ``prompt_tokens`` folder (``prompts.pt``).
* **EAGLE** (SafeAILab/EAGLE, ``eagle/model/cnets1.py``, EAGLE-1/2 heads): ``config.json`` (a
  LLaMA config of one layer) and ``pytorch_model.bin`` (or ``model.safetensors``): ``fc.weight``
  ``[H, 2H]``, ``fc.bias`` ``[H]``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight`` (the
  first layer has no input norm) and optionally ``embed_tokens.weight`` (a copy of the base
  model's, not needed here). -> ``eagle``'s ``head`` folder (``head.pt``). Its ``fc`` input is
  ``[embedding; feature]``, as :class:`common.components.eagle_head.EagleHead`'s.

    python -m common.components.released_heads medusa --src FasterDecoding/medusa-vicuna-7b-v1.3 --model vicuna-7b \
        --out .cache/components/paper/medusa_released [--teacher teacher.pt]
    python -m common.components.released_heads eagle --src yuhuili/EAGLE-Vicuna-7B-v1.3 --model vicuna-7b --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ..errors import UserError, cli_main
from ..paths import load_or_error, short_reason
from ..assets.models import local_copy
from ..records import write_json

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
PEFT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
EAGLE_FILES = ("model.safetensors", "pytorch_model.bin")


# ---------------------------------------------------------------- reading the authors' folders
def source_folder(src: str | os.PathLike, files: tuple[str, ...]) -> Path:
    """A local folder, or a hub repository downloaded (only ``files`` and the configs) when
    ``src`` is an ``owner/name`` id that is not a folder here."""
    path = Path(src)
    if path.is_dir():
        return path
    copy = local_copy(str(src)) if str(src).count("/") == 1 else None
    if copy is not None:  # a local copy of the hub repository ($DECODING_REPRO_MODELS)
        return copy
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


def read_json(path: Path) -> dict:
    """A released folder's JSON config; missing, damaged or no JSON object: one UserError naming
    it and what to do (the authors' files are not ours to rebuild: fetched again)."""
    fix = "download the authors' folder again (it holds this file)"
    if not path.is_file():
        raise UserError(f"{path} does not exist; {fix}")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e.msg} at line {e.lineno}); {fix}") from e
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: invalid JSON (not UTF-8 text: {e.reason} at byte {e.start}); {fix}") from e
    except OSError as e:
        raise UserError(f"{path} is unreadable ({short_reason(e)}); {fix}") from e
    if not isinstance(obj, dict):
        raise UserError(f"{path}: invalid JSON (a {type(obj).__name__}, not an object); {fix}")
    return obj


def read_tensors(folder: Path, names: tuple[str, ...]) -> tuple[dict[str, torch.Tensor], Path]:
    """The first of ``names`` present in ``folder`` as a flat ``{key: tensor}`` (safetensors or
    a pickled state dict, read with ``weights_only``)."""
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        fix = "delete it and download the authors' folder again"
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_or_error(path, lambda p: load_file(str(p)), "released checkpoint", fix), path
        state = load_or_error(path, lambda p: torch.load(p, map_location="cpu", weights_only=True),
                              "released checkpoint", fix)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(f"{path} is not a state dict of tensors")
        return state, path
    raise UserError(f"{folder} holds none of {', '.join(names)}; valid: the folder as its authors publish it")


def tensor_of(state: dict, key: str, shape: tuple[int, ...], path: Path) -> torch.Tensor:
    if key not in state:
        raise UserError(f"{path} has no tensor {key!r}; it has: {', '.join(sorted(state)[:12])}")
    t = state[key]
    if tuple(t.shape) != shape:
        raise UserError(f"{path}: {key!r} has shape {list(t.shape)}, not {list(shape)} (this base model's); "
                        "valid: a checkpoint released for this base model")
    return t.float()


def check_base(model, stated: str | None, path: Path) -> None:
    """The base model the authors name must be this one (by its last path component, as
    :func:`common.training.loop.fingerprint` names models)."""
    from ..training.loop import fingerprint

    base = fingerprint(model)["base"]
    if stated and Path(str(stated)).name != base:
        raise UserError(f"{path} was released for {stated}, not for this model ({base}); valid: the "
                        "checkpoint of the model the profile runs")


def write_provenance(out: Path, kind: str, src, folder: Path, config: dict) -> None:
    write_json(out / "released.json", {"kind": kind, "source": str(src), "folder": str(folder), "config": config})


# ---------------------------------------------------------------- Medusa-1
def convert_medusa(src, model, out: str | os.PathLike, teacher: dict | None = None) -> dict:
    """Medusa-1 heads as their authors publish them -> a ``medusa`` heads folder for ``model``.

    Args:
        src: the authors' folder (``config.json`` + ``medusa_lm_head.pt``) or hub id.
        model: the base model (its hidden size, vocabulary and name are checked).
        teacher: a teacher cache (:func:`common.training.teacher.read_cache`): the heads' top-k
            accuracies are measured on its held-out answers, as after training, and the trees
            built for them; without one the trees are built for ``tree_search.PRIOR_ACC``.
    Returns:
        the stats written to ``out/stats.json``.
    """
    from .medusa_heads import TREE_SIZES, HeadData, evaluate, heads_meta, new_heads
    from ..training.loop import save_trained
    from ..engine.tree import save_tree
    from ..engine.tree_search import PRIOR_ACC, best_tree, expected_accept_length

    folder = source_folder(src, MEDUSA_FILES)
    cfg = read_json(folder / "config.json")
    for key in ("medusa_num_heads", "medusa_num_layers"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise UserError(f"{folder / 'config.json'}: {key} must be a positive integer; got {cfg.get(key)!r}")
    K, L = cfg["medusa_num_heads"], cfg["medusa_num_layers"]
    if L != 1:
        raise UserError(f"{folder / 'config.json'}: medusa_num_layers={L}; valid: 1 (Medusa-1's released heads; "
                        "this repository's heads have one residual block)")
    check_base(model, cfg.get("base_model_name_or_path"), folder / "config.json")
    state, path = read_tensors(folder, MEDUSA_FILES)
    H, V = model.config.hidden_size, model.config.vocab_size
    heads = new_heads(model, K, share_lm_head=False)
    with torch.no_grad():
        for k in range(K):
            block, out_proj = heads.blocks[k].linear, heads.out[k]
            block.weight.copy_(tensor_of(state, f"{k}.0.linear.weight", (H, H), path))
            block.bias.copy_(tensor_of(state, f"{k}.0.linear.bias", (H,), path))
            out_proj.weight.copy_(tensor_of(state, f"{k}.{L}.weight", (V, H), path))
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
    write_provenance(out, "medusa", src, folder, cfg)
    return stats


# ---------------------------------------------------------------- EAGLE
def convert_eagle(src, model, out: str | os.PathLike) -> dict:
    """EAGLE-1/2's released draft head -> an ``eagle`` ``head`` folder for ``model``; returns its
    meta. The head's width, heads and MLP must be the base model's (one error naming the key)."""
    from ..checkpoints import save_trained
    from .eagle_head import CHECKPOINT, head_meta, new_head

    folder = source_folder(src, EAGLE_FILES)
    cpath = folder / "config.json"
    cfg = read_json(cpath)
    layers = cfg.get("num_hidden_layers", 1)
    if layers != 1:
        raise UserError(f"{cpath}: num_hidden_layers={layers}; EAGLE-1/2 heads have one decoder layer (valid: 1)")
    check_base(model, cfg.get("base_model_name_or_path"), cpath)
    state, path = read_tensors(folder, EAGLE_FILES)
    head = new_head(model)
    H = model.config.hidden_size
    own = head.state_dict()
    loaded = {"fc.weight": tensor_of(state, "fc.weight", (H, 2 * H), path)}
    if "fc.bias" in own:
        loaded["fc.bias"] = tensor_of(state, "fc.bias", (H,), path)
    for key, value in own.items():
        if key.startswith("layer."):
            loaded[key] = tensor_of(state, "layers.0." + key[len("layer."):], tuple(value.shape), path)
    missing = sorted(set(own) - set(loaded))
    if missing:
        raise UserError(f"{path}: no weights for {', '.join(missing)}")
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in loaded.items()})
    meta = {**head_meta(model), "released": str(src)}
    out = Path(out)
    save_trained(head, out / CHECKPOINT, meta)
    write_provenance(out, "eagle", src, folder, cfg)
    return meta


CONVERTERS = {"medusa": convert_medusa, "eagle": convert_eagle}


def _main(argv=None) -> None:
    from ..assets.models import DTYPES, load_model

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
        from ..training.teacher import read_cache

        result = convert_medusa(a.src, model, a.out, None if a.teacher is None else read_cache(a.teacher))
    else:
        result = CONVERTERS[a.kind](a.src, model, a.out)
    print(f"{a.kind} from {a.src} -> {a.out}: {json.dumps(result.get('trees', result), default=str)}")


if __name__ == "__main__":
    cli_main(_main)
