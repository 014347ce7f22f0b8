"""BiLD's quality metrics and sweep analysis: the libraries' scores and Table 1's selection on
cases computed by hand."""
import pytest

from common.metrics import agreement, bleu, rouge_2, rouge_l
from common.errors import UserError


def test_bleu_and_rouge_bounds_and_a_hand_case():
    refs = ["the cat sat on the mat today", "a quick brown fox jumps"]
    assert bleu(refs, refs) == pytest.approx(100.0)
    assert rouge_l(refs, refs) == pytest.approx(100.0)
    assert bleu(["zz yy xx ww vv", "qq pp oo nn mm"], refs) == pytest.approx(0.0)
    assert rouge_l(["zz yy"], ["the cat"]) == 0.0
    # LCS("the cat sat", "the cat sat on the mat") = 3: P = 3/3, R = 3/6, F1 = 2/3
    assert rouge_l(["the cat sat"], ["the cat sat on the mat"]) == pytest.approx(200 / 3)
    # bigrams: "the cat", "cat sat" of 5 in the reference -> P = 1, R = 2/5, F1 = 4/7
    assert rouge_2(["the cat sat"], ["the cat sat on the mat"]) == pytest.approx(4 / 7)
    assert rouge_2(refs, refs) == pytest.approx(1.0)


def test_agreement_by_hand():
    a = agreement([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 9, 7, 8]])
    assert a == {"identical": 0.5, "prefix": pytest.approx((1 + 0.25) / 2), "tokens": pytest.approx((1 + 0.75) / 2)}


def test_mismatched_counts_are_an_error():
    with pytest.raises(UserError, match="one reference per output"):
        bleu(["a"], ["a", "b"])
    with pytest.raises(UserError):
        agreement([], [])


def _rec(decoder, qid, text, ref, wall, tokens, source=None, fallbacks=0, rollbacks=0):
    extra = {} if source is None else {"source": source, "fallbacks": fallbacks, "rollbacks": rollbacks}
    return {"decoder": decoder, "question_id": qid, "text": text, "reference": ref, "wall_time": wall,
            "tokens": tokens, "new_tokens": len(tokens), "extra": extra}


def test_sweep_points_and_table1_by_hand():
    from bild.analysis import best_settings, sweep_points

    refs = {"a": "the cat sat on the mat", "b": "a quick brown fox"}
    recs = [_rec("vanilla", "a", "the cat sat on a mat", refs["a"], 2.0, [1, 2, 3]),
            _rec("vanilla", "b", "a quick brown dog", refs["b"], 2.0, [4, 5]),
            # as good as vanilla (same text), twice as fast; 4 of 5 tokens from the small model
            _rec("bild@fb0.5_rb2", "b", "a quick brown dog", refs["b"], 1.0, [4, 5], ["large", "small"], 1, 0),
            _rec("bild@fb0.5_rb2", "a", "the cat sat on a mat", refs["a"], 1.0, [1, 2, 3], ["large", "small", "small"], 0, 1),
            # worse and faster
            _rec("bild@fb0.2_rb6", "a", "dog", refs["a"], 0.5, [1, 9, 9], ["large", "small", "small"]),
            _rec("bild@fb0.2_rb6", "b", "a quick", refs["b"], 0.5, [4, 9], ["large", "small"]),
            # the no-rollback ablation (no threshold in its label) still counts its fallbacks
            _rec("bild@fb0.5_norb", "a", "the cat", refs["a"], 1.5, [1, 2, 3], ["large", "small", "small"], 2),
            _rec("bild@fb0.5_norb", "b", "a quick", refs["b"], 1.5, [4, 5], ["large", "large"], 1)]
    p = sweep_points(recs, "rouge_l").set_index("decoder")
    assert p.loc["vanilla", "latency"] == 1.0 and p.loc["bild@fb0.5_rb2", "speedup"] == pytest.approx(2.0)
    assert p.loc["bild@fb0.5_rb2", "quality"] == pytest.approx(p.loc["vanilla", "quality"])
    assert p.loc["bild@fb0.5_rb2", "small_share"] == pytest.approx(3 / 5)
    assert p.loc["bild@fb0.5_rb2", "rollbacks_per_token"] == pytest.approx(1 / 5)
    assert p.loc["bild@fb0.5_rb2", "identical"] == 1.0 and p.loc["bild@fb0.2_rb6", "identical"] == 0.0
    # agreement with vanilla's tokens: [1, 9, 9] vs [1, 2, 3] and [4, 9] vs [4, 5]
    assert p.loc["bild@fb0.2_rb6", "agree_tokens"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert p.loc["bild@fb0.2_rb6", "agree_prefix"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert p.loc["bild@fb0.5_rb2", "agree_tokens"] == 1.0
    assert p.loc["bild@fb0.5_norb", "fallbacks_per_token"] == pytest.approx(3 / 5)
    assert p.loc["bild@fb0.5_norb", "rollbacks_per_token"] == 0.0 and p.loc["vanilla", "fallbacks_per_token"] == 0.0
    assert (p.loc["bild@fb0.2_rb6", "fallback_threshold"], p.loc["bild@fb0.2_rb6", "rollback_threshold"]) == (0.2, 6.0)
    best = best_settings(p.reset_index())
    assert best["no_loss"]["decoder"] == "bild@fb0.5_rb2" and best["no_loss"]["speedup"] == pytest.approx(2.0)
    assert best["within"]["decoder"] == "bild@fb0.5_rb2"  # the faster one loses far more than a point
    assert best_settings(p.reset_index(), tolerance=100)["within"]["decoder"] == "bild@fb0.2_rb6"


def test_model_table_counts_match_the_real_models():
    """bild.model_configs counts parameters on the meta device; the real models agree."""
    from bild.model_configs import describe, truncated_config
    from common.components.draft_model import truncated_copy
    from common.assets.models import param_count, tiny_llama, tiny_t5

    t5 = tiny_t5()
    d = describe(t5.config)
    assert d["kind"] == "encoder-decoder" and d["layers"] == "2 + 2" and d["params"] == param_count(t5)
    llama = tiny_llama()
    small = describe(truncated_config(llama.config, 2))
    assert small["layers"] == "2" and small["params"] == param_count(truncated_copy(llama, 2))
    with pytest.raises(UserError, match="small_layers=4"):
        truncated_config(llama.config, 4)


@pytest.mark.parametrize("profile", ["smoke", "embedded", "paper"])
def test_sweep_settings_are_valid_decoder_options(profile):
    """Every label a sweep rule passes to common.harness.bench names a registered decoder with options
    it declares, of the right types and ranges (checked as the decoder checks them)."""
    from types import SimpleNamespace

    from bild.config import from_profile
    from bild.workflow import RuleParams
    from common.config import load_profile
    from common.decoders import decoder_class
    from common.decoders.base import as_option

    cfg = from_profile(load_profile(None, profile))
    params = RuleParams(cfg, ".cache/components/x")
    for task in cfg.tasks:
        for variant in cfg.variants:
            wc = SimpleNamespace(btask=task, variant=variant)
            settings = params.settings(wc)
            assert params.decoders(wc).split(",") == ["vanilla", *settings]
            assert len(settings) >= len(cfg.task(task).grid())
            for label, opts in settings.items():
                declared = {k: as_option(v) for k, v in decoder_class(label.split("@")[0]).options().items()}
                for k, v in opts.items():
                    declared[k].validate(label, k, v)
