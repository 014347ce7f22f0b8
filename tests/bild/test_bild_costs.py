"""BiLD's Figures 8 and 10: the analytic FLOP/MOP counts by hand, the forwards the decoders log
(vanilla's count formula against its real forwards; BiLD's log against its own step stats),
and the example text cut and marked by model."""
import pytest
import torch

from bild.examples import marked, pick, plain, segments
from bild.flops import Shape, calls_cost, forward_cost, normalized, run_cost, vanilla_calls
from common.decoders import get_decoder
from common.decoders.speculative import perturbed_copy
from common.assets.models import tiny_llama, tiny_t5

pytestmark = pytest.mark.usefixtures("one_thread")


def test_forward_cost_by_hand():
    s = Shape(params=1000, layers=2, d_attn=8, d_kv=4)
    # FLOPs 2*1000*3 + 4*2*8*3*(5+3) = 6000 + 1536; MOPs 1000 + 2*2*4*8 + 2*2*4*3 = 1000 + 128 + 48
    assert forward_cost(s, 5, 3) == (7536.0, 1176.0)
    assert calls_cost(s, [[5, 3], [0, 1]]) == (7536.0 + 2000 + 64, 1176.0 + 1000 + 16 + 16)
    # one forward of 4 positions: the same FLOPs as 4 single-position forwards bar attention,
    # but the weights are read once instead of 4 times (the paper's point)
    # (the block's attention counts all 4 x 14 scores; one at a time, 11 + 12 + 13 + 14)
    assert forward_cost(s, 10, 4) == (8000 + 64 * 4 * 14, 1000 + 16 * 14 + 16 * 4)
    assert calls_cost(s, [[10 + i, 1] for i in range(4)]) == (8000 + 64 * 50, 4000 + 16 * 50 + 16 * 4)


def test_shape_from_model_rows():
    llama = Shape.from_row({"layers": "30", "params": 10, "d_model": 576, "heads": 9, "kv_heads": 3})
    assert (llama.layers, llama.d_attn, llama.d_kv) == (30, 576, 192)
    mt5 = Shape.from_row({"layers": "8 + 8", "params": 10, "d_model": 512, "heads": 6, "kv_heads": 6, "head_dim": 64})
    assert (mt5.layers, mt5.d_attn, mt5.d_kv) == (8, 384, 384)


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_vanilla_calls_are_the_forwards_vanilla_makes(chaotic_llama, kind):
    model, ids = (chaotic_llama, torch.tensor([[1, 5, 6, 7, 5, 6]])) if kind == "llama" else \
        (tiny_t5(seed=0), torch.tensor([[5, 6, 7, 8]]))
    d = get_decoder("vanilla", model)
    d.target.calls = []
    out = d.generate(ids, 12)
    assert d.target.calls == vanilla_calls(ids.shape[1] if kind == "llama" else 1, len(out.tokens))


class WordTokenizer:
    """Token t decodes to " w<t>"; 7 followed by 8 is "é", 7 alone an incomplete character."""
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        out = ""
        for i, t in enumerate(ids):
            if t == 7:
                out += "é" if i + 1 < len(ids) and ids[i + 1] == 8 else "\ufffd"
            elif t != 8 and not (skip_special_tokens and t == 2):
                out += f" w{t}"
        return out


def test_bild_logs_its_forwards_and_marks_its_text(llama_pair):
    large, small = llama_pair
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    # the random pair's p_L(y_small) is near 1/V: at -log p ~ 4.6 some small tokens stay, some roll back
    d = get_decoder("bild", large, WordTokenizer(), small=small, rollback_threshold=4.6, fallback_threshold=0.0,
                    max_small_tokens=4)
    out = d.generate(ids, 30)
    st = out.stats
    lc, sc = st["large_calls"], st["small_calls"]
    assert len(lc) == st["large_forwards"] and len(sc) == st["small_forwards"] and sc
    assert lc[0] == [0, ids.shape[1]]
    for k in range(1, len(lc)):  # step k verifies its proposals and the root; keeps what it accepted
        assert lc[k][1] == st["proposed"][k] + 1
        if k + 1 < len(lc):
            assert lc[k + 1][0] == lc[k][0] + st["accepted"][k] + 1
    assert all(c + q <= ids.shape[1] + len(out.tokens) for c, q in sc)
    assert "small" in st["source"] and "large" in st["source"] and st["rollbacks"] > 0
    segs = st["segments"]
    assert "".join(t for _, t in segs) == WordTokenizer().decode(out.tokens)
    assert all(a[0] != b[0] for a, b in zip(segs, segs[1:])) and {s for s, _ in segs} == {"small", "large"}
    # counted: BiLD's forwards against vanilla's on the same prompt
    van = {"question_id": "q", "decoder": "vanilla", "prompt_tokens": 5, "new_tokens": len(out.tokens)}
    mine = {"question_id": "q", "decoder": "bild@x", "extra": st}
    s = Shape(1000, 2, 8, 4)
    r = normalized([van, mine], "bild@x", s, Shape(100, 1, 8, 4))
    assert r["flops"] == pytest.approx(run_cost([mine], s, Shape(100, 1, 8, 4))["flops"] / run_cost([van], s, None)["flops"])
    assert r["intensity"] == pytest.approx(r["flops"] / r["mops"])
    assert len(lc) < len(out.tokens) and r["mops"] < 1  # fewer large forwards: fewer weight reads


def test_lossless_limit_unchanged_by_logging(llama_pair):
    ids = torch.tensor([[1, 77, 3, 3, 3, 12, 60, 61]])
    ref = get_decoder("vanilla", llama_pair[0]).generate(ids, 25).tokens
    out = get_decoder("bild", llama_pair[0], small=llama_pair[1], rollback_threshold=0.0).generate(ids, 25)
    assert out.tokens == ref and "segments" not in out.stats  # no tokenizer: no text to cut


def test_segments_join_to_the_text_across_a_split_character():
    tok = WordTokenizer()
    tokens, source = [3, 7, 8, 4, 5, 2], ["large", "small", "large", "large", "small", "small"]
    # the small run (token 7) is half of "é", completed by the large token 8: it adds no text of its
    # own, and the large runs around it merge; the final EOS adds nothing
    assert segments(tok, tokens, source) == [["large", " w3é w4"], ["small", " w5"]]
    assert segments(tok, [3, 4], ["small", "large"]) == [["small", " w3"], ["large", " w4"]]
    with pytest.raises(ValueError):
        segments(tok, [1, 2], ["large"])


def test_marked_markdown():
    segs = [["small", "The cat"], ["large", " sat "], ["small", "on | the"], ["large", "*mat*"]]
    assert marked(segs) == "The cat **sat** on \\| the**\\*mat\\***"
    assert marked([["large", "  "], ["small", "a\nb"]]) == "  a b"
    assert plain("x|y\nz") == "x\\|y z"


def test_pick_prefers_prompts_where_the_small_model_differs():
    assert pick(["a", "b", "c", "d"], ["x", "y", "z", "w"], ["x", "Y", "z", "W"], 3) == ["b", "d", "a"]
    assert pick(["a"], ["x"], ["x"], 3) == ["a"]


def test_shape_counts_from_a_real_model():
    """Shape.from_row on bild.model_configs' record of a tiny model: parameters and widths as built."""
    from bild.model_configs import describe
    from common.assets.models import param_count

    m = tiny_llama()
    s = Shape.from_row(describe(m.config))
    assert (s.params, s.layers, s.d_attn, s.d_kv) == (param_count(m), 4, 64, 32)
    t5 = perturbed_copy(tiny_t5(), 0.0)
    s = Shape.from_row(describe(t5.config))
    assert (s.layers, s.d_attn, s.d_kv) == (2, 32, 32)


def test_example_table_by_hand():
    from bild.examples import example_table

    def rec(q, dec, text, **extra):
        return {"question_id": q, "decoder": dec, "text": text, "reference": "ref " + q, "extra": extra}

    sweep = [rec("a", "vanilla", "the cat"), rec("b", "vanilla", "a dog|x"),
             rec("a", "bild@s", "the cat", source=["large", "small"], segments=[["large", "the"], ["small", " cat"]]),
             rec("b", "bild@s", "a dog|x", source=["small", "large", "large"],
                 segments=[["small", "a"], ["large", " dog|x"]])]
    oracle = [{"question_id": "a", "setting": "small", "text": "the cat"},
              {"question_id": "b", "setting": "small", "text": "a cow"},
              {"question_id": "b", "setting": "large", "text": "a dog|x"}]
    t = example_table(sweep, oracle, "bild@s", 1)
    assert t.to_dict("records") == [{"question_id": "b", "reference": "ref b", "large": "a dog\\|x", "small": "a cow",
                                     "bild": "a **dog\\|x**", "large_share": pytest.approx(2 / 3)}]
    assert list(example_table(sweep, oracle, "bild@s", 5).question_id) == ["b", "a"]
    with pytest.raises(ValueError, match="no extra.segments"):
        example_table([*sweep[:2], rec("a", "bild@s", "x")], oracle, "bild@s", 2)


def test_chosen_setting_and_oracle_match():
    import pandas as pd

    from bild.analysis import chosen_setting, oracle_match
    from bild.flops import model_shapes

    pts = pd.DataFrame({"decoder": ["vanilla", "bild@fb0.5_rb2", "bild@fb0.2_rb6", "bild@fb0.5_norb"],
                        "quality": [30.0, 30.5, 29.5, 40.0], "speedup": [1.0, 1.3, 1.8, 3.0]})
    assert chosen_setting(pts) == ("no_loss", {"decoder": "bild@fb0.5_rb2", "quality": 30.5, "speedup": 1.3,
                                               "agree_tokens": None})
    # the choice stays the paper's (reference metric); the agreement with the large model's output rides along
    agree = pts.assign(agree_tokens=[1.0, 0.9, 1.0, 1.0])
    assert chosen_setting(agree)[1] == {"decoder": "bild@fb0.5_rb2", "quality": 30.5, "speedup": 1.3, "agree_tokens": 0.9}
    from bild.tables import chosen_changes_output
    note = chosen_changes_output({("summarize", "aligned"): (chosen_setting(agree), 30.0)})
    assert "summarize/aligned bild@fb0.5_rb2 (agree_tokens 0.900)" in note
    assert chosen_changes_output({("summarize", "aligned"): (chosen_setting(agree.assign(agree_tokens=1.0)), 30.0)}) is None
    assert chosen_setting(pts.assign(quality=[30.0, 29.0, 29.5, 40.0]))[1]["decoder"] == "bild@fb0.2_rb6"
    # none within a point: the grid's best quality (ablations never count)
    assert chosen_setting(pts.assign(quality=[30.0, 20.0, 21.0, 40.0])) == \
        ("closest", {"decoder": "bild@fb0.2_rb6", "quality": 21.0, "speedup": 1.8, "agree_tokens": None})
    assert chosen_setting(pts[pts.decoder.isin(["vanilla", "bild@fb0.5_norb"])]) is None
    o = pd.DataFrame({"setting": ["small", "oracle", "oracle", "large"], "quality": [10.0, 19.0, 21.0, 20.0],
                      "engaged": [0.0, 0.1, 0.25, 1.0]})
    assert oracle_match(o) == 0.25 and oracle_match(o.assign(quality=[1.0, 2.0, 3.0, 20.0])) is None
    rows = [{"task": "t", "role": "large", "kind": "decoder-only", "layers": "4", "params": 100, "d_model": 64, "heads": 4,
             "kv_heads": 2},
            {"task": "t", "role": "small", "kind": "decoder-only", "layers": "1", "params": 10, "d_model": 64, "heads": 4,
             "kv_heads": 2}]
    large, small, s2s = model_shapes(rows, "t", "aligned")
    assert (large.layers, small.layers, small.d_kv, s2s) == (4, 1, 32, False)
    with pytest.raises(ValueError, match="lack the large or small"):
        model_shapes(rows[:1], "t", "aligned")
