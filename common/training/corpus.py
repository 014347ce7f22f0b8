"""The self-distillation corpus at scale: the base model's greedy answers to ShareGPT first
turns, written as shards that a killed run resumes without redoing finished ones.

Every trained component (Medusa heads, the distilled draft, BiLD's small models, prompt
tokens, FIRP's maps, PPD's heads, EAGLE's head) learns to predict what *this* model says
next, and this model can write as much of that as we ask. The corpus is built once and
shared:

* **Held-out shard** (``heldout.npz``): the first ``heldout`` prompts, answered in fp32, the
  same prompts for every component so their held-out accuracies compare.
* **Training shards** (``shard-00000.npz``, ...): shard ``k`` answers prompts
  ``[heldout + k * shard_prompts, heldout + (k + 1) * shard_prompts)``, so no training shard
  ever contains a held-out prompt (tested). They are generated in ``gen_dtype`` (bf16 by
  default: twice fp32's tokens/s here on the CPU's bf16 units). The text is then the bf16
  model's greedy answer, which agrees with fp32's on nearly every token; trainers take their
  labels from an fp32 teacher-forced pass over it (the greedy next token at each position of
  this text), which is exactly what a decoder sees after that prefix.
* **Manifest** (``corpus.json``): the recipe (model identity, tokenizer identity, prompts,
  lengths, dtype) and, per finished shard, its file, SHA-256, sizes and wall time. A shard
  file is written to a temporary name and renamed, then the manifest is rewritten the same
  way, so a killed run leaves only finished shards; the next run checks each against its
  hash and continues with the first missing one. A directory written for another recipe,
  model or tokenizer is refused with one ``error:`` line naming the mismatch.

Within a shard the prompts are batched by length (sorted, so left padding stays small) and
answered with transformers' ``generate`` on the fast path; the result does not depend on
what ran before, so resuming gives the same shards as an uninterrupted run (tested on a
tiny model). Shard files hold token ids only (int32, compressed): ~5 bytes per token.

CLI: ``python -m common.training.corpus --model smollm2-135m-instruct --out DIR --tokens 1000000``.

A small answer set in one cached file (:func:`answer_set`: ``corpus.pt``, ``seqcorpus.pt``, for
a model the shards were not made by, a variant's own base model, or a profile that reads no
shards) comes from the same generator, through the ``answers`` subcommand:
``python -m common.training.corpus answers --model M --out FILE --prompts 32 [--skip 32]``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from tqdm import tqdm

from ..checks import differences
from ..errors import UserError, check_range
from ..engine.fast import cast_copy
from ..hardware import bf16_note
from ..paths import atomic_write, file_sha256, load_json, load_or_error, short_reason

MANIFEST = "corpus.json"
HELDOUT = "heldout.npz"
VERSION = 1


@dataclass(frozen=True)
class Recipe:
    """What a corpus directory holds; every field must match to add shards to it."""
    model: str                      # registry name or path, as given
    model_id: str                   # :func:`model_identity`
    tokenizer_id: str               # :func:`tokenizer_identity`
    dataset: str = "sharegpt"
    heldout: int = 64               # first prompts, held out (answered in fp32)
    shard_prompts: int = 256        # prompts per training shard
    answer_tokens: int = 128        # cap on each answer
    max_prompt_tokens: int = 256    # prompts keep their last tokens
    gen_dtype: str = "bfloat16"     # training shards' generation dtype
    batch_size: int = 64            # answers per generate call (tokens/s peaks near 64 here)
    eos: int = 2
    version: int = VERSION
    # the held-out shard's answer cap (None: answer_tokens); a corpus of longer answers keeps the
    # 128-token held-out shard of the first corpus, so before/after accuracies compare
    heldout_answer_tokens: int | None = None


@dataclass(frozen=True)
class Shard:
    """One shard's sequences: prompt + answer ids, concatenated.

    ``tokens``: ``[T]`` int32; ``offsets``: ``[n + 1]`` (sequence i is
    ``tokens[offsets[i]:offsets[i + 1]]``); ``starts``: ``[n]`` prompt lengths (the answer
    starts there); ``prompt_index``: ``[n]`` indices into the dataset's prompt order.
    """
    tokens: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray
    prompt_index: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def answer_tokens(self) -> int:
        return int((np.diff(self.offsets) - self.starts).sum())

    def sequences(self) -> list[dict]:
        """``[{"ids": [...], "start": int, "prompt": int}]`` (what the trainers take)."""
        return [{"ids": self.tokens[self.offsets[i]:self.offsets[i + 1]].tolist(), "start": int(self.starts[i]),
                 "prompt": int(self.prompt_index[i])} for i in range(len(self))]


# -- identities -------------------------------------------------------------------------------
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def model_identity(model) -> str:
    """The model's config and a sample of its weights (in fp32, so a bf16 copy of the same
    model has the same identity)."""
    cfg = model.config.to_dict()
    keep = {k: cfg.get(k) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "intermediate_size")}
    emb = model.get_input_embeddings().weight.detach()[:64].float().cpu().numpy().tobytes()
    return _sha(json.dumps(keep, sort_keys=True).encode() + emb)


def tokenizer_identity(tokenizer) -> str:
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return _sha(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())


# -- files ------------------------------------------------------------------------------------
def write_shard(path: Path, shard: Shard) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, tokens=shard.tokens, offsets=shard.offsets, starts=shard.starts,
                                prompt_index=shard.prompt_index)
    atomic_write(path, write, keep="the shards already finished")


def read_shard(path: Path, sha256: str | None = None) -> Shard:
    """Load a shard; a truncated or altered file (hash mismatch, unreadable archive) is one error."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"corpus shard {path} is missing; run the corpus build again to regenerate it")
    if sha256 is not None and file_sha256(path) != sha256:
        raise UserError(f"corpus shard {path} is truncated or altered (SHA-256 differs from the manifest); "
                        "delete it and run the corpus build again to regenerate it")
    try:
        with np.load(path) as z:
            shard = Shard(z["tokens"], z["offsets"], z["starts"], z["prompt_index"])
    except Exception as e:  # a damaged archive raises zipfile.BadZipFile, EOFError, ValueError, KeyError, ...
        raise UserError(f"corpus shard {path} is unreadable ({short_reason(e)}); delete it and run the "
                        "corpus build again") from e
    if len(shard.offsets) != len(shard.starts) + 1 or int(shard.offsets[-1]) != len(shard.tokens):
        raise UserError(f"corpus shard {path} is inconsistent (offsets do not cover its tokens)")
    return shard


def read_manifest(out: Path) -> dict | None:
    """The corpus directory's manifest, or None where there is none yet; a damaged one (it is
    rewritten atomically after every shard, so only a hand or a disk damages it) is one error."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        return None
    manifest = load_json(path, "corpus manifest", "restore it or delete the directory and build the corpus again")
    if not {"recipe", "heldout", "shards"} <= manifest.keys():
        raise UserError(f"corpus manifest {path} lacks recipe, heldout or shards; restore it or delete the directory "
                        "and build the corpus again")
    return manifest


def write_manifest(out: Path, manifest: dict) -> None:
    atomic_write(Path(out) / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"),
                 keep="the shards already finished")


def check_recipe(found: dict, recipe: Recipe, out: Path) -> None:
    """Refuse a directory built for another recipe, naming the first fields that differ and their count."""
    if diff := differences(found, dataclasses.asdict(recipe)):
        raise UserError(f"corpus directory {out} was built with another recipe ({diff}); "
                        "use another --out or the same settings")


# -- generation -------------------------------------------------------------------------------
def greedy_answers(model, prompts: list[list[int]], answer_tokens: int, eos: int, batch_size: int,
                   pad: int | None = None) -> list[list[int]]:
    """The model's greedy answers to ``prompts`` (each cut after its first EOS, EOS kept).

    Prompts are answered in batches of similar length (sorted by length, left-padded), so
    padding stays small; the order of the returned answers is the order of ``prompts``.
    """
    pad = eos if pad is None else pad
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    answers: list[list[int]] = [[] for _ in prompts]
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long, device=model.device)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(idx):
            p = prompts[i]
            ids[j, width - len(p):] = torch.tensor(p, device=model.device)
            mask[j, width - len(p):] = 1
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=answer_tokens,
                                 pad_token_id=pad, eos_token_id=eos, temperature=None, top_p=None, top_k=None)
        for j, i in enumerate(idx):
            a = gen[j, width:].tolist()
            answers[i] = a[: a.index(eos) + 1] if eos in a else a
    return answers


def make_shard(model, prompts: list[list[int]], first_index: int, answer_tokens: int, eos: int,
               batch_size: int) -> Shard:
    answers = greedy_answers(model, prompts, answer_tokens, eos, batch_size)
    seqs = [p + a for p, a in zip(prompts, answers)]
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum()))
    return Shard(tokens, offsets, np.array([len(p) for p in prompts], dtype=np.int32),
                 np.arange(first_index, first_index + len(prompts), dtype=np.int64))


DATASETS = ("sharegpt", "sharegpt-turns")


def sharegpt_prompts(tokenizer, dataset: str, max_prompt_tokens: int, heldout: int = 64
                     ) -> Callable[[int, int], list[list[int]]]:
    """``prompts(start, stop)``: prompts ``[start, stop)`` of ``dataset`` through the chat
    template, each keeping its last ``max_prompt_tokens`` tokens (the generation prompt).

    ``sharegpt``: the first human turns, alone. ``sharegpt-turns``: every human turn with its
    conversation so far (:func:`common.assets.data.sharegpt_turns`); its first ``heldout`` prompts are
    ``sharegpt``'s, so both corpora share one held-out shard. Prompts are encoded only when
    asked for (a shard at a time).
    """
    from ..assets.data import load_dataset_samples, sharegpt_turns
    from ..assets.prompts import encode_messages, encode_prompt

    if dataset not in DATASETS:
        from ..errors import unknown
        raise unknown("corpus dataset", dataset, DATASETS)
    if dataset == "sharegpt":
        samples = load_dataset_samples(dataset)

        def prompts(start: int, stop: int) -> list[list[int]]:
            return [encode_prompt(tokenizer, s.turns[0], max_prompt_tokens=max_prompt_tokens)[0].tolist()
                    for s in samples[start:stop]]
        prompts.total = len(samples)
        return prompts
    turns = sharegpt_turns(heldout)

    def prompts(start: int, stop: int) -> list[list[int]]:
        return [encode_messages(tokenizer, msgs, max_prompt_tokens)[0].tolist() for _, msgs in turns[start:stop]]
    prompts.total = len(turns)
    return prompts


def build(out: Path, model, recipe: Recipe, prompts: Callable[[int, int], list[list[int]]], total_prompts: int,
          tokens: int | None = None, max_shards: int | None = None, progress: bool = True) -> dict:
    """Add shards to ``out`` until it holds ``tokens`` training answer tokens (or every prompt
    is answered, or ``max_shards`` new shards were written this call). Returns the manifest.

    The model is used in its own dtype for the held-out shard (load it in fp32) and cast to
    ``recipe.gen_dtype`` for the training shards (a copy; the caller's model is unchanged).
    """
    if tokens is not None:
        check_range("tokens", tokens, 1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out)
    if manifest is None:
        manifest = {"recipe": dataclasses.asdict(recipe), "heldout": None, "shards": []}
    check_recipe(manifest["recipe"], recipe, out)
    for tmp in out.glob(".*.partial"):  # a killed writer's leftovers; never a finished shard
        tmp.unlink(missing_ok=True)
    for s in manifest["shards"] + ([manifest["heldout"]] if manifest["heldout"] else []):
        read_shard(out / s["file"], s["sha256"])  # every finished shard still valid before adding more

    if manifest["heldout"] is None:
        t = time.perf_counter()
        shard = make_shard(model, prompts(0, recipe.heldout), 0, recipe.heldout_answer_tokens or recipe.answer_tokens,
                           recipe.eos, recipe.batch_size)
        write_shard(out / HELDOUT, shard)
        manifest["heldout"] = {"file": HELDOUT, "sha256": file_sha256(out / HELDOUT), "sequences": len(shard),
                               "answer_tokens": shard.answer_tokens, "dtype": str(model.dtype).replace("torch.", ""),
                               "wall_s": round(time.perf_counter() - t, 2)}
        write_manifest(out, manifest)

    gen = model if recipe.gen_dtype == str(model.dtype).replace("torch.", "") else \
        cast_copy(model, getattr(torch, recipe.gen_dtype))
    if gen is not model and (note := bf16_note(recipe.gen_dtype, str(model.device))):
        print(note, file=sys.stderr)
    have = sum(s["answer_tokens"] for s in manifest["shards"])
    n_shards = (total_prompts - recipe.heldout) // recipe.shard_prompts  # whole shards only
    goal = tokens if tokens is not None else n_shards * recipe.shard_prompts * recipe.answer_tokens
    bar = tqdm(total=goal, initial=min(have, goal), unit="tok", desc="corpus answer tokens", disable=not progress,
               smoothing=0.1)
    written = 0
    k = len(manifest["shards"])
    while have < goal and k < n_shards and (max_shards is None or written < max_shards):
        start = recipe.heldout + k * recipe.shard_prompts
        t = time.perf_counter()
        shard = make_shard(gen, prompts(start, start + recipe.shard_prompts), start, recipe.answer_tokens,
                           recipe.eos, recipe.batch_size)
        name = f"shard-{k:05d}.npz"
        write_shard(out / name, shard)
        wall = time.perf_counter() - t
        manifest["shards"].append({"file": name, "sha256": file_sha256(out / name), "sequences": len(shard),
                                   "first_prompt": start, "answer_tokens": shard.answer_tokens,
                                   "wall_s": round(wall, 2),
                                   "answer_tok_s": round(shard.answer_tokens / max(wall, 1e-9), 1)})
        write_manifest(out, manifest)
        have += shard.answer_tokens
        bar.update(shard.answer_tokens)
        bar.set_postfix(shards=k + 1, tok_s=f"{shard.answer_tokens / max(wall, 1e-9):.0f}")
        k, written = k + 1, written + 1
    bar.close()
    return manifest


# -- answer sets: a few prompts' answers in one cached file ----------------------------------
def answer_set(model, tokenizer, n_prompts: int, max_new_tokens: int, max_prompt_tokens: int | None = 256,
               batch_size: int = 8, dataset: str = "sharegpt", skip: int = 0) -> list[dict]:
    """The model's greedy answers to the ``n_prompts`` first turns of ``dataset`` after the first
    ``skip`` (a training set skips the held-out ones), made by :func:`greedy_answers` like every
    shard: a small set for a model the sharded corpus was not made by (a variant's own base
    model) or a profile that reads no shards.

    Returns:
        ``n_prompts`` dicts ``{"ids": [prompt + answer ids], "start": len(prompt)}``.
    """
    check_range("max_new_tokens", max_new_tokens, 1)
    _, prompts = first_turns(tokenizer, n_prompts, skip, max_prompt_tokens, dataset)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    answers = greedy_answers(model, prompts, max_new_tokens, tokenizer.eos_token_id, batch_size, pad=pad)
    return [{"ids": p + a, "start": len(p)} for p, a in zip(prompts, answers)]


def first_turns(tokenizer, n: int, skip: int = 0, max_prompt_tokens: int | None = 256,
                dataset: str = "sharegpt") -> tuple[list, list[list[int]]]:
    """The ``n`` samples of ``dataset`` after the first ``skip`` and their first human turns as
    prompt ids under the chat template (each keeping its last ``max_prompt_tokens`` tokens): the
    prompts an answer set answers and a reference-text set (:func:`common.training.teacher.sharegpt_text`)
    pairs with its replies, read one way.

    Returns:
        ``(samples, prompts)``: ``n`` :class:`~common.assets.data.Sample` and ``n`` id lists.
    """
    from ..assets.data import load_dataset_samples
    from ..assets.prompts import encode_prompt

    check_range("n", n, 1)
    check_range("skip", skip, 0)
    samples = load_dataset_samples(dataset, n=skip + n)[skip:]
    if len(samples) < n:
        raise UserError(f"{dataset} has {len(samples) + skip} samples, fewer than skip + n = {skip + n}")
    return samples, [encode_prompt(tokenizer, s.turns[0], max_prompt_tokens=max_prompt_tokens)[0].tolist()
                     for s in samples]


def answer_set_key(**kw) -> dict:
    """:func:`answer_set`'s settings as a cache key: only those that differ from its defaults
    (``None`` meaning the default), so every caller names one set by one key."""
    import inspect

    defaults = {k: p.default for k, p in inspect.signature(answer_set).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {k: v for k, v in kw.items() if v is not None and (k not in defaults or v != defaults[k])}


def cached_set(path: Path, **kw) -> list[dict] | None:
    """The answer set cached in ``path`` when it was made with these settings (``kw``:
    :func:`answer_set`'s), else None; read without a model, so a caller can skip loading one. A
    damaged file is one UserError naming it."""
    path = Path(path)
    if not path.is_file():
        return None
    data = load_or_error(path, torch.load, "answer set", "delete it; it is rebuilt on the next run")
    return data["corpus"] if isinstance(data, dict) and data.get("kw") == answer_set_key(**kw) else None


def load_or_build_set(path: Path, model, tokenizer, **kw) -> list[dict]:
    """The answer set cached in ``path`` (git-ignored; several trainers share it), built when the
    file is missing or was made with other settings. ``kw``: :func:`answer_set`'s settings."""
    kw = answer_set_key(**kw)
    path = Path(path)
    if (answers := cached_set(path, **kw)) is not None:
        return answers
    answers = answer_set(model, tokenizer, **kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: torch.save({"kw": kw, "corpus": answers}, tmp))
    return answers


# -- reading ----------------------------------------------------------------------------------
def open_corpus(out: Path, model=None, tokenizer=None) -> dict:
    """The manifest of a finished-or-growing corpus, checked against ``model`` / ``tokenizer``
    when given (a corpus of another model or tokenizer is refused, never mixed in)."""
    out = Path(out)
    manifest = read_manifest(out)
    if manifest is None:
        raise UserError(f"{out} holds no corpus ({MANIFEST} is missing); build one with python -m common.training.corpus")
    rec = manifest["recipe"]
    if model is not None and rec["model_id"] != model_identity(model):
        raise UserError(f"corpus {out} was generated by another model ({rec['model']}, id {rec['model_id']}); "
                        f"this model's id is {model_identity(model)}")
    if tokenizer is not None and rec["tokenizer_id"] != tokenizer_identity(tokenizer):
        raise UserError(f"corpus {out} was tokenized by another tokenizer (id {rec['tokenizer_id']}, "
                        f"this one {tokenizer_identity(tokenizer)})")
    return manifest


def iter_shards(out: Path, tokens: int | None = None) -> Iterator[Shard]:
    """Training shards one at a time (memory stays one shard), until ``tokens`` answer tokens."""
    out = Path(out)
    manifest = open_corpus(out)
    seen = 0
    for s in manifest["shards"]:
        if tokens is not None and seen >= tokens:
            return
        yield read_shard(out / s["file"], s["sha256"])
        seen += s["answer_tokens"]


def heldout(out: Path) -> Shard:
    manifest = open_corpus(out)
    if not manifest["heldout"]:
        raise UserError(f"corpus {out} has no held-out shard yet")
    return read_shard(Path(out) / manifest["heldout"]["file"], manifest["heldout"]["sha256"])


def summary(out: Path) -> dict:
    m = open_corpus(out)
    shards = m["shards"]
    wall = sum(s["wall_s"] for s in shards)
    toks = sum(s["answer_tokens"] for s in shards)
    return {"shards": len(shards), "sequences": sum(s["sequences"] for s in shards), "answer_tokens": toks,
            "wall_s": round(wall, 1), "answer_tok_s": round(toks / wall, 1) if wall else None,
            "heldout_sequences": m["heldout"]["sequences"] if m["heldout"] else 0,
            "disk_bytes": sum((Path(out) / s["file"]).stat().st_size for s in shards + ([m["heldout"]] if m["heldout"] else []))}


def _answers_main(argv) -> None:
    """``python -m common.training.corpus answers``: :func:`load_or_build_set` from flags."""
    from ..checks import ArgumentParser, check_device, check_out_path, check_positive_int
    from ..assets.models import load_model

    ap = ArgumentParser(prog="python -m common.training.corpus answers",
                        description="build a small answer set (the model's greedy answers, one cached file)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True, help="the answer set's file (e.g. corpus.pt)")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--skip", type=int, default=0, help="answer the prompts after the first SKIP (held out)")
    ap.add_argument("--max-prompt-tokens", type=int, default=None, help="cut prompts to their last N tokens")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the model generates (cpu, cuda, cuda:N)")
    a = ap.parse_args(argv)
    # every cheap check before the model loads (minutes on a large one)
    for name in ("prompts", "answer_tokens", "max_prompt_tokens", "threads"):
        check_positive_int(f"--{name.replace('_', '-')}", getattr(a, name))
    check_range("--skip", a.skip, 0)
    check_out_path(a.out)
    device = str(check_device(a.device))
    kw = {"n_prompts": a.prompts, "max_new_tokens": a.answer_tokens, "skip": a.skip,
          "max_prompt_tokens": a.max_prompt_tokens}
    answers = cached_set(a.out, **kw)  # a set already made (or a damaged file) needs no model
    if answers is None:
        if a.threads:
            torch.set_num_threads(a.threads)
        model, tok = load_model(a.model, device=device)
        answers = load_or_build_set(a.out, model, tok, **kw)
    print(f"{len(answers)} sequences, {sum(len(c['ids']) - c['start'] for c in answers)} answer tokens -> {a.out}")


def _main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["answers"]:  # the small answer set; without a subcommand, the shards
        return _answers_main(argv[1:])
    from ..checks import ArgumentParser, check_device, check_positive_int
    from ..assets.models import load_model

    ap = ArgumentParser(prog="python -m common.training.corpus",
                        description="build (or continue) the sharded self-distillation corpus",
                        epilog="a small answer set in one file instead: python -m common.training.corpus answers --help")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True, help="corpus directory (shards + corpus.json)")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="training answer tokens to reach")
    ap.add_argument("--max-shards", type=int, default=None, help="stop after this many new shards")
    ap.add_argument("--dataset", default="sharegpt", choices=DATASETS,
                    help="sharegpt: first human turns; sharegpt-turns: every human turn with its conversation so far")
    ap.add_argument("--heldout-answer-tokens", type=int, default=None,
                    help="the held-out shard's answer cap (default: --answer-tokens)")
    for f in dataclasses.fields(Recipe):
        if f.name in ("heldout", "shard_prompts", "answer_tokens", "max_prompt_tokens", "batch_size"):
            ap.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default)
    ap.add_argument("--gen-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--summary", action="store_true", help="print the corpus's summary and exit")
    ap.add_argument("--stats-out", type=Path, default=None,
                    help="also write the summary (shards, tokens, tok/s, disk) as JSON here (the workflow's output)")
    a = ap.parse_args(argv)
    if a.summary:
        print(json.dumps(summary(a.out), indent=1))
        return
    for name in ("heldout", "shard_prompts", "answer_tokens", "max_prompt_tokens", "batch_size"):
        check_range(name, getattr(a, name), 1)
    if a.heldout_answer_tokens is not None:
        check_range("heldout_answer_tokens", a.heldout_answer_tokens, 1)
    # every cheap check before the model loads (minutes on a large one)
    for name in ("tokens", "max_shards", "threads"):
        check_positive_int(f"--{name.replace('_', '-')}", getattr(a, name))
    device = str(check_device(a.device))
    if a.out.exists() and not a.out.is_dir():
        raise UserError(f"--out {a.out} is a file; valid: a corpus directory (new or one to continue)")
    from ..records import traced_path
    a.out = traced_path(a.out)  # shards under results/ only from committed code (else one error line)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, tok = load_model(a.model, device=device, fast=True)
    eos = tok.eos_token_id if tok.eos_token_id is not None else model.config.eos_token_id
    recipe = Recipe(model=a.model, model_id=model_identity(model), tokenizer_id=tokenizer_identity(tok),
                    dataset=a.dataset, heldout=a.heldout, shard_prompts=a.shard_prompts,
                    answer_tokens=a.answer_tokens, max_prompt_tokens=a.max_prompt_tokens, gen_dtype=a.gen_dtype,
                    batch_size=a.batch_size, eos=int(eos), heldout_answer_tokens=a.heldout_answer_tokens)
    prompts = sharegpt_prompts(tok, a.dataset, a.max_prompt_tokens, a.heldout)
    build(a.out, model, recipe, prompts, prompts.total, tokens=a.tokens, max_shards=a.max_shards)
    stats = {**summary(a.out), "recipe": dataclasses.asdict(recipe), "goal_tokens": a.tokens}
    if a.stats_out:
        from ..records import write_json
        write_json(a.stats_out, stats)
    print(json.dumps(stats))


if __name__ == "__main__":
    from ..errors import cli_main
    cli_main(_main)
