"""ppd_pipelined.tables: the ppdp.* tables and trend lines, computed from small synthetic records."""
import math

import pandas as pd
import pytest

from ppd_pipelined import tables as T


def rec(task, ranks_by_layer, classifier="N", method="greedy", max_new_tokens=8):
    """A match-rate record: per probed layer, the early rank of each generated token."""
    return {"task": task, "method": method, "max_new_tokens": max_new_tokens,
            "early": {classifier: {str(l): {"rank": r} for l, r in ranks_by_layer.items()}}}


PAPER2 = {"layers": [10, 20, 30], "rows": [["squad", 1, "N", 11.0, 22.0, 33.0]]}


def test_paper_layer_is_the_nearest_depth_fraction():
    assert T.paper_layer(2, 4, PAPER2) == 20  # half-way: the paper's 20 of 40
    assert T.paper_layer(1, 4, PAPER2) == 10
    assert T.paper_layer(4, 4, PAPER2) == 30  # beyond its last probe: the deepest one


def test_match_table_counts_ranks_below_k_and_puts_the_papers_layer_beside():
    G = T.ranks_frame([rec("squad", {1: [0, 0, 3, 5], 2: [0, 0, 0, 2]})])
    t = T.match_table(G, ["squad"], [1, 3], [1, 2], 4, PAPER2)
    k1 = t[t.k == 1].iloc[0]
    assert (k1["layer 1"], k1["layer 2"], k1.tokens) == (50.0, 75.0, 4)
    assert (k1["paper layer 10"], k1["paper layer 20"]) == (11.0, 22.0)
    k3 = t[t.k == 3].iloc[0]
    assert k3["layer 2"] == 100.0 and math.isnan(k3["paper layer 20"])  # the paper has no k = 3 row
    assert T.rises(t, ["layer 1", "layer 2"], "k", [1, 3]) == [True, True]
    assert T.grows_along(t, ["layer 1", "layer 2"]) == [True, True]


def test_rises_and_grows_along_see_a_fall():
    df = pd.DataFrame({"dataset": ["a", "a"], "k": [1, 1], "trained": ["N", "Y"], "x": [60.0, 40.0], "y": [10.0, 5.0]})
    assert T.rises(df, ["x"], "trained", ["N", "Y"]) == [False]
    assert T.grows_along(df, ["x", "y"]) == [False, False]


def test_position_table_buckets_an_eighth_of_the_length():
    G = T.ranks_frame([rec("squad", {2: [0, 9, 0, 0, 9, 9, 0, 0]})])
    paper = {"layers": [20], "rows": [["squad", 20, 1, "N", 5.0, 6.0, 7.0]]}
    t = T.position_table([rec("squad", {2: []})], G, ["squad"], [1], [2], 4, paper)
    row = t.iloc[0]
    assert row["tokens per bucket"] == 1
    assert [row[f"bucket {j}"] for j in range(1, 9)] == [100.0, 0.0, 100.0, 100.0, 0.0, 0.0, 100.0, 100.0]
    assert row.Total == 62.5 and (row["paper bucket 1"], row["paper Total"]) == (5.0, 7.0)
    assert list(t.columns)[-3:] == ["Total", "paper bucket 1", "paper Total"]


def test_sampling_table_and_greedy_against_sampling():
    recs = [rec("squad", {2: [0, 0, 0, 0]}),
            {**rec("squad", {2: [0, 5, 5, 5]}, method="top_k"), "method_params": {"top_k": 50}},
            {**rec("squad", {2: [0, 0, 0, 5]}, method="top_p"), "method_params": {"top_p": 0.9}}]
    names = T.sampling_names(recs)
    assert names["top_k"] == "Top-k sampling (k=50)" and names["top_p"] == "Top-p sampling (p=0.9)"
    paper = {"k": 3, "columns": ["method", "squad"], "rows": [["greedy", 80.0], ["top_k", 90.0], ["top_p", 70.0]]}
    t = T.sampling_table(T.ranks_frame(recs), names, ["squad"], 2, paper)
    at3 = t[t["early top-k"] == 3].set_index("method")[T.LABEL["squad"]]
    assert list(at3) == [100.0, 25.0, 75.0]
    assert math.isnan(t[t["early top-k"] == 1][f"paper {T.LABEL['squad']}"].iloc[0])  # the paper reports k = 3 only
    assert T.greedy_at_least_sampling(t, names, ["squad"], 3) == [True, True]
    assert T.greedy_at_least_sampling(t, names, ["squad"], 3, prefix="paper ") == [False, True]


def test_below_greedy_and_falls_with_k():
    t = pd.DataFrame({"dataset": ["a", "a", "a", "b", "b"], "method": ["greedy", "ppd", "ppd", "greedy", "ppd"],
                      "lat": [2.0, 1.0, 3.0, 1.0, 0.5]})
    assert T.below_greedy(t, "lat") == [True, False, True]
    f = pd.DataFrame({"dataset": ["a"] * 3, "trained": ["N"] * 3, "k": [3, 1, 2], "lat": [0.7, 0.9, 0.8]})
    assert T.falls_with_k(f, "lat") == [True, True]
    assert T.falls_with_k(f.assign(lat=[0.7, 0.8, 0.9]), "lat") == [False, True]  # k 1 -> 2 rises


def bench_rec(decoder, q, tokens, wall, extra=None):
    return {"task": "squad", "decoder": decoder, "question_id": q, "tokens": tokens, "new_tokens": len(tokens),
            "wall_time": wall, "extra": extra or {}}


def test_implementation_table_scales_to_the_papers_length_and_counts_identity():
    ex = {"k": 1, "layers": 4, "exit_layer": 2, "layer_time_s": 0.01, "matches": [1, 0, 1]}
    bench = [bench_rec("vanilla", 0, [1, 2, 3, 4], 0.4), bench_rec("vanilla", 1, [5, 6, 7, 8], 0.4),
             bench_rec("ppd_pipelined@k1", 0, [1, 2, 3, 4], 0.8, ex), bench_rec("ppd_pipelined@k1", 1, [5, 6, 0, 0], 0.8, ex)]
    paper = {"columns": ["dataset", "k", "p_correct", "latency_128_s", "tokens_per_s"],
             "rows": [["squad", 1, 50.0, 3.0, 40.0]]}
    t = T.implementation_table(bench, ["squad"], paper).set_index("method")
    g, p = t.loc["greedy"], t.loc["greedy (w/ PPD)"]
    assert g.measured_latency_128_s == pytest.approx(0.8 / 8 * T.PAPER_LENGTH)
    assert g.theorem_latency_128_s == pytest.approx(4 * 0.01 * T.PAPER_LENGTH)  # d layers per token at the layer time
    assert (p.workers, p.p_correct, p.identical_to_greedy) == (2, round(2 / 3, 4), "1/2")
    assert p.paper_p_correct == 0.5 and math.isnan(g.paper_latency_128_s)


def test_tradeoff_table_is_greedy_at_p_zero_and_has_no_paper_value_where_it_has_no_row():
    G = T.ranks_frame([rec("squad", {2: [9, 9, 9, 9]})])
    t = T.tradeoff_table(G, ["squad"], [1, 2], 2, 4, {("squad", 1, "N"): 0.5})
    assert list(t.p_correct) == [0.0, 0.0]
    assert t.latency_per_token.tolist() == pytest.approx([1.0, 1.0])  # no match: every token costs d layers
    assert t.paper_p_correct.iloc[0] == 0.5 and math.isnan(t.paper_latency_per_token.iloc[1])


def test_templates_table_reads_one_row_per_task():
    recs = [{"task": "squad", "paper_dataset": "SQuAD", "dataset": "mt-bench", "template": "qa",
             "template_text": "Q:\n{q}", "fields_rule": "q"}] * 3
    t = T.templates_table(recs, ["squad"])
    assert t.iloc[0].to_dict() == {"task": T.LABEL["squad"], "paper dataset": "SQuAD", "dataset used": "mt-bench",
                                   "prompts": 3, "template": "qa", "prompt": "Q:<br>{q}", "fields": "q"}


def test_heads_recipe_names_the_values_changed_from_the_paper():
    c = {"epochs": 1, "lr": 0.001, "batch_size": 4, "max_len": 512, "warmup_frac": 0.0, "weight_decay": 0.0,
         "max_grad_norm": 1.0, "seed": 0}
    m = {"init": "lm head", "frozen": "all", "dataset": "sharegpt", "sequences": 10,
         "excluded_eval_conversations": 2, "layers": [3]}
    hm = {"config": c, "meta": m, "train_tokens": 100, "steps": 5, "train_wall_s": 1.0}
    paper = {"Number of Epochs": 1, "Learning Rate": 0.0001}
    table, differ = T.heads_recipe_table(hm, paper)
    assert differ == ["Learning Rate"]
    assert list(table.hyperparameter[:2]) == ["Number of Epochs", "Learning Rate"] and table.used[1] == "0.001"
