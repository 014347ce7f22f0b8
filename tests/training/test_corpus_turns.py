"""The large corpus's prompts (``sharegpt-turns``): every human turn with its conversation so
far; no evaluation prompt (MT-Bench, HumanEval, the mined ShareGPT sets any profile evaluates
on) ever shares a conversation with a training prompt; the held-out prompts are the first
corpus's, so one held-out shard serves both."""
import re
from pathlib import Path

import pytest

from common.assets import data

CONFIG = Path(__file__).resolve().parents[2] / "config"


@pytest.fixture(scope="module")
def turns():
    return data.sharegpt_turns(64)


def test_heldout_prompts_are_the_first_corpus(turns):
    first = data.load_dataset_samples("sharegpt", 64)
    assert [m for _, m in turns[:64]] == [(("user", s.turns[0]),) for s in first]


def test_no_evaluation_prompt_in_training(turns):
    train = turns[64:]
    texts = {t.strip() for _, msgs in train for role, t in msgs if role == "user"}
    evaluated = {t.strip() for s in data.load_dataset_samples("mt-bench") for t in s.turns}
    evaluated |= {s.turns[0].strip() for s in data.load_dataset_samples("humaneval")}
    for name in data.MINED_SETS:
        evaluated |= {s.turns[0].strip() for s in data.load_dataset_samples(name, data.EVAL_MARGIN)}
    evaluated |= {s.turns[0].strip() for s in data.load_dataset_samples("sharegpt", 64)}
    assert not texts & evaluated
    assert len(train) > 40_000  # every human turn, not only first turns
    assert all(msgs[-1][0] == "user" for _, msgs in train)
    assert len({m for _, m in train}) == len(train)


def test_profiles_evaluate_within_the_margin():
    """Every mined set a profile names is read at most EVAL_MARGIN prompts deep (else the
    corpus could train on a prompt a benchmark evaluates)."""
    for path in CONFIG.glob("profiles/*.yaml"):
        for name, n in re.findall(r"(sharegpt-[a-z]+)(?:\s*:\s*|,\s*n:\s*)(\d+)", path.read_text()):
            assert int(n) <= data.EVAL_MARGIN, (path.name, name, n)


def test_encode_messages_keeps_the_tail():
    from common.assets.prompts import encode_messages, encode_prompt

    class Tok:
        chat_template = None

        def __call__(self, text, return_tensors=None):
            import torch
            return {"input_ids": torch.tensor([[ord(c) for c in text]])}

    ids = encode_messages(Tok(), (("user", "abc"), ("assistant", "defg"), ("user", "xyz")), 5)
    assert "".join(map(chr, ids[0].tolist())) == "\n\nxyz"
    # one message equals encode_prompt's "last" cut
    one = encode_messages(Tok(), (("user", "hello world"),), 4)
    assert one.tolist() == encode_prompt(Tok(), "hello world", chat=False, max_prompt_tokens=4).tolist()
