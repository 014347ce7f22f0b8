"""firp.tables: the firp.* tables computed from small synthetic benchmark, top-k and training records."""
import pandas as pd
import pytest

from firp import tables as T


def bench(decoder, q, wall, steps, tokens=(1, 2, 3, 4), text="a b c", reference="a b c", device="cpu: X, torch 2"):
    return {"question_id": q, "decoder": decoder, "tokens": list(tokens), "new_tokens": len(tokens), "steps": steps,
            "wall_time": wall, "peak_mem_bytes": 2**20, "text": text, "reference": reference, "device": device}


def run(firp_wall=(0.5, 0.25), medusa_wall=(1.0, 0.8)):
    """vanilla at 1 s a prompt; FIRP at two tree sizes; Medusa at one; two prompts."""
    recs = []
    for q in (0, 1):
        recs.append(bench("vanilla", q, 1.0, 4))
        recs.append(bench("firp@t16", q, firp_wall[0], 2))
        recs.append(bench("firp@t32", q, firp_wall[1], 2, tokens=(1, 2, 3, 9) if q else (1, 2, 3, 4)))
        recs.append(bench("medusa@t16", q, medusa_wall[0], 3))
    return recs


DRAFT = T.draft_params({"params": 2_000_000}, None)


def test_labels_and_the_fastest_tree():
    assert (T.method("firp@t16"), T.nodes("firp@t16"), T.nodes("vanilla")) == ("firp", 16, None)
    s = pd.DataFrame({"speedup": [1.0, 2.0, 4.0]}, index=["vanilla", "firp@t16", "firp@t32"])
    assert T.best_of(s, "firp") == "firp@t32" and T.best_of(s, "medusa") is None
    assert DRAFT == {"firp": 2_000_000, "medusa": None, "self_speculative": 0, "vanilla": 0}


def test_quality_table_takes_each_methods_fastest_label_and_skips_mt_bench():
    t = T.quality_table({"summarize": run(), "mt-bench": run()}, DRAFT)
    assert list(t.dataset.unique()) == ["summarize"]
    assert list(t.method) == ["vanilla", "medusa", "firp"]  # no self-speculative run: no row
    firp = t.set_index("method").loc["firp"]
    assert firp.decoder == "firp@t32" and firp.speedup == pytest.approx(4.0) and firp.identical == "1/2"
    assert firp.draft_params_m == 2.0 and t.set_index("method").loc["medusa"].draft_params_m == 0.0
    assert firp.rouge2 == pytest.approx(1.0)  # outputs equal to their references


def test_paper_speedups_stand_beside_the_dataset_they_stand_in_for():
    t1 = {"columns": ["xsum_rouge", "xsum_speedup", "gsm8k_rouge", "gsm8k_speedup"],
          "rows": {"llama": {"autoregressive": [1, 1.0, 1, 1.0], "firp": [1, 2.5, 1, 3.5]}, "vicuna": {}}}
    table = pd.DataFrame({"dataset": ["sharegpt-summarize", "sharegpt-math", "sharegpt-math", "other"],
                          "method": ["firp", "vanilla", "medusa", "firp"]})
    assert T.paper_speedups(table, t1) == ("llama", [2.5, 1.0, None, None])
    assert len(T.paper_table1(t1)) == 2


def test_mt_bench_table_adds_lookahead_without_its_vanilla():
    la = [bench("vanilla", 0, 1.0, 4, device="cpu: Y, torch 2"), bench("lookahead@w4", 0, 0.5, 2, device="cpu: Y, torch 2")]
    t = T.mt_bench_table(run(), la, DRAFT)
    assert list(t.decoder) == ["vanilla", "firp@t16", "firp@t32", "medusa@t16", "lookahead@w4"]
    assert list(t.ran_on) == ["cpu: X"] * 4 + ["cpu: Y"]
    assert t.draft_params_m.tolist() == [0.0, 2.0, 2.0, 0.0, 0.0]
    assert len(T.mt_bench_table(run(), None, DRAFT)) == 4


def test_accepted_length_table_expects_nothing_without_accuracies():
    t = T.accepted_length_table({"mt-bench": run()}, [[0.6, 0.2], [0.3, 0.1]], None)
    assert list(zip(t.method, t.nodes)) == [("firp", 16), ("firp", 32), ("medusa", 16)]
    assert t.tau.tolist() == pytest.approx([2.0, 2.0, 4 / 3])
    assert t.tau_expected.iloc[0] > 1 and pd.isna(t.tau_expected.iloc[2])  # Medusa: no accuracies known


def test_method_table_leaves_out_vanilla():
    t = T.method_table(run(firp_wall=(2.0, 2.0)), DRAFT)
    assert list(t.method) == ["medusa", "firp"] and t.speedup.iloc[0] == pytest.approx(1.0)


def stats(layers, acc, mask=False, steps_k=None):
    return {"layers": layers, "acc": acc, "mask_earlier": mask, "steps_k": steps_k or len(layers),
            "train_sequences": 10, "heldout_sequences": 2, "steps": 5, "stopped": "flat", "train_wall_s": 90.0,
            "hardware": "cpu: X, torch 2"}


def test_top_sums_rank_hit_rates():
    assert T.top([0.5, 0.2, 0.1], 2) == pytest.approx(0.7) and T.top([0.5], 3) == 0.5


def test_accuracy_tables_by_layer_and_step():
    st = {"hi": stats([18], [[0.1, 0.1, 0, 0, 0.1]]), "lo": stats([10], [[0.3, 0.1, 0, 0, 0]])}
    t = T.layer_table(st)
    assert list(t.variant) == ["lo", "hi"] and t.top5.tolist() == pytest.approx([0.4, 0.3])
    assert t.iloc[0].train_min == 1.5 and t.iloc[0].trained_on == "cpu: X"
    assert T.middle_layer(t.layer, 32) == 18  # the paper's 15 of 32 is nearer 18 than 10
    assert T.middle_layer(t.layer, 16) == 10  # 7.5 of 16
    two = {"a": stats([5, 9], [[0.4], [0.2]]), "b": stats([5, 7], [[0.4], [0.3]])}
    assert list(T.second_step_table(two).step2_layer) == [7, 9]
    m = T.mask_table({"on": stats([5, 9], [[0.4], [0.3]]), "off": stats([5, 9], [[0.4], [0.1]], mask=True)})
    assert list(m.setting) == ["not masked", "masked"] and m.step2_top1.tolist() == [0.3, 0.1]
    with pytest.raises(ValueError, match="fig7: a must train"):
        T.check_trainings({"a": stats([1], [[0.1]])}, lambda s: s["steps_k"] >= 2, "must train two", "fig7")


def test_topk_table_and_the_comparison_per_step():
    recs = [{"method": m, "step": s, "distance": s + 1, "layer": 3, "acc": acc, "params": 7, "share_lm_head": True,
             "steps": 5, "stopped": "flat"} for m, s, acc in
            [("firp", 1, [0.5, 0.1]), ("firp", 2, [0.2]), ("medusa", 1, [0.4, 0.3]), ("medusa", 2, [0.1])]]
    names = T.method_names(recs)
    assert names == {"firp": "FIRP", "medusa": "Medusa"}
    df = T.topk_frame(recs)
    t = T.topk_table(df, names)
    assert list(t.method) == ["FIRP", "FIRP", "Medusa (shared LM head)", "Medusa (shared LM head)"]
    assert t.top1.tolist() == [0.5, 0.2, 0.4, 0.1] and t.train_seqs.isna().all()
    assert T.at_least(df, "firp", "medusa") == [True, False, False, False, False] + [True] * 5
    assert T.seen_by(df, names)["FIRP"] == {"train_sequences": "?", "heldout_sequences": "?"}


def test_cosine_table_one_column_per_maps_state():
    df = pd.DataFrame({"step": [1.0, 1.0, 1.0, 1.0], "layer": [4.0, 4.0, 8.0, 8.0],
                       "maps_state": ["trained", "identity"] * 2, "cosine": [0.5, 0.2, 0.9, 0.3]})
    t = T.cosine_table(df)
    assert list(t.columns) == ["step", "layer", "identity", "trained"] and t.layer.tolist() == [4, 8]
    assert t.trained.tolist() == [0.5, 0.9]


def test_figures_on_one_of_the_papers_models_say_so_from_the_citation():
    from common.harness.report import cut_line
    fig5 = {"cite": "Section 4.2.3, Figure 5 (Vicuna-7B, LLaMA-2-Chat-7B; first step trained at layers 5, 10)"}
    assert T.paper_models(fig5) == ["Vicuna-7B", "LLaMA-2-Chat-7B"]
    # a clause that lists no models names none, so nothing is said to be cut
    assert T.paper_models({"cite": "Section 4.3, Figure 7 (all models and datasets; steps at 15 and 20)"}) == []
    assert T.paper_models({}) == []
    stats = {"k1l5": {"model": "tiny"}, "k1l9": {"model": "tiny"}}
    assert cut_line(*T.model_cut(stats, fig5)) == "models tiny of the paper's LLaMA-2-Chat-7B, Vicuna-7B"
    # the paper's own models cover ours: no cut
    assert cut_line(*T.model_cut({"a": {"model": "Vicuna-7B"}, "b": {"model": "LLaMA-2-Chat-7B"}}, fig5)) is None


def test_the_committed_figure_citations_name_the_papers_models():
    # the notebooks' header line for Figures 5-6 reads these: a citation reworded so it names no
    # model would silently drop the cut from the header
    from common.harness.render import paper_numbers
    paper = paper_numbers("firp")
    assert len(T.paper_models(paper["fig5"])) == len(T.paper_models(paper["fig6"])) == 2


def test_the_header_says_how_the_maps_were_trained():
    joint = {"steps_k": 3}                       # a record before the option: trained jointly
    assert T.maps_training([joint]).startswith("trained jointly") and "the paper trains them separately" in \
        T.maps_training([joint])
    assert T.maps_training([{"steps_k": 3, "mode": "separate"}]).startswith("trained separately")
    assert T.maps_training([{"steps_k": 1}, {"steps_k": 1, "mode": "separate"}]).count("K = 1") == 2
    assert T.maps_training([joint, {"steps_k": 2, "mode": "separate"}]).startswith("mixed: ")
    assert T.maps_training([]) is None
