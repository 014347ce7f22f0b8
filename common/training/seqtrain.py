"""Training data for components that run *inside* the model's forward: its own greedy sequences.

Medusa heads and the draft read final hidden states, so they train on :mod:`common.training.teacher`'s
cache. Prompt tokens and FIRP's maps instead enter the forward (as input embeddings, or as
states at an intermediate layer), attend to the context's cache and pass through the frozen
layers above them: their trainers run the frozen model over each sequence
(:func:`teacher_forward`) and train positions placed after cuts of it.

The sequences are the model's own greedy answers (:func:`common.training.corpus.answer_set`): the greedy
continuation from any cut inside an answer is the rest of the answer, so the teacher at every
distance after a cut is one forward's distribution there (self-distillation without a
generation per cut). Training prompts follow the held-out ones in ShareGPT; the held-out set is
the one the Medusa heads and the draft are measured on, so accuracies compare across components.
With ``--corpus-dir`` both come from the sharded corpus (:mod:`common.training.corpus`), as the teacher
cache's do.
"""
from __future__ import annotations

from pathlib import Path

import torch

from . import corpus as corpus_mod
from ..errors import UserError, check_range
from ..engine.fast import new_cache


@torch.no_grad()
def teacher_forward(model, ids: torch.Tensor, hidden_states: bool = False):
    """One frozen forward over a sequence.

    Args:
        ids: ``[L]`` token ids.
    Returns:
        ``(cache, hidden, logp)``: the cache of the ``L`` positions; with ``hidden_states`` the
        input of every layer and the final output, ``d + 1`` tensors ``[L, H]`` (else None);
        ``[L, V]`` fp32 next-token log-probabilities.
    """
    cache = new_cache(model)
    out = model(input_ids=ids[None], past_key_values=cache, use_cache=True, output_hidden_states=hidden_states)
    hidden = [h[0] for h in out.hidden_states] if hidden_states else None
    return cache, hidden, out.logits[0].float().log_softmax(-1)


def random_cuts(length: int, start: int, k: int, span: int, device=None) -> torch.Tensor:
    """``[<= k]`` distinct sorted cut positions ``t`` inside an answer (``start - 1 <= t``) that
    leave ``span`` positions after them (``t <= length - 1 - span``), drawn from torch's global
    generator (which :func:`common.training.loop.train` seeds per step, so a resumed run draws the
    same cuts). Empty when the answer is too short."""
    lo, hi = max(start - 1, 0), length - 1 - span
    if hi < lo:
        return torch.zeros(0, dtype=torch.long, device=device)
    n = hi - lo + 1
    pick = torch.randperm(n)[:k].sort().values + lo
    return pick.to(device)


def cuts_loss(seqs: list[tuple[torch.Tensor, int]], k: int, span, loss_of):
    """The training loss over random cuts: ``(module, batch of sequence indices) -> loss``, the
    mean over the batch's sequences of ``loss_of(module, ids, cuts)`` at up to ``k`` random cuts
    of each (:func:`random_cuts`, leaving ``span(module)`` positions after a cut).

    A batch whose answers are all too short gives a zero loss that moves nothing.
    """
    def loss(module, batch: list[int]) -> torch.Tensor:
        parts = []
        for i in batch:
            ids, start = seqs[i]
            cuts = random_cuts(ids.numel(), start, k, span(module), ids.device)
            if cuts.numel():
                parts.append(loss_of(module, ids, cuts))
        if not parts:
            return sum(p.sum() for p in module.parameters()) * 0.0
        return torch.stack(parts).mean()
    return loss


def add_args(ap) -> None:
    """The corpora's settings (training and held-out greedy answers): the sharded corpus
    (``--corpus-dir``) or the two greedy corpus caches (``--corpus``, ``--heldout-corpus``)."""
    ap.add_argument("--corpus-dir", type=Path, default=None,
                    help="the sharded corpus (python -m common.training.corpus): its shards train, its held-out shard evaluates")
    ap.add_argument("--corpus-tokens", type=int, default=None, help="answer tokens of --corpus-dir to train on (default: all)")
    ap.add_argument("--corpus", type=Path, default=None, help="training greedy corpus cache (built if missing)")
    ap.add_argument("--prompts", type=int, default=256, help="ShareGPT prompts answered for training")
    ap.add_argument("--heldout-corpus", type=Path, default=None, help="held-out greedy corpus cache")
    ap.add_argument("--heldout-prompts", type=int, default=32)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=96, help="training prompts are cut to this")


def check_args(a) -> None:
    """The cheap checks of :func:`add_args`' flags, run before the model loads (and again by
    :func:`from_args`, for callers that load it first)."""
    if a.corpus_dir is not None:
        if a.corpus_tokens is not None:
            check_range("--corpus-tokens", a.corpus_tokens, 1)
    elif a.corpus is None or a.heldout_corpus is None:
        raise UserError("the training sequences need --corpus-dir (the sharded corpus) or both --corpus and "
                        "--heldout-corpus (greedy corpus caches)")
    for name in ("prompts", "heldout_prompts", "answer_tokens", "max_prompt_tokens"):
        check_range(f"--{name.replace('_', '-')}", getattr(a, name), 1)


def corpus_sequences(corpus_dir: Path, model, tokens: int | None, max_prompt_tokens: int | None) -> dict:
    """``{"train", "heldout"}`` greedy sequences of the sharded corpus: the training shards up to
    ``tokens`` answer tokens (prompts cut to their last ``max_prompt_tokens``), and its held-out
    shard whole (the set every component is measured on)."""
    from .teacher import shard_sequences

    corpus_mod.open_corpus(corpus_dir, model=model)
    train = [seq for shard in corpus_mod.iter_shards(corpus_dir, tokens) for seq in shard_sequences(shard, max_prompt_tokens)]
    held = shard_sequences(corpus_mod.heldout(corpus_dir))
    return {"train": train, "heldout": held}


def from_args(a, model, tokenizer) -> dict:
    """``{"train": [(ids [L], start)], "heldout": [...]}``: with ``--corpus-dir`` the sharded
    corpus (:func:`corpus_sequences`); otherwise the held-out greedy corpus (the first
    ``heldout_prompts`` ShareGPT prompts, shared with the teacher cache) and the training one
    (the next ``prompts``), each built once and cached."""
    check_args(a)
    if a.corpus_dir is not None:
        raw = corpus_sequences(a.corpus_dir, model, a.corpus_tokens, a.max_prompt_tokens)
        held, train, source = raw["heldout"], raw["train"], a.corpus_dir
    else:
        held = corpus_mod.load_or_build_set(a.heldout_corpus, model, tokenizer, n_prompts=a.heldout_prompts,
                                         max_new_tokens=a.answer_tokens)
        train = corpus_mod.load_or_build_set(a.corpus, model, tokenizer, n_prompts=a.prompts, max_new_tokens=a.answer_tokens,
                                          max_prompt_tokens=a.max_prompt_tokens, skip=a.heldout_prompts)
        source = a.corpus
    dev = model.device

    def seqs(corpus):
        return [(torch.tensor(c["ids"], device=dev), int(c["start"])) for c in corpus]
    out = {"train": seqs(train), "heldout": seqs(held)}
    if not any(len(ids) - start >= 2 for ids, start in out["train"]):
        raise UserError(f"the training corpus {source} has no answer of 2 tokens or more")
    return out
