"""EAGLE-3's ablation table (common.harness.ablation_tables): what each row adds read from the
training records, each head's benchmark row found by the label that drafts with it, and a head
nobody benchmarked left visible rather than dropped."""
import pandas as pd
import pytest

from common.harness.ablation_tables import ablation_rows, adds, head_label
from common.harness.report import summarize

EAGLE = {"component": "eagle_head", "kind": "eagle", "corpus": {"dir": "results/corpus/embedded", "answer_tokens": 1000},
         "steps": 4480, "train_wall_s": 3600.0, "stopped": "max steps", "depth_acc_top1": [0.5, 0.4, 0.35, 0.3, 0.2],
         "tree_expected_accept_length": {"8": 2.0}}
FUSED = {"component": "eagle3_head", "fused_layers": [2, 15, 27], "ttt_steps": 1,
         "corpus": {"dir": "results/corpus/embedded", "answer_tokens": 1000}, "steps": 1000, "train_wall_s": 7200.0,
         "stopped": "flat", "depth_acc_top1": [0.52, 0.41], "tree_expected_accept_length": {"8": 2.1}}
TTT = {**FUSED, "ttt_steps": 7, "depth_acc_top1": [0.53, 0.47, 0.44, 0.42]}
DATA = {**TTT, "corpus": {"dir": "results/corpus/embedded-turns", "answer_tokens": 5000}}
STATS = {"eagle": EAGLE, "eagle3_fused_1m": FUSED, "eagle3_1m": TTT, "eagle3": DATA}
OPTIONS = {"eagle@static8v8k": {"head": "{eagle}", "tree": 8}, "eagle3@static8_fused1m": {"head": "{eagle3_fused_1m}"},
           "eagle3@static8_1m": {"head": "{eagle3_1m}"}, "eagle3@static8": {"head": "{eagle3}"}}


def _records():
    """Two prompts; per label (wall seconds, steps): the speedups and taus are then known exactly."""
    out = []
    for label, wall, steps in (("vanilla", 10.0, 20), ("eagle@static8v8k", 8.0, 10), ("eagle3@static8_fused1m", 5.0, 8),
                               ("eagle3@static8_1m", 4.0, 5)):
        for q in (1, 2):
            out.append({"question_id": q, "decoder": label, "tokens": [q, 7], "new_tokens": 20, "steps": steps,
                        "wall_time": wall, "peak_mem_bytes": 0})
    return out


def test_each_row_says_what_it_adds_from_the_records():
    assert adds(None, EAGLE) == "baseline"
    assert adds(EAGLE, FUSED) == "fused features (layers 2, 15, 27)"
    assert adds(FUSED, TTT) == "training-time test (7 steps)"
    assert adds(TTT, DATA) == "corpus results/corpus/embedded-turns (5,000 answer tokens)"
    assert adds(TTT, TTT) == "nothing (same recipe)"
    # the precision of the training steps differs from the row before: said, beside what it adds
    bf16 = {**TTT, "precision": "bfloat16"}
    assert adds(FUSED, bf16) == "training-time test (7 steps) + bfloat16 training steps"
    assert adds(bf16, {**DATA, "precision": "bfloat16"}) == adds(TTT, DATA)


def test_rows_join_each_head_with_the_label_that_drafts_with_it():
    table = ablation_rows(list(STATS), STATS, summarize(_records()), OPTIONS)
    assert list(table["head"]) == list(STATS)
    assert list(table.label) == list(OPTIONS)
    assert ablation_rows(["eagle"], STATS, summarize(_records()), {}).label.iloc[0] == "not benchmarked"
    assert table.speedup.tolist()[:3] == pytest.approx([10 / 8, 10 / 5, 10 / 4])
    assert table.tau.tolist()[:3] == pytest.approx([2.0, 2.5, 4.0])
    assert pd.isna(table.speedup.iloc[3]) and pd.isna(table.tau.iloc[3])   # eagle3@static8 has no records yet
    assert table.top1_d1.tolist() == [0.5, 0.52, 0.53, 0.53]
    assert pd.isna(table.top1_d3.iloc[1])   # a record measured to depth 2 leaves depth 3 empty
    assert table.identical.iloc[0] == "2/2" and table.train_h.iloc[1] == 2.0
    assert set(table.precision) == {"float32"}   # records without the key trained in float32


def test_a_head_drafted_by_two_labels_is_ambiguous():
    assert head_label("eagle", {"a": {"head": "{eagle}"}, "b": {"x": 1}}) == "a"
    assert head_label("eagle3", {"a": {"head": "{eagle}"}}) is None
    with pytest.raises(ValueError, match="several benchmark labels"):
        head_label("eagle", {"a": {"head": "{eagle}"}, "b": {"head": "{eagle}"}})
