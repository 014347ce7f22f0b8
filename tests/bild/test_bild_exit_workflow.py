"""Figures 6 and 7's plumbing without a model: the profiles' early-exit config, the rule params
(training flags, sweep settings, teacher caches), the CALM sweep analysis by hand, bad config."""
from types import SimpleNamespace

import pytest

from bild.analysis import calm_points, frontier, sweep_points
from bild.config import from_mapping, from_profile
from bild.workflow import RuleParams, calm_label
from common.config import load_profile
from common.errors import UserError


@pytest.mark.parametrize("profile", ["smoke", "embedded", "paper"])
def test_profiles_parse(profile):
    p = load_profile(None, profile)
    cfg = from_profile(p)
    ee = cfg.early_exit
    assert ee is not None and set(ee.tasks) <= set(cfg.tasks) and set(ee.train) == {"bild", "calm"}
    assert len(ee.grid()) == len(ee.fallback) * len(ee.rollback)


def _params(profile="embedded"):
    p = load_profile(None, profile)
    return RuleParams(from_profile(p), f".cache/components/{p.name}", p.model), p


def test_rule_params_of_the_embedded_profile():
    r, p = _params()
    ee = r.cfg.early_exit
    w = SimpleNamespace(exitloss="bild", btask=ee.tasks[0])
    flags = r.exit_train_flags(w)
    assert f"--exit-layer {ee.exit_layer}" in flags and "--loss bild" in flags and "--wall-budget" in flags
    calm_flags = r.exit_train_flags(SimpleNamespace(exitloss="calm", btask=ee.tasks[0]))
    assert "--exit-layer" not in calm_flags
    for loss, f in (("bild", flags), ("calm", calm_flags)):       # a cap only where the config sets one
        cap = ee.train[loss].get("per_sequence")
        assert (f"--per-sequence {cap}" in f) if cap else ("--per-sequence" not in f)
    assert r.exit_model(w) == f".cache/components/{p.name}/bild_exit_bild/model"
    assert r.exit_shares_teacher() and r.exit_teacher(w)["teacher"] == f".cache/components/{p.name}/teacher.pt"
    s = r.exit_settings(w)
    assert len(s) == len(ee.grid()) and all(o["exit_layer"] == ee.exit_layer for o in s.values())
    assert r.exit_decoders(w).split(",")[0] == "vanilla"
    c = r.exit_settings(SimpleNamespace(exitloss="calm", btask=ee.tasks[0]))
    assert len(c) == len(ee.calm_grid()) and calm_label(0.9, 4.0) == "calm@l0.9_t4"
    assert all(set(o) == {"threshold", "tau", "min_exit"} for o in c.values())


def test_a_model_other_than_the_profiles_gets_its_own_teacher():
    p = load_profile(None, "paper")
    r = RuleParams(from_profile(p), f".cache/components/{p.name}", "another-model")  # the profile's model differs
    w = SimpleNamespace(exitloss="calm", btask="iwslt")
    assert not r.exit_shares_teacher()
    assert r.exit_teacher(w) == {"teacher": f".cache/components/{p.name}/bild_exit_calm/teacher.pt",
                                 "corpus": f".cache/components/{p.name}/bild_exit_calm/corpus.pt"}


def _raw(**ee):
    base = {"model": "m", "exit_layer": 2, "tasks": ["t"], "fallback": [0.5], "rollback": [1.0],
            "calm": {"threshold": [0.9], "tau": [4.0]},
            "train": {"bild": {"labels": "text"}, "calm": {"labels": "text"}}}
    return {"model": "m", "small_layers": 2, "variants": ["aligned"], "max_prompt_tokens": 8,
            "tasks": {"t": {"dataset": "d", "n": 1, "max_new_tokens": 4, "metric": "bleu", "fallback": [0.5],
                            "rollback": [1.0]}},
            "early_exit": {**base, **ee}}


def test_bad_config():
    from bild.config import EXIT_LOSSES
    from bild.exits import LOSSES

    assert EXIT_LOSSES == LOSSES  # the torch-free config names the trainer's losses
    assert from_mapping(_raw()).early_exit.calm_grid() == [(0.9, 4.0)]
    with pytest.raises(UserError, match="not tasks of bild.tasks"):
        from_mapping(_raw(tasks=["nope"]))
    with pytest.raises(UserError, match=r"bild.early_exit.calm.threshold value 1.5 is out of range"):
        from_mapping(_raw(calm={"threshold": [1.5], "tau": [0.0]}))
    with pytest.raises(UserError, match="repeats a value"):
        from_mapping(_raw(rollback=[1.0, 1.0]))
    with pytest.raises(UserError, match="must hold exactly bild, calm"):
        from_mapping(_raw(train={"bild": {}}))
    with pytest.raises(UserError, match="unknown keys"):
        from_mapping(_raw(train={"bild": {"lr_decay": 1}, "calm": {}}))


def _rec(decoder, qid, text, ref, wall, tokens, extra=None):
    return {"decoder": decoder, "question_id": qid, "text": text, "reference": ref, "wall_time": wall,
            "tokens": tokens, "new_tokens": len(tokens), "extra": extra or {}}


def test_calm_points_by_hand():
    refs = {"a": "the cat sat on the mat", "b": "a quick brown fox"}
    recs = [_rec("vanilla", "a", "the cat sat on a mat", refs["a"], 2.0, [1, 2, 3]),
            _rec("vanilla", "b", "a quick brown dog", refs["b"], 2.0, [4, 5]),
            _rec("calm@l0.9_t4", "a", "the cat sat on a mat", refs["a"], 1.0, [1, 2, 3],
                 {"exit_layers": [30, 4, 10], "early_exits": 2}),
            _rec("calm@l0.9_t4", "b", "a quick", refs["b"], 1.0, [4, 9], {"exit_layers": [30, 30], "early_exits": 0})]
    p = calm_points(recs, "bleu").set_index("decoder")
    r = p.loc["calm@l0.9_t4"]
    assert (r.threshold, r.tau) == (0.9, 4.0) and r.speedup == pytest.approx(2.0)
    assert r.mean_exit_layer == pytest.approx((30 + 4 + 10 + 30 + 30) / 5) and r.early_exit_share == pytest.approx(2 / 5)
    assert p.loc["vanilla", "latency"] == 1.0 and p.loc["vanilla", "early_exit_share"] == 0.0
    assert "fallback_threshold" not in p.columns
    # an early-exit BiLD sweep reads with sweep_points (its labels are bild's)
    assert sweep_points(recs[:2], "bleu").decoder.tolist() == ["vanilla"]


def test_frontier():
    import pandas as pd

    pts = pd.DataFrame({"latency": [1.0, 0.5, 0.6, 0.4, 0.7], "quality": [30, 28, 27, 20, 31]})
    f = frontier(pts)
    assert f[["latency", "quality"]].values.tolist() == [[0.4, 20], [0.5, 28], [0.7, 31]]


def test_quality_gap():
    import math

    import pandas as pd

    from bild.analysis import quality_gap

    # both curves are compared at every latency either reaches; b's point at 0.75 is dominated
    a = pd.DataFrame({"latency": [0.6, 0.8, 1.0], "quality": [28.0, 30.0, 31.0]})
    b = pd.DataFrame({"latency": [0.5, 0.7, 0.75, 0.8, 0.9], "quality": [20.0, 26.0, 25.0, 27.0, 29.0]})
    g = quality_gap(a, b)
    assert g.latency.tolist() == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert g.on.tolist() == ["b", "a", "b", "both", "b", "a"]
    assert math.isnan(g.quality_a[0]) and g.quality_b.tolist() == [20.0, 20.0, 26.0, 27.0, 29.0, 29.0]
    assert math.isnan(g.gap[0]) and g.gap[1:].tolist() == [8.0, 2.0, 3.0, 1.0, 2.0]
