"""prompt_decoding.tables: the pd.* tables computed from small synthetic benchmark and training records."""
import numpy as np
import pandas as pd
import pytest

from prompt_decoding import tables as T


def bench(decoder, q, wall, steps, tokens=(1, 2, 3, 4), extra=None, accept=None):
    return {"question_id": q, "decoder": decoder, "tokens": list(tokens), "new_tokens": len(tokens), "steps": steps,
            "wall_time": wall, "peak_mem_bytes": 2**20, "extra": extra or {}, "accept_lengths": accept or [],
            "device": "cpu: X"}


def test_labels():
    assert T.size_of("prompt_decoding@t24") == 24 and T.size_of("prompt_decoding@static24") == 24
    assert T.size_of("vanilla") is None
    assert T.pd_sizes(["prompt_decoding@t8", "prompt_decoding@static4", "medusa@t16", "prompt_decoding@t4"]) == [4, 8]
    assert T.gamma_of("speculative@g4") == 4 and T.gamma_of("vanilla") is None


def spec_run():
    dx = {"draft_forwards": 2, "proposed": [2, 2], "draft_forward_s": 0.02, "target_forward_s": 0.1}
    px = {**dx, "draft_forwards": 1}  # the prompt tokens guess the second draft token too
    recs = []
    for q in (0, 1):
        recs += [bench("vanilla", q, 1.0, 4), bench("speculative@g2", q, 0.8, 2, extra=dx, accept=[2, 2]),
                 bench("speculative@g3", q, 0.9, 2, extra=dx, accept=[3, 1]),
                 bench("pd_speculative@g2", q, 0.5, 2, extra=px, accept=[2, 2 if q else 1])]
    return {"mt-bench": recs}


def test_spec_table_gains_and_chains():
    runs = spec_run()
    t = T.spec_table(runs).set_index("decoder")
    assert t.loc["pd_speculative@g2", "draft_tokens_per_forward"] == 4.0
    assert t.loc["speculative@g2", "draft_tokens_per_forward"] == 2.0
    assert t.loc["speculative@g2", "draft_ms_per_step"] == pytest.approx(10.0)
    assert pd.isna(t.loc["vanilla", "draft_tokens_per_forward"]) and pd.isna(t.loc["vanilla", "gamma"])
    assert list(t.index[t.best]) == ["speculative@g2", "pd_speculative@g2"]  # each drafter's fastest gamma
    g = T.spec_gains(T.spec_table(runs), 1.22)
    assert g.gain.iloc[0] == pytest.approx(0.8 / 0.5) and g.paper_gain.iloc[0] == 1.22
    assert T.same_chains(runs, [2.0, 3.0]) == [False, True]  # prompt 0 accepted [2, 1] against [2, 2]


def test_paper_table1_speedups_over_each_models_vanilla():
    t1 = {"columns": ["tokens_per_s", "tau"], "rows": {"m": {"vanilla": [10.0, 1.0], "ppd": [25.0, 2.5]}}}
    p = T.paper_table1(t1)
    assert p.speedup.tolist() == [1.0, 2.5]


ACC = [[0.5, 0.2, 0.1, 0.05, 0.05], [0.3, 0.2, 0.1, 0.1, 0.1]]  # per distance, per rank


def pd_stats(**kw):
    return {"acc": ACC, "m": 2, "n": 1, "params": 100, "params_pct_of_base": 0.01, "train_wall_s": 60.0, **kw}


def test_speed_and_throughput_tables_pick_the_hardware_aware_size():
    cost = lambda n: 1.0 + 0.5 * (n > 8)  # flat to 8 positions, dearer above  # noqa: E731
    recs = []
    for q in (0, 1):
        recs += [bench("vanilla", q, 1.0, 4), bench("prompt_decoding@t8", q, 0.6, 2),
                 bench("prompt_decoding@t24", q, 0.5, 2), bench("medusa@t16", q, 0.7, 3)]
    hw = T.hardware_label(pd_stats(), [r["decoder"] for r in recs], cost)
    assert hw == "prompt_decoding@t8"  # a bigger tree gains less tau than the steep cost takes
    t = T.speed_table(recs, None, pd_stats(), {"params": 1_000_000}, cost).set_index("decoder")
    assert list(t.index[t.hardware_choice]) == [hw]
    assert t.loc["prompt_decoding@t8", "trainable_pct"] == 0.01
    assert t.loc["medusa@t16", "trainable_pct"] == pytest.approx(100 * 1_000_000 / 1_000_000)
    assert t.loc["vanilla", "ms_per_step"] == pytest.approx(250.0)
    f5 = T.throughput_table({"mt-bench": recs, "math": recs}, pd_stats(), cost)
    assert list(f5.prompt_decoding) == [hw, hw] and f5.speedup.iloc[0] == pytest.approx(1 / 0.6)


def test_comparison_table_takes_this_sections_run_for_its_own_decoders():
    own = [bench("vanilla", 0, 1.0, 4), bench("prompt_decoding@t8", 0, 0.5, 2), bench("medusa@t16", 0, 0.8, 2)]
    cross = [bench("vanilla", 0, 1.0, 4), bench("medusa@t16", 0, 0.2, 2), bench("prompt_lookup", 0, 0.4, 2),
             bench("hf_generate", 0, 1.0, 4), bench("prompt_lookup", 0, 0.4, 2) | {"question_id": 1}]
    cross.append(bench("vanilla", 1, 1.0, 4))
    t = T.comparison_table({"mt-bench": own, "medusa": cross}, "prompt_decoding@t8")
    assert list(zip(t.decoder, t.run)) == [("prompt_lookup", "medusa"), ("prompt_decoding@t8", "mt-bench"),
                                           ("medusa@t16", "mt-bench")]
    assert list(T.paper_methods(t.assign(decoder=["prompt_lookup", "bild", "medusa@t16"])).decoder) == \
        ["prompt_lookup", "medusa@t16"]


def test_memory_and_cost_tables():
    mem = T.memory_table(pd_stats(), {"params": 400, "train_wall_s": 120.0}, None, None)
    assert list(mem.method) == ["prompt_decoding", "medusa"]
    assert mem.vs_prompt_decoding.tolist() == [1.0, 4.0] and mem.pct_of_model.tolist() == pytest.approx([0.01, 0.04])
    comp = pd.DataFrame({"decoder": ["medusa@t16", "medusa@t32", "prompt_decoding@t8", "prompt_lookup"],
                         "speedup": [1.2, 1.1, 1.5, 1.3], "run": ["mt-bench"] * 3 + ["cross"]})
    f1 = T.cost_table(mem, comp, "prompt_decoding@t8", {"mt-bench": []}, {"prompt_decoding": None, "medusa": None})
    assert list(zip(f1.method, f1.decoder, f1.speedup)) == [("prompt_decoding", "prompt_decoding@t8", 1.5),
                                                            ("medusa", "medusa@t16", 1.2),
                                                            ("prompt_lookup", "prompt_lookup", 1.3)]
    assert f1.params.tolist() == [100, 400, 0] and f1.same_weights.isna().all()


def training(n=1, **kw):
    acc = np.tile(np.array([0.1] * 5 + [0.01] * 5) * n, (2, 1)).tolist()  # 2 distances x 10 ranks
    return {"n": n, "acc": acc, "mask": "ensemble", "distill": True, "config": {"batch_size": 1},
            "train_sequences": 10, "heldout_sequences": 2, "steps": 20, "stopped": "flat", "train_wall_s": 120.0,
            "params": 5, "hardware": "cpu: X, torch 2", **kw}


def test_plain_and_accuracy_columns():
    main = training()
    assert T.plain(training(2), main) and not T.plain(training(prefix=True), main)
    assert not T.plain(training(config={"batch_size": 4}), main) and not T.plain(training(distill=False), main)
    c = T.acc_cols(training(stage1_wall_s=60.0))
    assert [c[k] for k in T.COLS] == pytest.approx([0.1, 0.5, 0.1, 0.5]) and c["train_min"] == 3.0
    assert T.accumulated([[0.5, 0.25]]).tolist() == [[0.5, 0.75]]


def test_ablation_table_beside_the_paper_and_its_comparisons():
    stats = {"main": training(), "prefix": training(2, prefix=True)}
    key = lambda s: "with" if s.get("prefix") else "without"  # noqa: E731
    t = T.ablation_table(stats, key, {"without": [1, 2, 3, 4]})
    assert t.paper_acc1_top1.iloc[0] == 1 and pd.isna(t.paper_acc1_top1.iloc[1])  # no paper row "with"
    assert T.no_better(t, "with", "without") == [True] * 4 and T.no_better(t, "without", "with") == [False] * 4
    assert T.paper_no_better({"a": [1, 2, 3, 4], "b": [1, 3, 2, 4]}, "a", "b") == [True, False, True, True]


def test_ept_table_rising_and_accumulated_table():
    stats = {"main": training(1), "n2": training(2)}
    t2 = {"columns": T.COLS, "rows": {"1": [0.1, 0.2, 0.3, 0.4], "4": [0.2, 0.3, 0.4, 0.5]}}
    table, ours, pp = T.ept_table(stats, {1: "main", 2: "n2"}, t2)
    assert table.paper_acc1_top1.tolist()[0] == 0.1 and pd.isna(table.paper_acc1_top1.iloc[1])
    assert T.rising(ours) == [True] * 4 and T.rising(ours.assign(EPTs=[2, 1])) == [False] * 4
    f6 = T.accumulated_table(training(1), {"accuracy": [[0.2] * 10]}, training(2))
    assert len(f6) == 2 * 4 and "prompt_tokens_2ept" in f6
    assert f6.medusa_head.iloc[:4].tolist() == pytest.approx([0.2, 0.6, 1.0, 2.0])
    assert f6.medusa_head.iloc[4:].isna().all()  # Medusa has no second head here


def curve(seen, top1, loss=(9.0, 5.0, 4.0, 3.0)):
    return pd.DataFrame({"step": range(len(seen)), "examples_seen": seen, "train_loss": list(loss)[:len(seen)],
                         "heldout_top1": [[a, a / 2] for a in top1], "heldout_top5": [[a + 0.1, a] for a in top1]})


def test_loss_and_recipe_tables():
    stats = {"ref": training(1), "b4": training(1, config={"batch_size": 4})}
    curves = {"ref": curve([0, 10, 20, 30], [0.1, 0.2, 0.3, 0.4]), "b4": curve([0, 12, 24], [0.1, 0.25, 0.35])}
    f9 = T.loss_table(stats, curves, {1: "ref"})
    assert (f9.first_loss.iloc[0], f9.last_loss.iloc[0], f9.min_loss.iloc[0], f9.epochs.iloc[0]) == (5.0, 3.0, 3.0, 3.0)
    table, equal, batch = T.recipe_table(stats, curves, "ref")
    assert batch == ["b4"]
    assert list(table.variant) == ["ref", "b4", "ref (curve)", "ref (curve)", "ref (curve)",
                                   "ref (curve, 20 seen)", "b4 (curve, 24 seen)"]
    assert table.epochs.tolist()[:2] == [2.0, 8.0]  # steps x batch / training sequences
    # at equal sequences seen (the fewer: 24): the reference's nearest evaluation is at 20
    assert equal[("b4", "ref")]["acc1_top1"] == 0.3 and equal[("b4", "b4")]["acc1_top1"] == 0.35


def test_the_accuracies_each_comparison_rests_on_are_its_tie_pairs():
    # pd.table3-8 and pd.table2 pass these to Render.trend(..., ties=...): they must be the very
    # numbers no_better / rising compare, in their order, or a tie would be judged on other gaps
    stats = {"main": training(), "learned": training(), "prefix": training(2, prefix=True)}
    t = T.ablation_table(stats, lambda s: "with" if s.get("prefix") else s.get("aggregation", "average"), {})
    g = T.gaps(t, "average", "with")
    assert np.allclose(g, [(0.2, 0.1), (1.0, 0.5), (0.2, 0.1), (1.0, 0.5)])
    assert [b <= a for b, a in g] == T.no_better(t, "average", "with")
    _, ours, _ = T.ept_table({"main": training(1), "n2": training(2)}, {2: "n2", 1: "main"},
                             {"columns": T.COLS, "rows": {"1": [0.1, 0.2, 0.3, 0.4]}})
    c = T.consecutive(ours)
    assert np.allclose(c, [(0.1, 0.2), (0.5, 1.0), (0.1, 0.2), (0.5, 1.0)])
    assert [b >= a for a, b in c] == T.rising(ours)


def test_an_ablation_decided_on_single_seed_gaps_below_the_tolerance_is_a_tie(tmp_path):
    # pd.table7's shape: every metric of the two trainings within report.ACCURACY_TOL, one seed
    from common.harness import report
    from common.harness.render import Render
    raw = tmp_path / "prompt_decoding" / "raw"
    raw.mkdir(parents=True)
    (raw / "x.jsonl").write_text('{"a": 1}\n')
    R = Render("pd.table7", str(tmp_path), "prompt_decoding", "embedded", inputs=[str(raw / "x.jsonl")])
    near = training(1)
    near["acc"] = (np.asarray(near["acc"]) + report.ACCURACY_TOL / 20).tolist()  # top-5 sums 5 ranks: < tol
    t = T.ablation_table({"a": training(1), "b": near}, lambda s: "learned" if s is near else "average", {})
    line = R.trend("the average >= learned", T.no_better(t, "average", "learned"), ties=T.gaps(t, "average", "learned"))
    assert report.tie_note(report.ACCURACY_TOL) in line and "holds" not in line
    far = training(2)
    t = T.ablation_table({"a": training(1), "b": far}, lambda s: "learned" if s is far else "average", {})
    line = R.trend("the average >= learned", T.no_better(t, "average", "learned"), ties=T.gaps(t, "average", "learned"))
    assert "tie" not in line and line.endswith("does not hold here")
