"""The teacher cache read from the sharded corpus (common.training.teacher.from_corpus) on a tiny random
model: its held-out set is the corpus's held-out shard, its training set the shards up to the
token goal, a killed pass resumes from the finished shards to the same cache, and a corpus of
another model is refused."""
from pathlib import Path

import pytest
import torch

from common.training import corpus, teacher
from common.errors import UserError
from common.assets.models import tiny_llama

from decoding_checks import tiny_corpus


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3, scale=10.0)


@pytest.fixture(scope="module")
def built(model, tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus"), model)


def test_sets_are_the_corpus_shards(model, built, tmp_path):
    data = teacher.load_or_build(tmp_path / "t.pt", model, None, None, 0, 0, 0, topk=4,
                                 corpus_dir=built, pass_dtype="float32")
    held = corpus.heldout(built)
    assert data["heldout"].ids.tolist() == held.tokens.tolist()
    assert data["heldout"].start.tolist() == held.starts.tolist()
    shards = list(corpus.iter_shards(built))
    assert data["train"].n_tokens == sum(len(s.tokens) for s in shards)
    assert len(data["train"]) == sum(len(s) for s in shards)
    # the pass over the corpus is the plain teacher pass over its sequences (fp32 here)
    direct = teacher.teacher_pass(model, teacher.shard_sequences(shards[1]), topk=4)
    a, b = data["train"].offsets[len(shards[0])], data["train"].offsets[len(shards[0]) + len(shards[1])]
    assert torch.equal(data["train"].argmax[a:b], direct.argmax)
    assert torch.equal(data["train"].hidden[a:b], direct.hidden)
    # answers are the model's greedy tokens: the pass's argmax predicts them
    s0, t0 = int(data["train"].offsets[0]), int(data["train"].start[0])
    n0 = int(data["train"].offsets[1]) - s0
    assert torch.equal(data["train"].argmax[s0 + t0 - 1:s0 + n0 - 1], data["train"].ids[s0 + t0:s0 + n0])


def test_token_goal_and_prompt_cut(model, built, tmp_path):
    first = corpus.read_manifest(built)["shards"][0]["answer_tokens"]
    data = teacher.load_or_build(tmp_path / "t.pt", model, None, None, 0, 0, 0, topk=4, max_prompt_tokens=2,
                                 corpus_dir=built, corpus_tokens=first, pass_dtype="float32")
    assert data["corpus"]["shards"] == 1 and data["corpus"]["answer_tokens"] == first
    assert int(data["train"].start.max()) <= 2
    assert int(data["heldout"].start.max()) > 2  # the held-out shard keeps its whole prompts


def test_killed_pass_resumes_to_the_same_cache(model, built, tmp_path):
    kw = dict(topk=4, corpus_dir=built, pass_dtype="float32")
    whole = teacher.load_or_build(tmp_path / "a.pt", model, None, None, 0, 0, 0, **kw)
    teacher.load_or_build(tmp_path / "b.pt", model, None, None, 0, 0, 0, corpus_tokens=1, **kw)  # "killed" after one shard
    (tmp_path / "b.pt").unlink()
    parts = sorted(p.name for p in (tmp_path / "b_parts").iterdir())
    assert len(parts) == 2  # the held-out shard and the first training shard
    first = torch.load(tmp_path / "b_parts" / next(p for p in parts if "float32" in p and "heldout" in p),
                       weights_only=True)["wall_s"]
    resumed = teacher.load_or_build(tmp_path / "b.pt", model, None, None, 0, 0, 0, **kw)
    # read back, not redone: the part's own time is the pass's, so a resumed pass states the whole cost
    assert resumed["wall_s"]["heldout_pass"] == first > 0 and resumed["untimed_parts"] == 0
    assert resumed["key"] == whole["key"]
    for f in ("ids", "hidden", "argmax", "top_idx", "top_logp", "offsets", "start"):
        assert torch.equal(getattr(resumed["train"], f), getattr(whole["train"], f))
    again = teacher.load_or_build(tmp_path / "b.pt", model, None, None, 0, 0, 0, **kw)  # cached: same key
    assert again["key"] == whole["key"]


def test_a_part_without_its_time_is_counted_not_read_as_zero(model, built, tmp_path):
    kw = dict(topk=4, corpus_dir=built, pass_dtype="float32")
    whole = teacher.load_or_build(tmp_path / "a.pt", model, None, None, 0, 0, 0, **kw)
    held = next((tmp_path / "a_parts").glob("heldout.*"))
    fields = torch.load(held, weights_only=True)
    del fields["wall_s"]  # as parts were written before they kept their time
    torch.save(fields, held)
    (tmp_path / "a.pt").unlink()
    rebuilt = teacher.load_or_build(tmp_path / "a.pt", model, None, None, 0, 0, 0, **kw)
    assert rebuilt["untimed_parts"] == 1 and whole["untimed_parts"] == 0
    assert rebuilt["wall_s"]["train_pass"] == whole["wall_s"]["train_pass"] > 0
    assert rebuilt["wall_s"]["heldout_pass"] == 0.0  # the timed parts' sum: nothing timed was held out
    # what the trainers' stats copy: the 0 s comes with the count that says it is unknown
    assert teacher.cost_fields(rebuilt) == {"teacher_wall_s": rebuilt["wall_s"], "teacher_untimed_parts": 1}


def test_other_model_refused(built, tmp_path):
    other = tiny_llama(seed=4, scale=10.0)
    with pytest.raises(UserError, match="another model"):
        teacher.load_or_build(tmp_path / "t.pt", other, None, None, 0, 0, 0, topk=4, corpus_dir=built)


def test_cli_needs_a_source(tmp_path, capsys):
    import argparse
    ap = argparse.ArgumentParser()
    teacher.add_args(ap)
    a = ap.parse_args(["--teacher", str(tmp_path / "t.pt")])
    with pytest.raises(UserError, match="--heldout-corpus .* or --corpus-dir"):
        teacher.from_args(a, None, None)


def test_in_forward_trainers_read_the_same_sets(model, built, tmp_path):
    import argparse

    from common.training import seqtrain
    ap = argparse.ArgumentParser()
    seqtrain.add_args(ap)
    a = ap.parse_args(["--corpus-dir", str(built), "--max-prompt-tokens", "3"])
    data = seqtrain.from_args(a, model, None)
    held = corpus.heldout(built)
    assert [ids.tolist() for ids, _ in data["heldout"]] == [s["ids"] for s in held.sequences()]
    shards = list(corpus.iter_shards(built))
    assert len(data["train"]) == sum(len(s) for s in shards)
    assert max(start for _, start in data["train"]) <= 3
    first = shards[0].sequences()[0]
    ids, start = data["train"][0]
    assert ids.tolist() == first["ids"][first["start"] - start:]  # the prompt's last tokens, the whole answer
    with pytest.raises(UserError, match="--corpus-dir .* or both --corpus and --heldout-corpus"):
        seqtrain.from_args(ap.parse_args([]), model, None)


def test_key_file_spares_reading_a_stale_cache(model, built, tmp_path, monkeypatch):
    """The cache's key sits beside it: a cache built with other settings is rebuilt without
    reading its gigabytes; one with the same settings is read and reused, also when its key
    file is gone (caches written before key files existed)."""
    kw = dict(corpus_dir=built, pass_dtype="float32")
    path = tmp_path / "t.pt"
    first = teacher.load_or_build(path, model, None, None, 0, 0, 0, topk=4, **kw)
    assert (tmp_path / "t.pt.key.json").is_file()
    read = teacher.read_cache
    calls = []
    monkeypatch.setattr(teacher, "read_cache", lambda p: calls.append(p) or read(p))
    again = teacher.load_or_build(path, model, None, None, 0, 0, 0, topk=4, **kw)
    assert calls == [path] and torch.equal(again["train"].hidden, first["train"].hidden)
    other = teacher.load_or_build(path, model, None, None, 0, 0, 0, topk=2, **kw)  # stale: rebuilt unread
    assert calls == [path] and other["train"].top_idx.shape[-1] == 2
    (tmp_path / "t.pt.key.json").unlink()
    assert teacher.load_or_build(path, model, None, None, 0, 0, 0, topk=2, **kw)["key"] == other["key"]
    assert calls == [path, path]


def test_firp_analyses_measure_on_the_held_out_shard(model, built):
    """FIRP's accuracy and cosine analyses read the same held-out answers as the trainers; one
    source of them, never both or neither."""
    import argparse

    from firp.analysis import heldout_answers, maps_cli
    answers = heldout_answers(argparse.Namespace(corpus_dir=built, heldout_corpus=None), model, None)
    held = corpus.heldout(built).sequences()
    assert len(answers) == len(held) > 0
    assert [(list(s["ids"]), s["start"]) for s in answers] == [(list(s["ids"]), s["start"]) for s in held]
    for extra in ([], ["--corpus-dir", str(built), "--heldout-corpus", "c.pt"]):
        with pytest.raises(UserError, match="--corpus-dir .* or --heldout-corpus"):
            maps_cli("x", ["--model", "m", "--maps", "m", "--out", "o.jsonl", *extra])


def count_passes(monkeypatch) -> dict:
    """``{"n": teacher passes run so far}``, counted through a wrapper of ``teacher.teacher_pass``."""
    passes, real = {"n": 0}, teacher.teacher_pass

    def counting(*a, **kw):
        passes["n"] += 1
        return real(*a, **kw)
    monkeypatch.setattr(teacher, "teacher_pass", counting)
    return passes


def test_reference_text_is_trained_on_and_the_corpus_held_out_shard_evaluates(model, built, tmp_path, monkeypatch):
    """BiLD's unaligned small model (--text-sequences): ShareGPT's text after the corpus's
    held-out prompts trains, the held-out shard evaluates, and the text costs no forward pass."""
    from decoding_checks import teacher_corpus

    from common.components.draft_model import distill
    from common.training.loop import Stopping, TrainConfig
    text = teacher_corpus(model, 5, seed0=50, new=6)
    asked = {}

    def stand_in(tok, n, skip, max_len, max_prompt_tokens):
        asked.update(n=n, skip=skip, max_len=max_len, max_prompt_tokens=max_prompt_tokens)
        return text[:n]
    monkeypatch.setattr(teacher, "sharegpt_text", stand_in)
    passes = count_passes(monkeypatch)
    data = teacher.load_or_build(tmp_path / "tt.pt", model, None, None, 0, 0, 0, max_len=40, max_prompt_tokens=7,
                                 topk=4, corpus_dir=built, text_sequences=4)
    recipe = corpus.read_manifest(built)["recipe"]
    assert asked == {"n": 4, "skip": recipe["heldout"], "max_len": 40, "max_prompt_tokens": 7}
    assert passes["n"] == 1  # the held-out shard only
    held = corpus.heldout(built)
    assert data["heldout"].ids.tolist() == held.tokens.tolist() and data["heldout"].top_idx.shape[1] == 4
    tr = data["train"]
    assert len(tr) == 4 and tr.ids.tolist() == [t for s in text[:4] for t in s["ids"]]
    assert tr.start.tolist() == [s["start"] for s in text[:4]] and tr.top_idx.shape == (tr.n_tokens, 0)
    again = teacher.load_or_build(tmp_path / "tt.pt", model, None, None, 0, 0, 0, max_len=40, max_prompt_tokens=7,
                                  topk=4, corpus_dir=built, text_sequences=4)
    assert passes["n"] == 1 and again["key"] == data["key"]  # cached under its key
    # text labels train on it; greedy labels and top-k distillation need outputs it does not carry
    cfg, stop = TrainConfig(lr=1e-3, epochs=1, batch_size=2), Stopping(eval_every=1, patience=2)
    stats = distill(model, data, 1, tmp_path / "small", cfg, stop=stop, labels="text")
    assert stats["train_sequences"] == 4 and stats["heldout_sequences"] == len(held)
    with pytest.raises(UserError, match="greedy labels need the model's predictions"):
        distill(model, data, 1, tmp_path / "g", cfg, stop=stop, labels="greedy")
    with pytest.raises(UserError, match="labels=topk distils"):
        distill(model, data, 1, tmp_path / "k", cfg, stop=stop, labels="topk")


def test_corpus_answers_as_text_are_not_passed_and_their_text_labels_are_the_greedy_tokens(model, built, tmp_path,
                                                                                        monkeypatch):
    """pass_dtype none (BiLD's aligned small model, rule teacher_answers): the training shards
    become a text set without a forward pass, the held-out shard is passed as always, and the
    text labels at the answer positions are the passed set's greedy labels there (a greedy
    corpus generated in the pass's dtype, fp32 here, and whole prompts: a prompt cut by
    max_prompt_tokens conditions the pass on less than the answer was generated from)."""
    passes = count_passes(monkeypatch)
    text = teacher.load_or_build(tmp_path / "a.pt", model, None, None, 0, 0, 0, topk=4,
                                 corpus_dir=built, pass_dtype="none")
    assert passes["n"] == 1  # the held-out shard only
    assert "train_pass" not in text["wall_s"] and text["key"]["pass_dtype"] == "none"
    passed = teacher.load_or_build(tmp_path / "b.pt", model, None, None, 0, 0, 0, topk=4,
                                   corpus_dir=built, pass_dtype="float32")
    tr, ref = text["train"], passed["train"]
    assert tr.ids.tolist() == ref.ids.tolist() and tr.start.tolist() == ref.start.tolist()
    assert tr.top_idx.shape == (tr.n_tokens, 0) and tr.argmax.numel() == 0
    assert torch.equal(text["heldout"].argmax, passed["heldout"].argmax)
    pos = tr.answer_positions()
    assert torch.equal(teacher.HardLabels.TEXT.at(tr, pos), teacher.HardLabels.GREEDY.at(ref, pos))
    with pytest.raises(UserError, match="greedy labels need the model's predictions"):
        teacher.HardLabels.GREEDY.at(tr, pos)
    with pytest.raises(UserError, match="pass_dtype='half' is unknown; valid: bfloat16, float32, none"):
        teacher.from_corpus(model, built, tmp_path / "p", pass_dtype="half")


def test_text_sequences_need_the_corpus(tmp_path):
    import argparse
    ap = argparse.ArgumentParser()
    teacher.add_args(ap)
    a = ap.parse_args(["--teacher", str(tmp_path / "t.pt"), "--heldout-corpus", "x.pt", "--text-sequences", "8"])
    with pytest.raises(UserError, match="--text-sequences needs --corpus-dir"):
        teacher.from_args(a, None, None)


def test_reference_text_beside_the_corpus_skips_its_held_out_prompts(built, monkeypatch):
    """corpus_text: the conversations after the corpus's held-out prompts, as many as asked."""
    asked = {}

    def stand_in(tok, n, skip, max_len, max_prompt_tokens):
        asked.update(n=n, skip=skip, max_len=max_len, max_prompt_tokens=max_prompt_tokens)
        return [{"ids": [1, 2, 3], "start": 1}] * n
    monkeypatch.setattr(teacher, "sharegpt_text", stand_in)
    manifest = corpus.read_manifest(built)
    assert len(teacher.corpus_text(None, manifest, 5, 40, 7)) == 5
    assert asked == {"n": 5, "skip": manifest["recipe"]["heldout"], "max_len": 40, "max_prompt_tokens": 7}
    other = {**manifest, "recipe": {**manifest["recipe"], "dataset": "mt-bench"}}
    teacher.corpus_text(None, other, 2, 40, 7)
    assert asked["skip"] == 0  # another dataset's held-out shard shares no ShareGPT conversation


def test_prompt_tokens_without_distillation_learn_the_replies_to_the_corpus_prompts(model, built, tmp_path,
                                                                                       monkeypatch):
    """--no-distill with --corpus-dir: the reference replies to as many conversations as the
    corpus's training shards answer, after its held-out prompts (the ablation changes the labels
    only), not --prompts after --heldout-prompts (which skip the greedy corpus cache's prompts)."""
    import common.training.cli
    import prompt_decoding.train as pd_train
    monkeypatch.setattr(common.training.cli, "load_model", lambda name, **kw: (model, None))
    asked, got = {}, {}

    def stand_in(tok, n, skip, max_len, max_prompt_tokens):
        asked.update(n=n, skip=skip)
        return [{"ids": [1, 5, 6, 7], "start": 1}] * n

    def trained(model, tok, data, out, cfg, stop, recipe, curve_path=None, text_seqs=None):
        got.update(train=len(data["train"]), text=len(text_seqs), distill=recipe.distill)
        out = Path(out)
        out.mkdir(parents=True)  # as the trainer writes its tokens there: the stats digest what it wrote
        (out / "tokens.bin").write_bytes(b"stand-in")
        return {"heldout_top1": [0.0]}
    monkeypatch.setattr(teacher, "sharegpt_text", stand_in)
    monkeypatch.setattr(pd_train, "train_prompts", trained)
    pd_train._main(["--model", "m", "--out", str(tmp_path / "p"), "--corpus-dir", str(built), "--no-distill",
                    "--prompts", "3", "--heldout-prompts", "1", "--init-text", ""])
    shards = sum(len(s) for s in corpus.iter_shards(built))
    assert got == {"train": shards, "text": shards, "distill": False}
    assert asked == {"n": shards, "skip": corpus.read_manifest(built)["recipe"]["heldout"]}
