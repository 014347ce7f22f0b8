"""Shared checks of the tests of guess-and-verify decoders (imported by test modules)."""
import contextlib

import torch

from common.decoders import get_decoder

# prompts of the tiny LLaMAs' vocabulary (96) for the speculative decoders' tests
SPEC_PROMPTS = [[1, 5, 6, 7, 5, 6], [1, 40, 41, 42, 43], [1, 9], [1, 77, 3, 3, 3, 12, 60, 61]]


def assert_exact_and_accepting(model, name: str, prompts: int = 6, new_tokens: int = 40, **cfg) -> None:
    """Decoder ``name`` gives ``vanilla``'s tokens on random prompts, and accepts some of its
    guesses (so the exactness is not only ever that of one-token steps)."""
    accepted = 0
    for seed in range(prompts):
        ids = torch.randint(3, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(seed))
        ref = get_decoder("vanilla", model).generate(ids, new_tokens).tokens
        out = get_decoder(name, model, **cfg).generate(ids, new_tokens)
        assert out.tokens == ref, (name, cfg, seed)
        accepted += sum(out.stats["accepted"])
    assert accepted > 0, f"{name} accepted no guessed token in {prompts} prompts"


def assert_component_checks(model, name: str, option: str, filename: str, module, meta: dict, tmp_path) -> None:
    """A checkpoint made for another model (``meta`` with a wrong hidden size), the option
    unset, and a folder without the checkpoint: each one ``UserError`` naming the problem."""
    import pytest

    from common.errors import UserError
    from common.training.loop import save_trained

    save_trained(module, tmp_path / "other" / filename, {**meta, "hidden": -1})
    with pytest.raises(UserError, match="trained for"):
        get_decoder(name, model, **{option: str(tmp_path / "other")})
    with pytest.raises(UserError, match=f"needs {option}"):
        get_decoder(name, model)
    with pytest.raises(UserError, match="does not exist"):
        get_decoder(name, model, **{option: str(tmp_path / "none")})


def assert_training_learns(model, module, loss_fn, steps: int, lr: float) -> None:
    """A few AdamW steps on ``module`` with the model frozen: ``loss_fn()`` falls by a fifth
    at least and the model's weights do not move (its ``requires_grad`` flags are restored)."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    try:
        for _ in range(steps):
            loss = loss_fn()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        for p, f in zip(model.parameters(), flags):  # fixtures are shared between tests
            p.requires_grad_(f)
    assert losses[-1] < 0.8 * losses[0], losses[::5]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def greedy_sequences(model, n: int = 4, prompt: int = 6, answer: int = 24, seed: int = 0):
    """``[(ids [prompt + answer], start)]``: the model's own greedy answers to random prompts,
    the data :mod:`common.training.seqtrain` gives the in-forward trainers."""
    out = []
    for s in range(n):
        ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(seed + s))
        tokens = get_decoder("vanilla", model).generate(ids, answer).tokens
        out.append((torch.cat([ids[0], torch.tensor(tokens)]), prompt))
    return out


# -- the sharded corpus on a tiny model (common.training.corpus): tests of the corpus, the teacher pass
# over it and the trainers that read it
CORPUS_PROMPTS = 40


def corpus_prompts(start: int, stop: int) -> list[list[int]]:
    """Deterministic random prompts of 3-9 tokens (BOS + ids of the tiny vocabulary), the
    ``prompts(start, stop)`` callable :func:`common.training.corpus.build` takes."""
    out = []
    for i in range(start, min(stop, CORPUS_PROMPTS)):
        g = torch.Generator().manual_seed(1000 + i)
        n = int(torch.randint(2, 9, (1,), generator=g))
        out.append([1] + torch.randint(3, 96, (n,), generator=g).tolist())
    return out


def corpus_recipe(model, **kw):
    """A tiny corpus recipe: 6 held-out prompts, shards of 8, 10-token answers (``kw`` overrides)."""
    from common.training import corpus
    base = dict(model="tiny", model_id=corpus.model_identity(model), tokenizer_id="tok", heldout=6,
                shard_prompts=8, answer_tokens=10, gen_dtype="float32", batch_size=3, eos=2)
    return corpus.Recipe(**{**base, **kw})


def tiny_corpus(out, model, max_shards: int | None = None, **kw):
    """Build the tiny corpus at ``out`` (``max_shards`` training shards at most); returns ``out``."""
    from common.training import corpus
    corpus.build(out, model, corpus_recipe(model, **kw), corpus_prompts, CORPUS_PROMPTS, max_shards=max_shards,
                 progress=False)
    return out


def teacher_corpus(model, n: int, seed0: int, new: int = 16) -> list[dict]:
    """``[{"ids", "start"}]``: ``n`` random 6-token prompts (BOS + 5 ids of the tiny vocabulary)
    with the model's ``new`` greedy tokens after each, EOS ignored; what
    :func:`common.training.teacher.teacher_pass` takes."""
    van = get_decoder("vanilla", model)
    van.eos = set()
    out = []
    for i in range(n):
        prompt = [1] + torch.randint(3, 96, (5,), generator=torch.Generator().manual_seed(seed0 + i)).tolist()
        out.append({"ids": prompt + van.generate(torch.tensor([prompt]), new).tokens, "start": len(prompt)})
    return out


class WordTokenizer:
    """The least a trainer's ``--init-text`` needs of a tokenizer: text -> a few ids."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + len(w) for w in text.split()]}


@contextlib.contextmanager
def frozen(model):
    """The model's weights frozen inside the block (a trainer's setting; fixtures are shared
    between tests, so the flags are restored after)."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
