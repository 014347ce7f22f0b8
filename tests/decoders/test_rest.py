"""REST (common.components.rest_datastore, common.decoders.rest): the datastore answers with the continuations of
the longest matching suffix, is refused for another tokenizer, and is built by a CLI that
records its size and build time; the decoder records retrieval time per step. Exactness against
vanilla on the tiny model is the shared lossless test's (tests/decoders/test_core_engine.py)."""
import json

import numpy as np
import pytest
import torch

from common.components.rest_datastore import META, SUFFIXES, TOKENS, build_datastore, open_datastore
from common.decoders import get_decoder
from common.errors import UserError, cli_main
from common.records import content_digest

# 3-token suffix [7, 8, 9] is followed by 50 51; the 2-token suffix [8, 9] alone also by 60 61 (twice)
SEQS = [[1, 7, 8, 9, 50, 51, 52], [2, 3, 8, 9, 60, 61], [4, 8, 9, 60, 61], [5, 6, 30, 31, 32, 33]]


@pytest.fixture
def store(tmp_path):
    build_datastore(SEQS, tmp_path / "ds", 96, "tok-a", "tiny", "test")
    return tmp_path / "ds"


def test_longest_suffix_wins(store):
    ds = open_datastore(store, "tok-a", 96)
    got = ds.search([0, 7, 8, 9], max_span=4, min_span=2, num_draft=8, draft_len=3, matches=100)
    assert got.span == 3 and got.paths == [[50], [50, 51], [50, 51, 52]]   # a trie's nodes
    got = ds.search([0, 1, 8, 9], max_span=4, min_span=2, num_draft=8, draft_len=2, matches=100)
    # the three occurrences of [8, 9]: 60 61 (twice) and 50 51
    assert got.span == 2 and sorted(got.paths) == [[50], [50, 51], [60], [60, 61]]
    assert ds.search([0, 1, 2, 99], 4, 2, 8, 3, 100).paths == []   # no suffix of >= 2 tokens occurs
    assert ds.search([0, 9, 9], 3, 3, 8, 3, 100).span == 0
    # a continuation stops at the end of its sequence: 52 ends one, nothing follows it
    assert ds.search([51, 52], 2, 1, 8, 3, 100).paths == []


def test_num_draft_keeps_the_most_frequent(store):
    got = open_datastore(store).search([8, 9], 2, 2, num_draft=2, draft_len=2, matches=100)
    assert got.paths == [[60], [60, 61]]   # 60 and 60-61 occur twice, 50 and 50-51 once
    # matches caps the occurrences read (the first in suffix order: [8, 9, 50..] sorts first)
    assert open_datastore(store).search([8, 9], 2, 2, 8, 2, matches=1).paths == [[50], [50, 51]]


def test_occurrences_match_brute_force(tmp_path):
    gen = np.random.default_rng(0)
    seqs = [gen.integers(0, 5, size=int(gen.integers(1, 30))).tolist() for _ in range(40)]
    build_datastore(seqs, tmp_path / "r", 5, "t", "t", "test")
    ds = open_datastore(tmp_path / "r")
    text = [t for s in seqs for t in s + [5]]
    for q in ([0], [1, 2], [3, 3, 3], [4, 0, 1, 2], [2, 2, 2, 2, 2, 2], [5], [0, 5]):
        lo, hi = ds.occurrences(q)
        want = sorted(i for i in range(len(text)) if text[i:i + len(q)] == q)
        assert sorted(ds.suffixes[lo:hi].tolist()) == want, q
    # the longest occurring suffix (found by bisection) is the one a scan from the longest finds,
    # unless every occurrence of it ends its sequence (then a shorter one answers)
    for _ in range(200):
        ctx = gen.integers(0, 5, size=8).tolist()
        got = ds.search(ctx, max_span=8, min_span=1, num_draft=4, draft_len=2, matches=100)
        occurs = [s for s in range(1, 9) if any(text[i:i + s] == ctx[-s:] for i in range(len(text)))]
        assert got.span <= max(occurs, default=0)
        assert got.span == max(occurs, default=0) or not ds.search(ctx[-max(occurs):], max(occurs), max(occurs), 4, 2, 100).paths


def test_meta_and_refusals(store, tmp_path):
    meta = json.loads((store / META).read_text())
    assert meta["tokenizer_id"] == "tok-a" and meta["tokens"] == sum(map(len, SEQS)) and meta["sequences"] == 4
    assert meta["size_bytes"] == sum((store / f).stat().st_size for f in (TOKENS, SUFFIXES)) and "build_s" not in meta
    with pytest.raises(UserError, match="built with tokenizer 'tiny'.*valid: a datastore built for this tokenizer"):
        open_datastore(store, "tok-b")
    with pytest.raises(UserError, match="96-token vocabulary; this model has 64"):
        open_datastore(store, None, 64)
    with pytest.raises(UserError, match="no finished REST datastore"):
        open_datastore(tmp_path / "none")
    with pytest.raises(UserError, match="token id 96 is outside the vocabulary; valid: 0..95"):
        build_datastore([[1, 96]], tmp_path / "bad", 96, "t", "t", "test")
    assert not (tmp_path / "bad" / META).exists() and not list((tmp_path / "bad").glob("*.partial"))


def test_a_rebuild_digests_the_same(store, tmp_path):
    """Records name a datastore by its content digest: a rebuild of the same text (another
    session's cache, another CPU, another build time) must not read as other weights."""
    stats = build_datastore(SEQS, tmp_path / "again", 96, "tok-a", "tiny", "test")
    assert stats["build_s"] >= 0 and {k: v for k, v in stats.items() if k != "build_s"} == json.loads((store / META).read_text())
    assert content_digest(tmp_path / "again") == content_digest(store)


def test_decoder_options_and_stats(store, chaotic_llama, one_thread):
    with pytest.raises(UserError, match="needs datastore="):
        get_decoder("rest", chaotic_llama)
    with pytest.raises(UserError, match="min_span=0 is invalid; valid: an integer in \\[1, 256\\]"):
        get_decoder("rest", chaotic_llama, datastore=str(store), min_span=0)
    with pytest.raises(UserError, match="min_span=5 exceeds max_span=3"):
        get_decoder("rest", chaotic_llama, datastore=str(store), min_span=5, max_span=3)
    with pytest.raises(UserError, match="context of 512; valid: draft_len <= "):
        get_decoder("rest", chaotic_llama, datastore=str(store), draft_len=20).generate(torch.ones(1, 500, dtype=torch.long), 4)
    dec = get_decoder("rest", chaotic_llama, datastore=str(store))
    out = dec.generate(torch.tensor([[1, 7, 8, 9]]), 12)
    assert len(out.stats["retrieval_s"]) == len(out.stats["retrieval_span"]) == out.stats["steps"] - 1
    assert all(s == 0 or 2 <= s <= 16 for s in out.stats["retrieval_span"])
    assert all(t >= 0 for t in out.stats["retrieval_s"])
    # sampling: the authors' typical acceptance over the same trees
    hot = get_decoder("rest", chaotic_llama, datastore=str(store), temperature=0.8, seed=1).generate(torch.tensor([[1, 7, 8, 9]]), 12)
    assert len(hot.tokens) == 12 and sum(hot.stats["accept_lengths"]) == 12


def test_cli_builds_from_sharegpt_and_decoder_checks_tokenizer(tmp_path, embedded, capsys, store):
    from common.training.corpus import tokenizer_identity
    from common.components.rest_datastore import _main

    model, tok = embedded
    out, stats = tmp_path / "sharegpt", tmp_path / "stats.json"
    cli_main(lambda: _main(["--model", "smollm2-135m-instruct", "--n", "20", "--out", str(out),
                            "--stats", str(stats), "--no-progress"]))
    printed = capsys.readouterr().out
    meta = json.loads((out / META).read_text())
    written = json.loads(stats.read_text())
    assert written.pop("build_s") >= 0 and written == meta  # the stats: the meta and the build time
    assert meta["tokenizer_id"] == tokenizer_identity(tok) and meta["tokens"] > 1000
    assert f"{meta['tokens']} tokens" in printed and "built in" in printed
    # the embedded model with its datastore: vanilla's tokens; with the tiny model's: refused
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}],
                                     add_generation_prompt=True, return_tensors="pt")["input_ids"]
    ref = get_decoder("vanilla", model, tok).generate(prompt, 16).tokens
    got = get_decoder("rest", model, tok, datastore=str(out)).generate(prompt, 16)
    assert got.tokens == ref
    with pytest.raises(UserError, match="built with tokenizer 'tiny'"):
        get_decoder("rest", model, tok, datastore=str(store))
    with pytest.raises(SystemExit):
        cli_main(lambda: _main(["--model", "smollm2-135m-instruct", "--n", "0", "--out", str(tmp_path / "x")]))
    assert capsys.readouterr().err.strip().count("\n") == 0
