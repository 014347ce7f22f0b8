"""The reduced-vocabulary draft (common.components.reduced_vocab) on tiny random models: the head's logits
and distribution against the full head's, the fast path, the sidecar a checkpoint carries,
BiLD with a reduced small model (exact at alpha_RB = 0), the token counts, and bad input."""
import json

import pytest
import torch
from torch import nn

from common.decoders import get_decoder
from decoding_checks import teacher_corpus
from common.errors import UserError
from common.engine.fast import PackedLinear, accelerate
from common.components.reduced_head import SIDECAR, ReducedHead, apply_sidecar, reduce_vocab
from common.components.reduced_vocab import _main, coverage, frequent_tokens, label_tokens
from common.training.teacher import teacher_pass

pytestmark = pytest.mark.usefixtures("one_thread")


def copy_of(model):
    from common.decoders.speculative import perturbed_copy
    return perturbed_copy(model, 0.0)


def test_head_keeps_the_full_heads_logits_and_renormalises():
    torch.manual_seed(0)
    head = nn.Linear(8, 20, bias=False)
    keep = torch.tensor([0, 3, 4, 11, 19])
    red = ReducedHead(head, keep)
    x = torch.randn(2, 3, 8)
    full, out = head(x), red(x)
    assert out.shape == (2, 3, 20)
    torch.testing.assert_close(out[..., keep], full[..., keep])
    others = torch.ones(20, dtype=torch.bool)
    others[keep] = False
    assert bool((out[..., others] == torch.finfo(out.dtype).min).all())
    p = out.softmax(-1)
    assert bool((p[..., others] == 0).all()) and not p.isnan().any()
    # over the kept tokens: the full distribution renormalised
    torch.testing.assert_close(p[..., keep], full[..., keep].softmax(-1))
    assert not torch.isnan(out.log_softmax(-1) * p).any()  # no 0 * -inf


def test_reduce_vocab_argmax_and_confidence(chaotic_llama):
    model = copy_of(chaotic_llama)
    ids = torch.tensor([[1, 7, 8, 9, 40, 41]])
    full = model(input_ids=ids).logits[0]
    keep = torch.arange(0, 96, 2)
    reduce_vocab(model, keep)
    out = model(input_ids=ids).logits[0]
    inside = torch.isin(full.argmax(-1), keep)
    assert bool((out.argmax(-1)[inside] == full.argmax(-1)[inside]).all())
    assert bool(torch.isin(out.argmax(-1), keep).all())
    assert bool((out.softmax(-1).max(-1).values >= full.softmax(-1).max(-1).values - 1e-6).all())
    # the input embeddings are untouched (the head holds copies of the kept rows)
    assert torch.equal(model.model.embed_tokens.weight, chaotic_llama.model.embed_tokens.weight)


@pytest.mark.parametrize("keep", [[], [1, 1, 2], [-1, 3], [5, 96]])
def test_reduce_vocab_rejects_bad_ids(tiny, keep):
    with pytest.raises(UserError, match=r"distinct ids in \[0, 96\)"):
        reduce_vocab(copy_of(tiny), torch.tensor(keep, dtype=torch.long))


def test_topk_ranks_the_kept_tokens_as_forward_does():
    """ReducedHead.topk (the proposers' readout: no [..., V] logits) gives the token ids and
    scores of forward's top-k, and with log_softmax the full head's log-probabilities."""
    torch.manual_seed(0)
    head = nn.Linear(8, 20, bias=True)
    keep = torch.tensor([2, 5, 6, 9, 13, 17, 18])
    red = ReducedHead(head, keep)
    x = torch.randn(3, 4, 8)
    with torch.no_grad():
        v, i = red.topk(x, 4)
        ref_v, ref_i = red(x).topk(4, dim=-1)
        lv, li = red.topk(x, 4, log_softmax=True)
        ref_lv, ref_li = torch.log_softmax(red(x).float(), dim=-1).topk(4, dim=-1)
    assert v.shape == i.shape == (3, 4, 4)
    assert torch.equal(i, ref_i) and torch.allclose(v, ref_v)
    assert torch.equal(li, ref_li) and torch.allclose(lv, ref_lv, atol=1e-6)
    assert set(i.flatten().tolist()) <= set(keep.tolist())


def test_fast_path_packs_the_reduced_head(chaotic_llama):
    model = reduce_vocab(copy_of(chaotic_llama), torch.arange(10, 90))
    ids = torch.tensor([[1, 5, 9, 33]])
    ref = model(input_ids=ids).logits
    accelerate(model)
    if torch.backends.mkldnn.is_available():
        assert isinstance(model.lm_head.proj, PackedLinear)
    torch.testing.assert_close(model(input_ids=ids).logits, ref, atol=1e-5, rtol=1e-5)


def test_sidecar_applies_on_load(tiny, tmp_path):
    from transformers import AutoModelForCausalLM
    tiny.save_pretrained(tmp_path)
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not apply_sidecar(fresh, tmp_path) and type(fresh.lm_head) is nn.Linear
    (tmp_path / SIDECAR).write_text(json.dumps({"keep": [2, 5, 7]}))
    assert apply_sidecar(fresh, tmp_path) and isinstance(fresh.lm_head, ReducedHead)
    assert fresh.lm_head.keep.tolist() == [2, 5, 7]
    (tmp_path / SIDECAR).write_text(json.dumps({"kept": [2]}))
    with pytest.raises(UserError, match="not a reduced-vocabulary file"):
        apply_sidecar(AutoModelForCausalLM.from_pretrained(tmp_path), tmp_path)


def test_load_model_applies_the_sidecar(embedded, tiny, tmp_path):
    """Through common.assets.models.load_model (what the decoders' small=<folder> use), fast path on."""
    from common.assets.models import load_model
    tiny.save_pretrained(tmp_path)
    embedded[1].save_pretrained(tmp_path)  # load_model reads a tokenizer; the tiny model has none
    (tmp_path / SIDECAR).write_text(json.dumps({"keep": list(range(0, 96, 3))}))
    model, _ = load_model(str(tmp_path), fast=True)
    assert isinstance(model.lm_head, ReducedHead) and model.lm_head.keep.numel() == 32
    out = model(input_ids=torch.tensor([[1, 4, 6]])).logits[0, -1]
    assert int(out.argmax()) % 3 == 0


def test_bild_with_a_reduced_small_model(llama_pair):
    """Any small model keeps BiLD exact at alpha_RB = 0; keeping every token changes nothing."""
    large, small = llama_pair
    ids = torch.tensor([[1, 7, 8, 9]])
    greedy = get_decoder("vanilla", large).generate(ids, 24).tokens
    reduced = reduce_vocab(copy_of(small), torch.arange(0, 96, 2))
    assert get_decoder("bild", large, small=reduced, rollback_threshold=0.0).generate(ids, 24).tokens == greedy
    every = reduce_vocab(copy_of(small), torch.arange(96))
    a = get_decoder("bild", large, small=every, fallback_threshold=0.3, rollback_threshold=2.0).generate(ids, 24)
    b = get_decoder("bild", large, small=small, fallback_threshold=0.3, rollback_threshold=2.0).generate(ids, 24)
    assert a.tokens == b.tokens and a.stats["source"] == b.stats["source"]


def test_frequent_tokens_counts_ties_and_forced_ids():
    ids = torch.tensor([5, 5, 5, 3, 3, 9, 9, 1])
    assert frequent_tokens(ids, 2, 10).tolist() == [3, 5]
    assert frequent_tokens(ids, 3, 10).tolist() == [3, 5, 9]          # 3 and 9 tie: the smaller id first
    assert frequent_tokens(ids, 2, 10, always=(0,)).tolist() == [0, 5]
    assert coverage(ids, torch.tensor([5, 3])) == pytest.approx(5 / 8)
    with pytest.raises(UserError, match="keep"):
        frequent_tokens(ids, 0, 10)


def test_cli_writes_a_reduced_checkpoint(tiny, tmp_path):
    train = teacher_pass(tiny, teacher_corpus(tiny, 4, 0, 12), 8, 4)
    held = teacher_pass(tiny, teacher_corpus(tiny, 2, 50, 12), 8, 4)
    cache = tmp_path / "teacher.pt"
    torch.save({"key": {"test": 1}, "train": vars(train), "heldout": vars(held)}, cache)
    src = tmp_path / "small"
    tiny.save_pretrained(src)
    out, stats = tmp_path / "reduced" / "model", tmp_path / "stats.json"
    args = ["--model", str(src), "--teacher", str(cache), "--labels", "greedy", "--out", str(out),
            "--stats-out", str(stats)]
    _main(args + ["--keep", "6"])
    keep = json.loads((out / SIDECAR).read_text())["keep"]
    labels = label_tokens(train, "greedy")
    assert keep == frequent_tokens(labels, 6, 96, (tiny.config.eos_token_id,)).tolist()
    s = json.loads(stats.read_text())
    assert s["keep"] == 6 and s["train_coverage"] == round(coverage(labels, torch.tensor(keep)), 4)
    assert (out / "config.json").is_file() and not out.with_name("model.partial").exists()
    for bad, msg in ((["--keep", "0"], "--keep"), (["--keep", "96"], "--keep")):
        with pytest.raises(UserError, match=msg):
            _main(args + bad)
    with pytest.raises(UserError, match="no checkpoint"):
        _main(["--model", str(tmp_path / "none"), *args[2:], "--keep", "6"])


def test_profiles_and_rule_params():
    from bild.config import from_profile
    from bild.workflow import RuleParams, label
    from common.config import load_profile
    from common.workflow.artifacts import artifact_inputs

    p = load_profile(None, "embedded")
    cfg = from_profile(p)
    import dataclasses
    rv = cfg.reduced_vocab
    assert rv.compact_layers == 2  # the embedded profile sweeps the 2-layer small model too
    # without the compact model: the aligned model with the full head and with the cut head
    r = RuleParams(dataclasses.replace(cfg, reduced_vocab=dataclasses.replace(rv, compact_layers=None)),
                   f".cache/components/{p.name}", p.model)
    s = r.reduced_settings()
    grid = cfg.task(rv.task).grid()
    assert len(s) == 2 * len(grid) and r.reduced_decoders().split(",")[0] == "vanilla"
    f, b = grid[0]
    assert s[label(f, b)]["small"] == r.reduced_source() == f".cache/components/{p.name}/bild_small_{rv.variant}/model"
    assert s[label(f, b) + f"_v{rv.keep}"]["small"] == r.reduced_dir()
    assert r.reduced_labels() == RuleParams.LABELS[rv.variant]
    cr = RuleParams(cfg, f".cache/components/{p.name}", p.model)  # the profile's: with the compact model
    cs = cr.reduced_settings()
    assert len(cs) == 3 * len(grid) and cr.compact_suffix() == f"_l2v{rv.keep}"
    assert cs[label(f, b) + cr.compact_suffix()]["small"] == cr.compact_dir() != r.reduced_dir()
    assert any(x.endswith("reduced_vocab_sweep.jsonl") for x in artifact_inputs(p, "bild.table1"))
    paper = load_profile(None, "paper")       # the paper's checkpoints: no reduced rows, no inputs
    assert from_profile(paper).reduced_vocab is None
    assert not any("reduced" in x for x in artifact_inputs(paper, "bild.table1"))


def test_bad_reduced_config():
    from bild.config import from_mapping

    def raw(**rv):
        return {"model": "m", "small_layers": 2, "variants": ["aligned"], "max_prompt_tokens": 8,
                "tasks": {"t": {"dataset": "d", "n": 1, "max_new_tokens": 4, "metric": "bleu", "fallback": [0.5],
                                "rollback": [1.0]}},
                "reduced_vocab": {"variant": "aligned", "keep": 8, "task": "t", **rv}}
    assert from_mapping(raw()).reduced_vocab.keep == 8
    with pytest.raises(UserError, match="names task 'nope'"):
        from_mapping(raw(task="nope"))
    with pytest.raises(UserError, match="variant 'unaligned'"):
        from_mapping(raw(variant="unaligned"))      # a variant the profile does not train
    with pytest.raises(UserError, match="keep"):
        from_mapping(raw(keep=0))
    assert from_mapping(raw(compact_layers=2)).reduced_vocab.compact_layers == 2
    with pytest.raises(UserError, match="compact_layers"):
        from_mapping(raw(compact_layers=0))
    with pytest.raises(UserError, match="needs the embedded small models"):
        from_mapping({**raw(), "small_layers": None,
                      "tasks": {"t": {**raw()["tasks"]["t"], "large": "L", "small": {"aligned": "S"}}}})


def test_split_reduced_sweep():
    from bild.analysis import split_reduced

    recs = [{"decoder": d, "question_id": "a"} for d in
            ("vanilla", "bild@fb0.5_rb2", "bild@fb0.5_rb2_v64", "bild@fb0.5_norb", "bild@fb0.5_rb2_v32")]
    parts = split_reduced(recs, 64)
    assert [r["decoder"] for r in parts["full"]] == ["vanilla", "bild@fb0.5_rb2"]
    assert [r["decoder"] for r in parts["reduced"]] == ["vanilla", "bild@fb0.5_rb2"]
    assert "compact" not in parts and "compact" not in split_reduced(recs, 64, compact="_l2v64")  # none recorded
    parts = split_reduced(recs + [{"decoder": "bild@fb0.5_rb2_l2v64", "question_id": "a"}], 64, compact="_l2v64")
    assert [r["decoder"] for r in parts["compact"]] == ["vanilla", "bild@fb0.5_rb2"]
    assert [r["decoder"] for r in parts["reduced"]] == ["vanilla", "bild@fb0.5_rb2"]
