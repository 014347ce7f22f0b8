"""The Spec-Bench export (common.harness.specbench): the fields Spec-Bench's evaluation scripts read,
its category names, one file per decoder, and one error for a record that is not a benchmark's."""
import json

import pytest

from common.harness import specbench
from common.errors import UserError
from common.records import write_jsonl


def rec(decoder, qid, new, wall, accept, **kw):
    return {"question_id": qid, "decoder": decoder, "tokens": list(range(new)), "new_tokens": new,
            "wall_time": wall, "accept_lengths": accept, "steps": len(accept), "model": "smollm2-135m-instruct",
            "dataset": "mt-bench", "dtype": "float32", **kw}


def test_export_has_what_speed_and_equal_read(tmp_path):
    recs = [rec("vanilla", "81", 4, 2.0, [1, 1, 1, 1]), rec("vanilla", "82", 2, 1.0, [1, 1]),
            rec("eagle@dynamic", "81", 4, 1.0, [1, 3]), rec("eagle@dynamic", "82", 2, 0.5, [1, 1])]
    cats = {"81": "writing", "82": "roleplay"}
    out = specbench.export(recs, tmp_path, lambda t: " ".join(map(str, t)), lambda r: cats[r["question_id"]])
    assert out == {"smollm2-135m-instruct-vanilla-float32-temp-0.0.jsonl": 2,
                   "smollm2-135m-instruct-eagle@dynamic-float32-temp-0.0.jsonl": 2}
    lines = [json.loads(l) for l in (tmp_path / "smollm2-135m-instruct-eagle@dynamic-float32-temp-0.0.jsonl")
             .read_text().splitlines()]
    first = lines[0]
    assert first["category"] == "writing" and first["question_id"] == "81"
    c = first["choices"][0]
    assert c["turns"] == ["0 1 2 3"] and c["new_tokens"] == [4] and c["wall_time"] == [1.0]
    assert c["accept_lengths"] == [1, 3] and c["decoding_steps"] == [2]
    # what speed.py computes from these fields: mean over questions of tokens / time
    speeds = [sum(l["choices"][0]["new_tokens"]) / sum(l["choices"][0]["wall_time"]) for l in lines]
    assert speeds == [4.0, 4.0]


def test_categories_use_specbench_names():
    cats = specbench.categories("mt-bench")
    assert set(cats.values()) == {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                  "humanities"}
    assert set(specbench.categories("sharegpt-translate").values()) == {"translation"}


def test_bad_records_are_one_error(tmp_path, capsys):
    with pytest.raises(UserError, match="lacks new_tokens, wall_time"):
        specbench.export([{"question_id": "1", "decoder": "x", "tokens": [], "accept_lengths": []}], tmp_path,
                         str, lambda r: "writing")
    from common.errors import cli_main
    with pytest.raises(SystemExit) as e:
        cli_main(lambda: specbench._main([str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]))
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err


@pytest.mark.model
def test_cli_on_committed_records(tmp_path):
    from pathlib import Path
    src = Path("results/cross/raw/bench_baselines.jsonl")
    recs = [json.loads(l) for l in src.read_text().splitlines()[:3]]
    write_jsonl(tmp_path / "r.jsonl", recs)
    specbench._main([str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "out")])
    files = list((tmp_path / "out").glob("*.jsonl"))
    assert files
    line = json.loads(files[0].read_text().splitlines()[0])
    assert line["category"] in {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                "humanities"}
    assert isinstance(line["choices"][0]["turns"][0], str) and line["choices"][0]["turns"][0]


def test_category_of_records():
    """A record's Spec-Bench category: its dataset's task where the dataset stands for one, else the
    sample's own (common.harness.bench records it); a record with neither is one error."""
    assert specbench.category_of({"dataset": "mt-bench", "category": "stem"}) == "stem"
    assert specbench.category_of({"dataset": "sharegpt-rag", "category": "sharegpt-rag"}) == "rag"
    assert specbench.category_of({"dataset": "gsm8k"}) == "math_reasoning"
    with pytest.raises(UserError, match="has no category"):
        specbench.category_of({"dataset": "mt-bench", "question_id": "81"})


def test_export_reads_the_records_text_and_names_files(tmp_path):
    recs = [rec("vanilla", "81", 2, 1.0, [1, 1], text="hello there", category="writing"),
            rec("vanilla@aa", "81", 2, 1.1, [1, 1], text="hello there", category="writing")]
    out = specbench.export(recs, tmp_path, name=lambda r: f"{r['decoder']}.jsonl")
    assert out == {"vanilla.jsonl": 1, "vanilla@aa.jsonl": 1}
    line = json.loads((tmp_path / "vanilla@aa.jsonl").read_text())
    assert line["choices"][0]["turns"] == ["hello there"] and line["category"] == "writing"
    with pytest.raises(UserError, match="no decoded text"):
        specbench.export([rec("vanilla", "81", 2, 1.0, [1, 1], category="writing")], tmp_path / "x")


def test_ranks_beside_the_leaderboard_by_hand():
    """Per Spec-Bench task, the order of the methods both rank, ours beside the board's: a method
    we did not run (or did not run on that task) is left out, Spearman needs three methods."""
    from common.harness.specbench import ranks_beside, task_of

    board = {"speedup": {"EAGLE": [2.0, 1.5, 3.0], "PLD": [1.5, 1.0, 2.5], "Medusa": [1.8, 1.2, 2.8],
                         "Hydra": [1.9, 1.4, 2.9]}}
    methods = {"EAGLE": "eagle@s", "PLD": "prompt_lookup", "Medusa": "medusa@t16", "REST": "rest@d16"}
    ours = {"mt_bench": {"eagle@s": 1.1, "prompt_lookup": 1.6, "medusa@t16": 1.0, "vanilla": 1.0, "rest@d16": 0.9},
            "summarization": {"prompt_lookup": 2.0, "eagle@s": 1.2}}
    rows = {r["task"]: r for r in ranks_beside(ours, board, methods, ["mt_bench", "summarization", "overall"])}
    assert set(rows) == {"mt_bench", "summarization"}  # no records of ours for "overall": no row
    mt = rows["mt_bench"]
    assert mt["methods"] == 3 and mt["ours"] == "PLD > EAGLE > Medusa" and mt["specbench"] == "EAGLE > Medusa > PLD"
    # ranks of (EAGLE, PLD, Medusa): ours 2, 3, 1; its 3, 1, 2 -> Spearman -1/2
    assert mt["spearman"] == pytest.approx(-0.5) and mt["same_fastest"] is False
    su = rows["summarization"]
    assert su["methods"] == 2 and su["spearman"] is None and su["same_fastest"] is False
    # the same order on both sides is exactly 1 (the unrounded float of pandas' corr was 0.9999999999999999)
    five = {m: m.lower() for m in "ABCDE"}
    same = ranks_beside({"t": {lab: 5.0 - i for i, lab in enumerate(five.values())}},
                        {"speedup": {m: [9.0 - i] for i, m in enumerate(five)}}, five, ["t"])
    assert same[0]["spearman"] == 1.0
    assert [task_of(c) for c in ("writing", "math", "math_reasoning", "rag", "code")] == [
        "mt_bench", "mt_bench", "math_reasoning", "rag", None]


def test_the_leaderboard_file_names_study_labels_and_one_value_per_task():
    """Every board gives each method one speedup per task column, and every method maps to a
    label the embedded study runs (so a renamed label cannot silently drop out of the ranking)."""
    from common.config import load_profile
    from common.workflow.artifacts import study_section
    from common.harness.specbench import leaderboard

    lb = leaderboard()
    assert lb["tasks"][-1] == "overall" and lb["source"]["commit"]
    for board in lb["boards"].values():
        assert all(len(v) == len(lb["tasks"]) for v in board["speedup"].values())
        assert set(board["speedup"]) <= set(lb["methods"]) and set(board["tau"]) == set(board["speedup"])
    assert set(lb["methods"].values()) <= set(study_section(load_profile(None, "embedded"))["bench"]["decoders"])
