"""bild.tables: the bild.* sweep tables and verdict inputs, from small synthetic sweep points."""
import pandas as pd
import pytest

from bild import tables as T


def points(**cols):
    return pd.DataFrame(cols)


def test_vs_large_scores_against_vanillas_text():
    recs = [{"decoder": "vanilla", "question_id": 0, "text": "the cat sat on the mat"},
            {"decoder": "bild@fb0.5_rb2", "question_id": 0, "text": "the cat sat on the mat"},
            {"decoder": "bild@fb0.9_rb5", "question_id": 0, "text": "a dog ran far away now"}]
    q = T.vs_large(recs, "rouge_l")
    assert q["vanilla"] == pytest.approx(q["bild@fb0.5_rb2"]) and q["bild@fb0.9_rb5"] < q["vanilla"]


def test_stand_in_note_names_the_weak_metric():
    p = points(task=["translate", "translate", "summarize"], decoder=["vanilla", "x", "vanilla"], quality=[1.4, 9, 20])
    assert "BLEU ~1.4" in T.stand_in_note(p)
    assert T.stand_in_note(p[p.task == "summarize"]) == "stand-in references (ShareGPT replies)"
    assert T.stand_in_note(p.assign(task="xsum")) == "the tasks' own references"


def test_span_dominated_and_grid():
    g = points(decoder=["vanilla", "bild@fb0.5_rb2", "bild@fb0.9_rb5", "bild@fb0.5_rb2_norb"],
               latency=[1.0, 0.8, 1.3, 0.7], quality=[10.0, 9.0, 11.0, 8.0], task=["a"] * 4)
    assert T.span(g) == "latency 0.70-1.30x of vanilla (3 settings)"
    front = g.iloc[1:3]
    assert T.dominated(g.iloc[3].rename(None), points(latency=[0.7], quality=[8.5]))
    assert not T.dominated(g.iloc[3], front)  # nothing as fast as 0.7
    assert list(T.grid_points(g).decoder) == ["vanilla", "bild@fb0.5_rb2", "bild@fb0.9_rb5"]


def test_reaches_speedup_and_falls_with_rollback():
    grid = points(task=["a", "a", "a"], variant=["aligned", "aligned", "unaligned"],
                  decoder=["vanilla", "bild@fb0.5_rb2", "bild@fb0.5_rb2"], speedup=[1.0, 1.2, 0.9])
    assert T.reaches_speedup(grid, ["a"]) == [False, True]
    tab = points(task=["a"] * 3, fallback_threshold=[0.5] * 3, rollback_threshold=[5.0, 2.0, 3.0],
                 latency=[0.7, 0.9, 0.8])
    assert T.falls_with_rollback(tab) == [True, True]
    assert T.falls_with_rollback(tab.assign(latency=[0.9, 0.7, 0.8])) == [False, False]


PAPER = {"stand_in": {"xsum": "summarize", "iwslt": "translate"}, "vanilla": {"xsum": 35.0},
         "aligned": {"no_loss": {"xsum": [35.1, 1.5]}, "within": {"xsum": [34.5, 1.8]}}}


def sweep(decoders, quality, speedup):
    return points(decoder=decoders, quality=quality, speedup=speedup, latency=[1 / s for s in speedup],
                  agree_tokens=[1.0, 0.9, 0.8][:len(decoders)], quality_vs_large=[100.0, 95.0, 80.0][:len(decoders)])


def test_table1_rows_take_the_fastest_cell_and_the_papers():
    g = sweep(["vanilla", "bild@fb0.5_rb2", "bild@fb0.9_rb5"], [10.0, 10.2, 9.5], [1.0, 1.2, 1.6])
    recs = [{"decoder": "vanilla", "new_tokens": 10, "wall_time": 2.0}, {"decoder": "bild@fb0.5_rb2", "new_tokens": 10,
                                                                          "wall_time": 1.0}]
    rows = T.table1_rows("summarize", "aligned", g, recs, PAPER, "aligned")
    no_loss, within = rows
    assert (no_loss["setting"], within["setting"]) == ("bild@fb0.5_rb2", "bild@fb0.9_rb5")
    assert no_loss["vanilla_tok_s"] == 5.0 and within["agree_tokens"] == 0.8 and within["quality_vs_large"] == 80.0
    assert no_loss["paper xsum"] == "35.1 (35.0), 1.5x" and "paper iwslt" not in no_loss
    assert "paper xsum" not in T.table1_rows("summarize", "reduced", g, recs, PAPER)[0]  # beyond the paper: no cells
    none = T.table1_rows("summarize", "aligned", sweep(["vanilla", "bild@fb0.5_rb2"], [10.0, 5.0], [1.0, 1.2]),
                         recs, PAPER, "aligned")
    assert none[0]["setting"] == "none" and none[0]["speedup"] is None
    beside = T.paper_speedups(pd.DataFrame(rows), PAPER)
    assert beside.paper_speedup.tolist() == [1.5, 1.8] and beside.speedup.tolist() == [1.2, 1.6]


def test_kinds_of_sweep_labels():
    assert [T.ablation_kind(d) for d in ("vanilla", "bild@fb0.5_rb2_norb", "bild@fb0.5_handover8", "bild@fb0.5_rb2")] \
        == ["vanilla", "no rollback", "no fallback", "BiLD"]
    assert [T.sampling_kind(d) for d in ("speculative@g4_t1", "speculative@g4", "bild@fb0.5_rb2", "bild_x", "vanilla")] \
        == ["speculative sampling", "speculative (greedy)", "BiLD", "other", "vanilla"]


def test_within_one_rows_picks_the_fastest_setting_within_a_point():
    g = points(decoder=["vanilla", "a", "b", "c"], quality=[10.0, 9.5, 8.0, 9.2], speedup=[1.0, 1.1, 2.0, 1.3],
               agree_tokens=[1.0, 0.9, 0.5, 0.8])
    paper = {"within_speedup": {"IWSLT": 1.6}, "stand_in": {"IWSLT": "translate"}}
    [row] = T.within_one_rows({("translate", "bild"): g}, ["translate"], paper)
    assert row["best_within_1"] == "c" and row["speedup"] == 1.3 and row["paper IWSLT speedup"] == 1.6
    none = T.within_one_rows({("translate", "bild"): g[g.decoder.isin(["vanilla", "b"])]}, ["translate"], paper)
    assert none[0]["best_within_1"] == "none" and none[0]["speedup"] is None


def test_no_loss_is_also_decided_against_the_large_models_greedy_output():
    recs = [{"decoder": "vanilla", "new_tokens": 10, "wall_time": 2.0}]
    # the reference metric calls bild@fb0.5_rb2 "no loss" (10.2 >= 10.0) though it keeps 90% of the
    # large model's greedy tokens: a no loss decided on the stand-in references' noise
    noisy = sweep(["vanilla", "bild@fb0.5_rb2", "bild@fb0.9_rb5"], [10.0, 10.2, 9.5], [1.0, 1.2, 1.6])
    exact = noisy.assign(agree_tokens=[1.0, 1.0, 0.8])
    rows = (T.table1_rows("summarize", "aligned", noisy, recs, PAPER, "aligned")
            + T.table1_rows("summarize", "unaligned", exact, recs, PAPER)
            + T.table1_rows("summarize", "reduced", noisy, recs, PAPER))   # beyond the paper: not counted
    table = pd.DataFrame(rows)
    assert T.kept_greedy(table) == [False, True]
    note = T.noise_note(table)
    assert note.startswith("no loss on the stand-in references only") and "summarize/aligned bild@fb0.5_rb2" in note
    assert "unaligned" not in note and "reduced" not in note and "; " not in note  # "; " splits a verdict line
    assert T.noise_note(table[table.variant != "aligned"]) is None
    # a cell with no no-loss setting keeps nothing and is no noise either
    none = pd.DataFrame(T.table1_rows("summarize", "aligned", sweep(["vanilla", "bild@fb0.5_rb2"], [10.0, 5.0],
                                                                    [1.0, 1.2]), recs, PAPER, "aligned"))
    assert T.kept_greedy(none) == [False] and T.noise_note(none) is None
