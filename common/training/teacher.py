"""The teacher cache: one teacher-forced pass of the frozen base model, shared by every head trainer.

Medusa heads and the distilled draft learn to predict what the *base model* says next. Instead
of generating the model's own answers (13 min for 61 k tokens on the 2-core CPU), one batched
forward over real ShareGPT text (prompt and reference reply under the chat template) gives, at
every position, the model's final normed hidden state and its own next-token distribution:
its argmax (the greedy token it would emit there) and its top-``k`` log-probabilities. Heads
then train on the model's own predictions (self-distillation) without any generation.

The held-out set is different on purpose: the base model's own *greedy* continuations
(:func:`common.training.corpus.answer_set`, of prompts the training text never contains), since that is what
decoding sees. It goes through the same pass, so every trainer reads one file:

    python -m common.training.teacher --model smollm2-135m-instruct --teacher .cache/components/embedded/teacher.pt \\
        --heldout-corpus .cache/components/embedded/corpus.pt --heldout-prompts 32 --sequences 256

The file is keyed by the model's fingerprint and every setting; a change rebuilds it.

With ``--corpus-dir`` the pass reads the sharded self-distillation corpus (:mod:`common.training.corpus`)
instead: its training shards (the model's own greedy answers, up to ``--corpus-tokens`` answer
tokens) are the training set and its held-out shard the held-out set, the same prompts for every
component. Each shard's pass is kept beside the cache (``<cache>_parts/``, keyed by the shard's
SHA-256), so a killed pass resumes at the first unfinished shard:

    python -m common.training.teacher --model smollm2-135m-instruct --teacher .cache/components/embedded/teacher.pt \\
        --corpus-dir results/corpus/embedded --corpus-tokens 1000000 [--pass-dtype bfloat16]

With ``--corpus-dir`` and ``--text-sequences N`` the training set is ShareGPT's reference text
instead (the conversations after the corpus's held-out prompts), evaluated on the same held-out
shard: BiLD's unaligned small model learns the references. Text labels need only the text, so
that set carries no teacher outputs (:func:`text_only`) and costs no forward pass. With
``--pass-dtype none`` the corpus's training shards are such a text set too (the model's own
greedy answers as text: BiLD's aligned small model learns them, as the paper fine-tunes on the
large model's generated outputs); only the held-out shard is passed, in minutes instead of hours.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch
from tqdm import tqdm

from . import corpus as corpus_mod
from ..checkpoints import fingerprint
from ..checks import ArgumentParser, check_device
from ..errors import UserError, check_range, cli_main
from ..engine.fast import cast_copy
from ..hardware import bf16_note, code_version, provenance
from ..assets.models import load_model
from ..paths import atomic_write, load_json, load_or_error
from ..records import check_start, write_json

VERSION = 1  # bump when the stored layout changes


# dtypes of the pass over a corpus's training shards; "none": no pass, the shards as a text set
PASS_DTYPES = ("bfloat16", "float32", "none")


@dataclass
class TeacherData:
    """Sequences flattened along one token axis (``N`` tokens, ``S`` sequences).

    Attributes:
        ids: ``[N]`` token ids.
        hidden: ``[N, H]`` fp16 final normed hidden states (what the LM head reads).
        argmax: ``[N]`` the model's greedy next token at each position (predicts ``ids[t+1]``).
        top_idx, top_logp: ``[N, k]`` its top-``k`` next-token ids and log-probabilities (fp16).
        offsets: ``[S + 1]`` sequence ``s`` is ``[offsets[s], offsets[s+1])``.
        start: ``[S]`` length of each sequence's prompt (its answer starts there).
    """
    ids: torch.Tensor
    hidden: torch.Tensor
    argmax: torch.Tensor
    top_idx: torch.Tensor
    top_logp: torch.Tensor
    offsets: torch.Tensor
    start: torch.Tensor

    def __len__(self) -> int:
        return self.start.numel()

    @property
    def n_tokens(self) -> int:
        return self.ids.numel()

    def span(self, s: int) -> tuple[int, int]:
        return int(self.offsets[s]), int(self.offsets[s + 1])

    def answer_positions(self) -> torch.Tensor:
        """Flat indices of positions whose next token is an answer token (``t >= start - 1``,
        ``t + 1`` inside the sequence): the positions decoding predicts from."""
        out = [torch.arange(a + int(p) - 1, b - 1) for (a, b), p in
               ((self.span(s), self.start[s]) for s in range(len(self)))]
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


class HardLabels(str, Enum):
    """Which token a model trained on hard labels of the teacher cache learns to predict after a
    position ``t`` (a ``str`` enum: its values are what flags, stats and checkpoints store)."""
    GREEDY = "greedy"  # the base model's own greedy token there (BiLD's aligned small model)
    TEXT = "text"      # the reference text's next token (BiLD's unaligned small model)

    @classmethod
    def parse(cls, value) -> "HardLabels":
        """``value`` (a member or its name) as a member; UserError naming the valid ones."""
        try:
            return cls(value)
        except ValueError:
            raise UserError(f"labels={value!r} is unknown; valid: {', '.join(m.value for m in cls)}") from None

    def at(self, data: TeacherData, positions: torch.Tensor) -> torch.Tensor:
        """``[P]`` long: the label of each flat position of ``data`` (``[P]``)."""
        if self is HardLabels.GREEDY:
            if data.argmax.numel() != data.n_tokens:
                raise UserError("greedy labels need the model's predictions, and these sequences carry none "
                                "(a text-only set); valid: labels=text, or a teacher pass over them")
            return data.argmax[positions].long()  # the model's prediction at t
        return data.ids[positions + 1].long()     # the text at t + 1


@torch.inference_mode()
def teacher_pass(model, seqs: list[dict], topk: int = 32, batch_size: int = 8,
                 desc: str = "teacher pass") -> TeacherData:
    """Teacher-forced forward of ``model`` over ``seqs`` (``{"ids": [...], "start": int}``).

    Sequences are sorted by length and batched with right padding: a causal model's real
    positions never attend to the padding after them, so no mask is needed and the padded
    positions are dropped.
    """
    check_range("topk", topk, 1)
    check_range("batch_size", batch_size, 1)
    if not seqs:
        raise UserError("teacher pass: no sequences")
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["ids"]))
    parts: dict[int, tuple] = {}
    dev = model.device
    for i in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
        chunk = order[i:i + batch_size]
        width = max(len(seqs[j]["ids"]) for j in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long, device=dev)
        for r, j in enumerate(chunk):
            ids[r, :len(seqs[j]["ids"])] = torch.tensor(seqs[j]["ids"], device=dev)
        h = model.model(input_ids=ids).last_hidden_state  # [B, T, H], after the final norm
        logp = model.lm_head(h).float().log_softmax(-1)  # [B, T, V]
        v, k = logp.topk(topk, dim=-1)
        for r, j in enumerate(chunk):
            n = len(seqs[j]["ids"])
            parts[j] = (ids[r, :n].int().cpu(), h[r, :n].half().cpu(), k[r, :n, 0].int().cpu(),
                        k[r, :n].int().cpu(), v[r, :n].half().cpu())
        del logp
    cols = list(zip(*(parts[j] for j in range(len(seqs)))))
    lengths = torch.tensor([len(s["ids"]) for s in seqs])
    return TeacherData(ids=torch.cat(cols[0]), hidden=torch.cat(cols[1]), argmax=torch.cat(cols[2]),
                       top_idx=torch.cat(cols[3]), top_logp=torch.cat(cols[4]),
                       offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                       start=torch.tensor([int(s["start"]) for s in seqs]))


def concat(parts: list[TeacherData]) -> TeacherData:
    """One :class:`TeacherData` holding ``parts``' sequences in order."""
    if not parts:
        raise UserError("teacher pass: no sequences")
    lengths = torch.cat([p.offsets.diff() for p in parts])
    return TeacherData(ids=torch.cat([p.ids for p in parts]), hidden=torch.cat([p.hidden for p in parts]),
                       argmax=torch.cat([p.argmax for p in parts]), top_idx=torch.cat([p.top_idx for p in parts]),
                       top_logp=torch.cat([p.top_logp for p in parts]),
                       offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                       start=torch.cat([p.start for p in parts]))


def text_only(seqs: list[dict]) -> TeacherData:
    """``seqs`` (``{"ids": [...], "start": int}``) as a :class:`TeacherData` without the model's
    outputs: ``hidden`` ``[N, 0]``, ``argmax`` ``[0]``, ``top_idx``/``top_logp`` ``[N, 0]``. What
    text labels read (the ids, offsets and prompt lengths) is all there; greedy labels and
    distillation refuse it (:meth:`HardLabels.at`)."""
    if not seqs:
        raise UserError("text set: no sequences")
    lengths = torch.tensor([len(s["ids"]) for s in seqs])
    n = int(lengths.sum())
    return TeacherData(ids=torch.tensor([t for s in seqs for t in s["ids"]], dtype=torch.int32),
                       hidden=torch.zeros(n, 0, dtype=torch.float16), argmax=torch.zeros(0, dtype=torch.int32),
                       top_idx=torch.zeros(n, 0, dtype=torch.int32), top_logp=torch.zeros(n, 0, dtype=torch.float16),
                       offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                       start=torch.tensor([int(s["start"]) for s in seqs]))


def from_text(model, tokenizer, corpus_dir: Path, parts: Path, sequences: int, max_len: int,
              max_prompt_tokens: int, topk: int = 32, batch_size: int = 8) -> dict:
    """ShareGPT's reference text as the training set (:func:`text_only`, ``sequences``
    conversations after the corpus's held-out prompts, so none of them is trained on) and the
    corpus's held-out shard, passed as :func:`from_corpus` passes it, as the held-out set.
    Returns what :func:`load_or_build` returns."""
    corpus_dir, parts = Path(corpus_dir), Path(parts)
    manifest = corpus_mod.open_corpus(corpus_dir, model=model, tokenizer=tokenizer)
    if not manifest["heldout"]:
        raise UserError(f"corpus {corpus_dir} has no held-out shard yet; valid: a corpus built by python -m common.training.corpus")
    parts.mkdir(parents=True, exist_ok=True)
    wall = {}
    held, w = _heldout_pass(model, manifest, corpus_dir, parts, topk, batch_size)
    untimed = _timed(wall, "heldout_pass", w)
    t = time.perf_counter()
    train = text_only(corpus_text(tokenizer, manifest, sequences, max_len, max_prompt_tokens))
    wall["train_text"] = time.perf_counter() - t
    key = _text_key(model, manifest, sequences, max_len, max_prompt_tokens, topk)
    return {"key": key, "train": train, "heldout": held, "wall_s": wall, "untimed_parts": untimed,
            "corpus": {"dir": str(corpus_dir), "heldout_sequences": manifest["heldout"]["sequences"],
                       "text_skip": text_skip(manifest)}}


def text_skip(manifest: dict) -> int:
    """How many ShareGPT samples a reference-text training set skips: the held-out shard answers
    the dataset's first ``heldout`` prompts, so the text starts after them (none after another
    dataset's held-out shard, which shares no conversation with ShareGPT)."""
    recipe = manifest["recipe"]
    return recipe["heldout"] if recipe["dataset"] == "sharegpt" else 0


def corpus_text(tokenizer, manifest: dict, sequences: int, max_len: int, max_prompt_tokens: int) -> list[dict]:
    """ShareGPT's reference replies beside a sharded corpus (its manifest, from
    :func:`common.training.corpus.open_corpus`): ``sequences`` conversations after its held-out prompts
    (:func:`text_skip`), so the held-out shard's prompts are never trained on. The training
    shards answer the conversations in the same order from the same start, so ``sequences`` equal
    to the shards' count gives the reference replies to the prompts the greedy shards answer.
    Returns :func:`sharegpt_text`'s ``[{"ids", "start"}]``."""
    return sharegpt_text(tokenizer, sequences, skip=text_skip(manifest), max_len=max_len,
                         max_prompt_tokens=max_prompt_tokens)


def _text_key(model, manifest: dict, sequences, max_len, max_prompt_tokens, topk) -> dict:
    """:func:`from_text`'s key without running it."""
    return {"version": VERSION, **fingerprint(model), "corpus": manifest["recipe"],
            "heldout": manifest["heldout"]["sha256"] if manifest["heldout"] else None,
            "text": {"dataset": "sharegpt", "sequences": sequences, "max_len": max_len,
                     "max_prompt_tokens": max_prompt_tokens}, "topk": topk}


def shard_sequences(shard: "corpus_mod.Shard", max_prompt_tokens: int | None = None) -> list[dict]:
    """A corpus shard's sequences as :func:`teacher_pass` takes them; prompts longer than
    ``max_prompt_tokens`` keep their last tokens (as the corpus itself cuts them)."""
    out = []
    for seq in shard.sequences():
        cut = 0 if max_prompt_tokens is None else max(0, seq["start"] - max_prompt_tokens)
        out.append({"ids": seq["ids"][cut:], "start": seq["start"] - cut})
    return out


def _heldout_pass(model, manifest: dict, corpus_dir: Path, parts: Path, topk: int,
                  batch_size: int) -> tuple[TeacherData, float | None]:
    """The corpus's held-out shard passed in the model's own dtype (fp32 in the embedded
    profile: its answers are greedy in the dtype decoding runs), whole prompts; kept in
    ``parts`` like every shard's pass."""
    tag = f"k{topk}.{str(model.dtype).removeprefix('torch.')}"
    return _shard_pass(model, manifest["heldout"], corpus_dir, parts, tag, topk, batch_size, None,
                       "teacher pass (held-out shard)")


def _shard_pass(model, shard_meta: dict, corpus_dir: Path, parts: Path, tag: str, topk: int, batch_size: int,
                max_prompt_tokens: int | None, desc: str) -> tuple[TeacherData, float | None]:
    """One shard's pass, read from ``parts`` when an earlier run finished it (same shard hash
    and settings, in ``tag``); written there atomically otherwise, with the seconds it took.
    Returns it and those seconds: the pass's own time also when read back, so a resumed pass
    states what the whole pass cost; None for a part written before parts kept their time."""
    path = parts / f"{Path(shard_meta['file']).stem}.{shard_meta['sha256'][:12]}.{tag}.pt"
    if path.is_file():
        fields = load_or_error(path, _tensor_dict, "teacher pass part",
                               "delete it; the next run passes that shard again")
        wall = fields.pop("wall_s", None)
        return TeacherData(**fields), None if wall is None else float(wall)
    t = time.perf_counter()
    shard = corpus_mod.read_shard(corpus_dir / shard_meta["file"], shard_meta["sha256"])
    data = teacher_pass(model, shard_sequences(shard, max_prompt_tokens), topk, batch_size, desc=desc)
    wall = time.perf_counter() - t
    atomic_write(path, lambda tmp: torch.save({**vars(data), "wall_s": wall}, tmp))
    return data, wall


def _timed(wall: dict, name: str, w: float | None) -> int:
    """Adds ``w`` seconds to ``wall[name]``; returns 1 for a part without a time (not counted as 0 s)."""
    wall[name] = wall.get(name, 0.0) + (w or 0.0)
    return int(w is None)


def from_corpus(model, corpus_dir: Path, parts: Path, tokens: int | None = None, topk: int = 32,
                batch_size: int = 8, max_prompt_tokens: int | None = None, pass_dtype: str = "bfloat16") -> dict:
    """The teacher cache of a sharded corpus (:mod:`common.training.corpus`).

    Training set: the training shards in order until ``tokens`` answer tokens (None: all),
    passed in ``pass_dtype`` (the dtype the corpus generated them in is the natural choice;
    bfloat16 runs on this CPU's bf16 units at several times fp32's tokens/s), or ``"none"``: not
    passed, a text-only set (:func:`text_only`: what text labels read); held-out set: the
    corpus's held-out shard, passed in the model's own dtype (fp32 in the embedded profile: its
    answers are greedy in the dtype decoding runs).
    Returns what :func:`load_or_build` returns; ``key`` names the shards by hash.
    """
    corpus_dir, parts = Path(corpus_dir), Path(parts)
    manifest = corpus_mod.open_corpus(corpus_dir, model=model)
    if not manifest["heldout"] or not manifest["shards"]:
        raise UserError(f"corpus {corpus_dir} has no held-out shard or no training shard yet; "
                        "valid: a corpus built by python -m common.training.corpus")
    if pass_dtype not in PASS_DTYPES:
        raise UserError(f"pass_dtype={pass_dtype!r} is unknown; valid: {', '.join(PASS_DTYPES)}")
    chosen = _chosen(manifest, tokens)
    seen = sum(s["answer_tokens"] for s in chosen)
    parts.mkdir(parents=True, exist_ok=True)
    cut = "" if max_prompt_tokens is None else f"p{max_prompt_tokens}"
    wall = {"heldout_pass": 0.0, "train_pass": 0.0}
    held, w = _heldout_pass(model, manifest, corpus_dir, parts, topk, batch_size)
    untimed = _timed(wall, "heldout_pass", w)
    info = {"dir": str(corpus_dir), "shards": len(chosen), "answer_tokens": seen}
    key = _corpus_key(model, manifest, tokens, topk, max_prompt_tokens, pass_dtype)
    if pass_dtype == "none":  # the shards' own text: read, not passed
        t = time.perf_counter()
        seqs = [seq for s in tqdm(chosen, desc=f"corpus text ({len(chosen)} shards)", unit="shard")
                for seq in shard_sequences(corpus_mod.read_shard(corpus_dir / s["file"], s["sha256"]), max_prompt_tokens)]
        train = text_only(seqs)
        del wall["train_pass"]
        wall["train_text"] = time.perf_counter() - t
        return {"key": key, "train": train, "heldout": held, "wall_s": wall, "untimed_parts": untimed, "corpus": info}
    same = getattr(torch, pass_dtype) == model.dtype
    runner = model if same else None
    if not same and (note := bf16_note(pass_dtype, str(model.device))):
        print(note, file=sys.stderr)
    train = []
    for s in tqdm(chosen, desc=f"teacher pass ({len(chosen)} corpus shards, {pass_dtype})", unit="shard"):
        tag = f"k{topk}{cut}.{pass_dtype}"
        path = parts / f"{Path(s['file']).stem}.{s['sha256'][:12]}.{tag}.pt"
        if runner is None and not path.is_file():
            runner = cast_copy(model, getattr(torch, pass_dtype))  # made once, when a shard needs it
        data, w = _shard_pass(runner, s, corpus_dir, parts, tag, topk, batch_size, max_prompt_tokens,
                              f"teacher pass {s['file']}")
        untimed += _timed(wall, "train_pass", w)
        train.append(data)
    return {"key": key, "train": concat(train), "heldout": held, "wall_s": wall, "untimed_parts": untimed,
            "corpus": info}


def sharegpt_text(tokenizer, n: int, skip: int = 0, max_len: int = 256, max_prompt_tokens: int = 96,
                  dataset: str = "sharegpt") -> list[dict]:
    """``n`` real conversations after the first ``skip`` samples (the held-out prompts): the
    first human turn under the chat template (its last ``max_prompt_tokens`` tokens, as the
    self-distillation corpus cuts prompts), then the reference reply and end-of-turn, cut at
    ``max_len`` tokens."""
    check_range("max_len", max_len, 2)
    samples, prompts = corpus_mod.first_turns(tokenizer, n, skip, max_prompt_tokens, dataset)  # an answer set's prompts
    eos = tokenizer.eos_token_id
    out = []
    for s, prompt in zip(samples, prompts):
        reply = tokenizer(s.reference or "", add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        out.append({"ids": (prompt + reply)[:max_len], "start": min(len(prompt), max_len - 1)})
    return out


def read_cache(path: Path) -> dict:
    """A teacher cache file as :func:`load_or_build` returns it, without checking its key
    (for readers of a cache a rule already built for them)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"teacher cache {path} does not exist; valid: a cache built by python -m common.training.teacher")

    def load(p: Path) -> dict:
        data = _tensor_dict(p)  # tensors and plain values only
        return {**data, "train": TeacherData(**data["train"]), "heldout": TeacherData(**data["heldout"])}
    return load_or_error(path, load, "teacher cache", "delete it and rebuild it: python -m common.training.teacher "
                                                      "(rule teacher_cache)")


def _tensor_dict(path: Path) -> dict:
    """A file of tensors and plain values (``weights_only``) whose top level is a dict; anything
    else raises (:func:`~common.paths.load_or_error` turns it into one error line)."""
    data = torch.load(path, weights_only=True)
    if not isinstance(data, dict):
        raise ValueError(f"its top level is a {type(data).__name__}, not a dict")
    return data


def load_or_build(path: Path, model, tokenizer, heldout_corpus: Path, heldout_prompts: int,
                  answer_tokens: int, sequences: int, max_len: int = 256, max_prompt_tokens: int = 96,
                  topk: int = 32, batch_size: int = 8, corpus_dir: Path | None = None,
                  corpus_tokens: int | None = None, pass_dtype: str = "bfloat16",
                  text_sequences: int | None = None) -> dict:
    """The teacher cache at ``path`` (git-ignored), built once and reused while the model and
    every setting match.

    ``corpus_dir``: read the sharded corpus instead (:func:`from_corpus`; ``heldout_corpus``,
    ``heldout_prompts``, ``answer_tokens``, ``sequences`` and ``max_len`` are then unused, and
    ``max_prompt_tokens`` cuts the training shards' prompts). With ``text_sequences`` as well:
    :func:`from_text` (``max_len`` and ``max_prompt_tokens`` cut the text).

    Returns:
        ``{"key", "train": TeacherData (ShareGPT text), "heldout": TeacherData (greedy
        continuations), "wall_s": {"heldout_corpus", "heldout_pass", "train_pass"}}``; a corpus's
        cache adds ``untimed_parts``, its parts whose pass time is unknown (absent from ``wall_s``).
    """
    path = Path(path)
    if corpus_dir is not None and text_sequences is not None:
        check_range("text_sequences", text_sequences, 1)
        manifest = corpus_mod.open_corpus(corpus_dir, model=model)
        data = _read_if_key(path, _text_key(model, manifest, text_sequences, max_len, max_prompt_tokens, topk))
        if data is not None:
            return data
        data = from_text(model, tokenizer, corpus_dir, path.with_name(path.stem + "_parts"), text_sequences,
                         max_len, max_prompt_tokens, topk, batch_size)
        _save(path, data)
        return data
    if corpus_dir is not None:
        parts = path.with_name(path.stem + "_parts")
        manifest = corpus_mod.open_corpus(corpus_dir, model=model)
        data = _read_if_key(path, _corpus_key(model, manifest, corpus_tokens, topk, max_prompt_tokens, pass_dtype))
        if data is not None:
            return data
        data = from_corpus(model, corpus_dir, parts, corpus_tokens, topk, batch_size, max_prompt_tokens, pass_dtype)
        _save(path, data)
        return data
    key = {"version": VERSION, **fingerprint(model), "heldout_prompts": heldout_prompts,
           "answer_tokens": answer_tokens, "sequences": sequences, "max_len": max_len,
           "max_prompt_tokens": max_prompt_tokens, "topk": topk}
    data = _read_if_key(path, key)
    if data is not None:
        return data
    wall = {}
    t = time.perf_counter()
    corpus = corpus_mod.load_or_build_set(heldout_corpus, model, tokenizer, n_prompts=heldout_prompts,
                                          max_new_tokens=answer_tokens)
    wall["heldout_corpus"] = time.perf_counter() - t
    t = time.perf_counter()
    held = teacher_pass(model, corpus, topk, batch_size, desc="teacher pass (held-out greedy)")
    wall["heldout_pass"] = time.perf_counter() - t
    t = time.perf_counter()
    text = sharegpt_text(tokenizer, sequences, skip=heldout_prompts, max_len=max_len,
                         max_prompt_tokens=max_prompt_tokens)
    train = teacher_pass(model, text, topk, batch_size, desc="teacher pass (ShareGPT text)")
    wall["train_pass"] = time.perf_counter() - t
    data = {"key": key, "train": train, "heldout": held, "wall_s": wall}
    _save(path, data)
    return data


def _corpus_key(model, manifest: dict, tokens, topk, max_prompt_tokens, pass_dtype) -> dict:
    """:func:`from_corpus`'s key without running it (the shards ``tokens`` takes, by hash)."""
    chosen = [s["sha256"] for s in _chosen(manifest, tokens)]
    return {"version": VERSION, **fingerprint(model), "corpus": manifest["recipe"],
            "heldout": manifest["heldout"]["sha256"] if manifest["heldout"] else None, "shards": chosen,
            "topk": topk, "max_prompt_tokens": max_prompt_tokens, "pass_dtype": pass_dtype}


def _chosen(manifest: dict, tokens: int | None) -> list[dict]:
    """The training shards, in order, until ``tokens`` answer tokens (None: all)."""
    chosen, seen = [], 0
    for s in manifest["shards"]:
        if tokens is not None and seen >= tokens:
            break
        chosen.append(s)
        seen += s["answer_tokens"]
    return chosen


def cost_fields(data: dict) -> dict:
    """What a trainer's stats say about the teacher pass it trained on (``data``:
    :func:`load_or_build`'s return): its wall seconds and how many of its parts had no time (so a
    0 s pass read from untimed parts is not taken for a free one)."""
    return {"teacher_wall_s": data.get("wall_s"), "teacher_untimed_parts": data.get("untimed_parts", 0)}


def _key_file(path: Path) -> Path:
    """The cache's key beside it (bytes, where the cache is gigabytes): read before the cache."""
    return path.with_name(path.name + ".key.json")


def _read_if_key(path: Path, key: dict) -> dict | None:
    """The cache at ``path`` when it was built with ``key``, else None; a key file that differs
    spares reading the cache (a cache without one is read and its own key compared)."""
    kf, want = _key_file(path), json.loads(json.dumps(key))  # compared as JSON: tuples read back as lists
    fix = "delete it and the cache beside it; the next run rebuilds them"
    if not path.is_file() or (kf.is_file() and load_json(kf, "teacher cache key", fix) != want):
        return None
    data = read_cache(path)
    return data if json.loads(json.dumps(data.get("key"))) == want else None


def _save(path: Path, data: dict) -> None:
    """The cache, then its key file (removed first: a run killed in between leaves a cache whose
    own key is compared)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _key_file(path).unlink(missing_ok=True)
    atomic_write(path, lambda tmp: torch.save({**data, "train": vars(data["train"]), "heldout": vars(data["heldout"])},
                                              tmp))
    atomic_write(_key_file(path), lambda tmp: tmp.write_text(json.dumps(data["key"], indent=1) + "\n"))


def add_args(ap) -> None:
    """The teacher cache's settings, shared by this CLI and the trainers' command line."""
    ap.add_argument("--teacher", type=Path, required=True, help="teacher cache (built if missing or stale)")
    ap.add_argument("--heldout-corpus", type=Path, default=None,
                    help="held-out greedy corpus cache (needed without --corpus-dir)")
    ap.add_argument("--corpus-dir", type=Path, default=None,
                    help="the sharded corpus (python -m common.training.corpus): its shards train, its held-out shard evaluates")
    ap.add_argument("--corpus-tokens", type=int, default=None, help="answer tokens of the corpus to pass (default: all)")
    ap.add_argument("--pass-dtype", choices=PASS_DTYPES, default="bfloat16",
                    help="dtype of the corpus's training-shard pass (the held-out shard is passed in the model's "
                         "dtype); none: no pass, the shards' text only (text labels)")
    ap.add_argument("--text-sequences", type=int, default=None,
                    help="with --corpus-dir: train on this many ShareGPT reference texts instead of the shards")
    ap.add_argument("--heldout-prompts", type=int, default=32)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--sequences", type=int, default=256, help="ShareGPT conversations in the teacher pass")
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--max-prompt-tokens", type=int, default=96)
    ap.add_argument("--topk", type=int, default=32)


def check_args(a) -> None:
    """The cheap checks of :func:`add_args`' flags, run before the model loads (and again by
    :func:`from_args`, for callers that load it first)."""
    if a.corpus_dir is None and a.heldout_corpus is None:
        raise UserError("the teacher cache needs --heldout-corpus (ShareGPT text) or --corpus-dir (the sharded corpus)")
    if a.corpus_tokens is not None:
        check_range("--corpus-tokens", a.corpus_tokens, 1)
    if a.text_sequences is not None:
        if a.corpus_dir is None:
            raise UserError("--text-sequences needs --corpus-dir (its held-out shard evaluates)")
        check_range("--text-sequences", a.text_sequences, 1)
    for name in ("heldout_prompts", "answer_tokens", "sequences", "topk"):
        check_range(f"--{name.replace('_', '-')}", getattr(a, name), 1)


def from_args(a, model, tokenizer) -> dict:
    """The teacher cache :func:`add_args`' flags name (:func:`load_or_build`)."""
    check_args(a)
    return load_or_build(a.teacher, model, tokenizer, a.heldout_corpus, a.heldout_prompts, a.answer_tokens,
                         a.sequences, a.max_len, a.max_prompt_tokens, a.topk, corpus_dir=a.corpus_dir,
                         corpus_tokens=a.corpus_tokens, pass_dtype=a.pass_dtype, text_sequences=a.text_sequences)


def _main(argv=None) -> None:
    ap = ArgumentParser(description="build the teacher cache (one teacher-forced pass of the base model)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the teacher pass runs (cpu, cuda, cuda:N)")
    ap.add_argument("--stats-out", type=Path, default=None, help="sizes and wall times (JSON)")
    add_args(ap)
    a = ap.parse_args(argv)
    version = code_version()  # the code this pass loaded (read now, not when it ends)
    check_start(a.stats_out)  # refused now, not after the pass
    check_args(a)
    device = str(check_device(a.device))
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok = load_model(a.model, device=device)
    data = from_args(a, model, tok)
    stats = {"key": data["key"], "wall_s": data["wall_s"], "untimed_parts": data.get("untimed_parts", 0),
             "train_sequences": len(data["train"]),
             "train_tokens": data["train"].n_tokens, "heldout_sequences": len(data["heldout"]),
             "heldout_answer_positions": int(data["heldout"].answer_positions().numel()),
             "corpus": data.get("corpus"),
             "threads": torch.get_num_threads(), **provenance(a.model, a.device, version)}
    if a.stats_out:
        write_json(a.stats_out, stats)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    cli_main(_main)
