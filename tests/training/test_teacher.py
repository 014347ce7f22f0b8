"""The teacher cache: a batched pass equals per-sequence forwards, built once, rebuilt when the
model or a setting changes."""
import pytest
import torch

import common.training.corpus
import common.training.teacher as T
from common.errors import UserError
from common.assets.models import tiny_llama


def seqs(n, seed=0, lo=3, hi=20):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        L = int(torch.randint(lo, hi, (1,), generator=g))
        out.append({"ids": [1] + torch.randint(3, 96, (L,), generator=g).tolist(), "start": 2})
    return out


def test_batched_pass_equals_single_forwards(chaotic_llama):
    data = seqs(7)
    d = T.teacher_pass(chaotic_llama, data, topk=5, batch_size=3)  # padding inside every batch
    assert len(d) == 7 and d.n_tokens == sum(len(s["ids"]) for s in data)
    for s, x in enumerate(data):
        a, b = d.span(s)
        with torch.no_grad():
            out = chaotic_llama(input_ids=torch.tensor([x["ids"]]), output_hidden_states=True)
        logp = out.logits[0].log_softmax(-1)
        assert d.ids[a:b].tolist() == x["ids"]
        assert torch.equal(d.argmax[a:b].long(), logp.argmax(-1))
        torch.testing.assert_close(d.hidden[a:b].float(), out.hidden_states[-1][0], atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(d.top_logp[a:b].float(), logp.topk(5, -1).values, atol=1e-2, rtol=1e-3)
    # answer positions: from the last prompt token to the one before the end, per sequence
    pos = d.answer_positions()
    assert pos.numel() == sum(len(x["ids"]) - x["start"] for x in data)
    assert int(pos[0]) == data[0]["start"] - 1


@pytest.fixture
def counted(monkeypatch):
    """load_or_build with stand-ins for the tokenizer-bound steps; counts teacher passes."""
    calls = {"pass": 0}
    real = T.teacher_pass

    def counting(model, s, *a, **kw):
        calls["pass"] += 1
        return real(model, s, *a, **kw)

    monkeypatch.setattr(T, "teacher_pass", counting)
    monkeypatch.setattr(T, "sharegpt_text", lambda tok, n, skip, max_len, max_prompt_tokens: seqs(n, 1, hi=max_len - 1))
    monkeypatch.setattr(common.training.corpus, "load_or_build_set", lambda path, model, tok, **kw: seqs(kw["n_prompts"], 2))
    return calls


def test_cache_is_reused_and_invalidated(tmp_path, counted):
    model = tiny_llama(seed=0)
    kw = dict(heldout_corpus=tmp_path / "corpus.pt", heldout_prompts=2, answer_tokens=8, sequences=3,
              max_len=16, max_prompt_tokens=8, topk=4, batch_size=2)
    first = T.load_or_build(tmp_path / "t.pt", model, None, **kw)
    assert counted["pass"] == 2  # held-out greedy set + training text
    assert len(first["train"]) == 3 and len(first["heldout"]) == 2 and first["train"].top_idx.shape[1] == 4
    again = T.load_or_build(tmp_path / "t.pt", model, None, **kw)
    assert counted["pass"] == 2 and torch.equal(again["train"].hidden, first["train"].hidden)
    T.load_or_build(tmp_path / "t.pt", model, None, **{**kw, "topk": 6})  # a setting changed
    assert counted["pass"] == 4
    T.load_or_build(tmp_path / "t.pt", tiny_llama(seed=0, layers=2), None, **{**kw, "topk": 6})  # another model
    assert counted["pass"] == 6
    assert T.load_or_build(tmp_path / "t.pt", tiny_llama(seed=0, layers=2), None, **{**kw, "topk": 6})["key"]["layers"] == 2
    assert counted["pass"] == 6


def test_bad_input(tiny):
    with pytest.raises(UserError, match="no sequences"):
        T.teacher_pass(tiny, [])
    with pytest.raises(UserError, match="topk=0"):
        T.teacher_pass(tiny, seqs(1), topk=0)
