"""EAGLE-3 on tiny random models: the training-time test's mask is the decode-time attention
pattern, the loss falls, a resumed training equals an uninterrupted one, the decoder is exact and
accepts drafts, the target keeps the fused layers' inputs, and bad input is one UserError."""
import json

import numpy as np
import pytest
import torch

from common.checkpoints import save_trained
from common.components import eagle3_head as e3
from common.config import TrainConfig
from common.decoders import get_decoder
from common.decoders.eagle3 import Eagle3, Eagle3Proposer
from common.engine.forward import layer_states
from common.engine.target import CausalTarget
from common.errors import UserError
from common.assets.models import tiny_llama
from common.training.loop import Stopping
from decoding_checks import assert_training_learns, frozen, greedy_sequences, tiny_corpus

LAYERS = (1, 2, 3)


@pytest.fixture(scope="module")
def model():
    """A tiny LLaMA whose next-token distributions are peaked, as a trained model's are (at init its
    tied LM head gives nearly uniform ones, which no token-level loss could fit below their entropy)."""
    m = tiny_llama(seed=1, scale=10.0)
    with torch.no_grad():
        m.model.norm.weight.mul_(30.0)
    return m


def _head(model, seed=0, keep=None):
    """A random head whose drafts vary with the context."""
    torch.manual_seed(seed)
    keep = torch.arange(3, 60) if keep is None else keep
    head = e3.Eagle3Head(model, LAYERS, keep)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape) * 0.3)
    return head.eval()


def test_unrolled_steps_equal_the_decoders_step_by_step_drafts(model, one_thread):
    """Step ``j`` of the training-time test at row ``i`` equals what the decoder's proposer computes
    for depth ``j`` of a chain rooted at ``i`` (catch-up on the context, then one node per depth
    reading its parent's state, through EAGLE's tree masks), for every root and depth."""
    head, steps = _head(model), 4
    ids = torch.tensor([[1, 17, 5, 40, 41, 9, 33, 7, 12, 60, 61, 8]])
    with torch.no_grad():
        states, _, _ = e3.teacher_outputs(model, ids, LAYERS, head.keep)
        outs = [head.logits(h)[0] for h in e3.unroll(head, model, states, ids, steps)]   # [q, K] each
        fused = head.fuse(states[0])
        t = ids.shape[1]
        for i in range(t - steps - 1):
            prop = Eagle3Proposer(head, model, None, "dynamic")
            out = prop._draft(fused[:i + 1], ids[0, 1:i + 2], torch.arange(i + 1))       # the catch-up
            prop.length = i + 1
            feat, path, slots, anc = out[-1], (), {}, {(): []}
            torch.testing.assert_close(head.logits(feat), outs[0][i], rtol=1e-4, atol=1e-4)
            for d in range(1, steps):
                path = path + (0,)
                feat = prop._expand([(path, int(ids[0, i + d + 1]))], feat[None], slots, anc, i)[0]
                torch.testing.assert_close(head.logits(feat), outs[d][i], rtol=1e-4, atol=1e-4)
    # (with step j's rows also seeing the other rows' earlier steps, a causal block where the
    # diagonal is, step 1's logits differ by up to ~20 here: the test fails)


def test_the_loss_falls_on_a_tiny_overfit_set(model, one_thread):
    head = e3.Eagle3Head(model, LAYERS, torch.arange(3, 96))
    seqs = greedy_sequences(model, n=3, answer=16)
    ids = torch.nn.utils.rnn.pad_sequence([s for s, _ in seqs], batch_first=True)
    lengths = torch.tensor([len(s) for s, _ in seqs])
    starts = torch.tensor([st for _, st in seqs])
    assert_training_learns(model, head, lambda: e3.ttt_loss(head, model, ids, lengths, starts, 3, 0.8)[0],
                           steps=40, lr=3e-3)


def _train(model, data, out, **kw):
    cfg = TrainConfig(lr=3e-3, epochs=30, batch_size=4, max_steps=24, checkpoint_every=5)
    with frozen(model):
        return e3.train_head(model, data, out, cfg, Stopping(eval_every=8, patience=10), LAYERS, steps=3,
                             vocab_size=30, max_len=64, **kw)


def _train_prompt(data, i: int) -> list[int]:
    """The prompt of training sequence ``i`` of the first shard."""
    s = data["train"].shards[0]
    a = int(s.offsets[i])
    return s.tokens[a:a + int(s.starts[i])].tolist()


@pytest.fixture(scope="module")
def trained(model, tmp_path_factory):
    """``(corpus data, folder of a head trained on it, its stats)``."""
    tmp = tmp_path_factory.mktemp("eagle3")
    data = e3.load_corpus(tiny_corpus(tmp / "corpus", model, max_shards=2, answer_tokens=12, batch_size=4), model)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stats = _train(model, data, tmp / "a")
    finally:
        torch.set_num_threads(prev)
    return data, tmp / "a", stats


def test_training_learns_resumes_exactly_and_decodes_exactly(model, trained, tmp_path, monkeypatch, one_thread):
    data, folder, stats = trained
    curve = [json.loads(l) for l in (folder / "curve.jsonl").read_text().splitlines()]
    assert len(curve[0]["heldout_top1"]) == 3 and curve[-1]["heldout_loss"] < curve[0]["heldout_loss"]
    assert stats["fused_layers"] == list(LAYERS) and stats["draft_vocab"] == 30 and len(stats["depth_acc_top1"]) == 3
    assert all(c > 0 for c in curve[0]["heldout_positions"])

    # interrupted in its 12th step (after the step-10 checkpoint), then resumed: the same weights
    real, calls = e3.ttt_loss, {"n": 0}

    def interrupting(*a, **k):
        if torch.is_grad_enabled():  # a training step (evaluations run under inference_mode)
            calls["n"] += 1
            if calls["n"] == 12:
                raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(e3, "ttt_loss", interrupting)
    with pytest.raises(KeyboardInterrupt):
        _train(model, data, tmp_path / "b")
    monkeypatch.setattr(e3, "ttt_loss", real)
    _train(model, data, tmp_path / "b")
    a, b = (torch.load(f / "head.pt", weights_only=False)["module"] for f in (folder, tmp_path / "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    van = get_decoder("vanilla", model)
    van.eos = set()
    accepted = 0
    for opts in ({"mode": "static", "tree": 8}, {"mode": "dynamic", "depth": 3, "topk": 2, "total": 6}):
        dec = Eagle3(model, head=str(folder), **opts)
        dec.eos = set()
        for prompt in ([1, 5, 9, 33, 7], _train_prompt(data, 1)):
            ids = torch.tensor([prompt])
            out = dec.generate(ids, 30)
            assert out.tokens == van.generate(ids, 30).tokens, opts
            accepted += sum(out.stats["accepted"])
    assert accepted > 0  # a trained head's drafts are taken: the fused features reach the proposer


def test_bf16_training_learns_its_steps_in_bf16_and_evaluates_in_fp32(model, trained, tmp_path, monkeypatch,
                                                                       one_thread):
    """``precision=bfloat16``: the training steps' frozen pass is a bf16 copy and the head runs under
    bf16 autocast; the held-out evaluation stays fp32 (as decoding runs); the weights stay fp32, the
    head still learns, and its checkpoint is not resumed by an fp32 training."""
    data = trained[0]
    real, seen = e3.teacher_outputs, []

    def spying(m, *a, **k):
        states = real(m, *a, **k)
        seen.append((torch.is_grad_enabled(), next(m.parameters()).dtype, states[0].dtype))
        return states
    monkeypatch.setattr(e3, "teacher_outputs", spying)
    stats = _train(model, data, tmp_path / "bf", precision="bfloat16")
    steps = [(dt, st) for grad, dt, st in seen if grad]
    evals = [(dt, st) for grad, dt, st in seen if not grad]
    assert len(steps) == 24 and set(steps) == {(torch.bfloat16, torch.bfloat16)}
    assert evals and set(evals) == {(torch.float32, torch.float32)}
    assert next(model.parameters()).dtype == torch.float32  # the copy is the bf16 one, not the model
    assert stats["precision"] == "bfloat16" and trained[2]["precision"] == "float32"
    state = torch.load(tmp_path / "bf" / "head.pt", weights_only=False)
    assert all(v.dtype == torch.float32 for k, v in state["module"].items() if k != "keep")
    curve = [json.loads(l) for l in (tmp_path / "bf" / "curve.jsonl").read_text().splitlines()]
    assert curve[-1]["heldout_loss"] < curve[0]["heldout_loss"]
    with pytest.raises(UserError):  # another training's checkpoint: refused, not resumed
        _train(model, data, tmp_path / "bf", precision="float32")
    with pytest.raises(UserError, match="precision 'fp16' is invalid; valid: float32, bfloat16"):
        e3.check_precision("fp16")


def test_the_target_keeps_the_fused_layers_inputs(model):
    prompt = torch.tensor([[1, 5, 6, 7, 8, 9]])
    plain, capturing = CausalTarget(model), CausalTarget(model)
    logits, _ = plain.start(prompt)
    logits_c, _ = capturing.start(prompt, capture=(0, 2))
    assert torch.equal(logits, logits_c)  # keeping states changes nothing the target computes
    ref = layer_states(model, prompt, [0, 2])
    for layer in (0, 2):
        torch.testing.assert_close(capturing.captured[layer], ref[layer][0])
    capturing.start(prompt)  # the next sequence keeps nothing unless asked again
    assert capturing.capture == () and capturing.captured == {}
    with pytest.raises(UserError, match="outside the model"):
        CausalTarget(model).start(prompt, capture=(4,))


class _Vocab:
    """The least tokenizer_identity reads of a tokenizer."""

    def __init__(self, words):
        self.words = words

    def get_vocab(self):
        return {w: i for i, w in enumerate(self.words)}


def test_bad_input(model, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="index 4 is outside the model"):
        e3.check_layers_of((1, 4), model)
    with pytest.raises(UserError, match="each once"):
        e3.check_layers_of((1, 1), model)
    assert e3.default_layers(30) == (2, 15, 27)

    # a head for another model (same shape, other weights), or another tokenizer
    head = _head(model)
    meta = {**e3.head_meta(model), "fused_layers": list(LAYERS), "tokenizer_id": "abc"}
    save_trained(head, tmp_path / "h" / e3.CHECKPOINT, meta)
    with pytest.raises(UserError, match="trained for"):
        Eagle3(tiny_llama(seed=5, scale=10.0), head=str(tmp_path / "h"))
    with pytest.raises(UserError, match="another tokenizer"):
        Eagle3(model, _Vocab(["a", "b"]), head=str(tmp_path / "h"))
    with pytest.raises(UserError, match="exceeds the head's 57-token draft vocabulary"):
        Eagle3(model, head=str(tmp_path / "h"), topk=64)
    save_trained(head, tmp_path / "far" / e3.CHECKPOINT, {**meta, "fused_layers": [1, 9, 3]})
    with pytest.raises(UserError, match="outside the model"):
        Eagle3(model, head=str(tmp_path / "far"))

    # the trainer's command line: a fused layer outside the model is refused before any data is read
    import common.training.cli as cli
    monkeypatch.setattr(cli, "load_model", lambda name, **kw: (model, None))
    with pytest.raises(UserError, match="index 7 is outside the model"):
        e3._main(["--model", "tiny", "--corpus-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                  "--layers", "1,7"])
    with pytest.raises(UserError, match="comma-separated"):
        e3._main(["--model", "tiny", "--corpus-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                  "--layers", "a,b"])
    with pytest.raises(UserError, match="draft-vocab=8192 is out of range"):  # the tiny model has 96 tokens
        e3._main(["--model", "tiny", "--corpus-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    with pytest.raises(UserError, match="holds no corpus"):
        e3._main(["--model", "tiny", "--corpus-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                  "--draft-vocab", "20"])


def test_the_command_line_trains_on_the_corpus_with_the_rules_flags(model, tmp_path, monkeypatch, one_thread):
    """The smoke profile's recipe, turned into flags as rule train_eagle3 turns it (commands.eagle3_flags),
    trains the head through the command line and writes its records."""
    import shlex

    import common.training.cli as cli
    from common.config import load_profile
    from common.workflow.commands import eagle3_flags

    recipe = {**load_profile(None, "smoke").raw["components"]["eagle3"], "layers": [1, 2, 3], "precision": "bfloat16"}
    cdir = tiny_corpus(tmp_path / "corpus", model, max_shards=1, answer_tokens=12, batch_size=4)
    monkeypatch.setattr(cli, "load_model", lambda name, **kw: (model, None))
    with frozen(model):
        e3._main(["--model", "tiny", "--corpus-dir", str(cdir), "--out", str(tmp_path / "head"),
                  *shlex.split(eagle3_flags(recipe)), "--curve-out", str(tmp_path / "curve.jsonl"),
                  "--stats-out", str(tmp_path / "stats.json")])
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["component"] == "eagle3_head" and stats["fused_layers"] == [1, 2, 3]
    assert stats["steps"] == recipe["max_steps"] and stats["ttt_steps"] == recipe["ttt_steps"]
    assert stats["draft_vocab"] == recipe["draft_vocab"] and stats["max_len"] == recipe["max_len"]
    assert stats["precision"] == "bfloat16"
    assert stats["weights_path"] == str(tmp_path / "head") and (tmp_path / "head" / "tree_8.json").is_file()
    curve = [json.loads(l) for l in (tmp_path / "curve.jsonl").read_text().splitlines()]
    every = recipe["eval_every"]
    assert [r["step"] for r in curve] == list(range(0, recipe["max_steps"] + 1, every))
    assert all(len(r["heldout_top1"]) == recipe["ttt_steps"] for r in curve)


def test_the_draft_vocabulary_is_the_most_frequent_answer_tokens_or_all_of_them(model, tmp_path):
    data = e3.load_corpus(tiny_corpus(tmp_path / "corpus", model, max_shards=1, answer_tokens=12, batch_size=4), model)
    answers = torch.from_numpy(np.concatenate(list(data["train"].answers())).astype(np.int64))
    counts = torch.bincount(answers, minlength=model.config.vocab_size)
    distinct = int((counts > 0).sum())
    keep = e3.draft_vocab(data["train"], 10, model.config.vocab_size)
    assert keep.tolist() == sorted(keep.tolist()) and keep.numel() == 10
    # every kept token occurs at least as often as every token left out
    left = torch.ones_like(counts, dtype=torch.bool)
    left[keep] = False
    assert int(counts[keep].min()) >= int(counts[left].max())
    # asked for more than the corpus says: all it says (the code's most_common(N))
    every = e3.draft_vocab(data["train"], model.config.vocab_size, model.config.vocab_size)
    assert every.tolist() == torch.nonzero(counts).flatten().tolist() and every.numel() == distinct
    # fewer distinct tokens than a static tree's ranks: one UserError
    few = e3.CorpusData([_only_tokens(data["train"].shards[0], e3.RANKS - 1)])
    with pytest.raises(UserError, match="distinct tokens"):
        e3.draft_vocab(few, 100, model.config.vocab_size)


def _only_tokens(shard, n: int):
    """``shard`` with its tokens folded onto the ids ``0..n-1``."""
    import dataclasses
    return dataclasses.replace(shard, tokens=shard.tokens % n)


def test_the_proposer_catches_up_on_the_fused_layers_of_the_committed_sequence(model, trained, one_thread):
    """Before each step the loop hands the proposer, for the positions the last target forward
    committed (the prompt after the prefill, the accepted path after a step), the fused layers'
    inputs a full forward over the committed sequence gives there."""
    dec = Eagle3(model, head=str(trained[1]), mode="dynamic", depth=3, topk=3, total=8)
    dec.eos = set()
    seen = []

    def recording(ids, make=dec.make_proposer):
        prop = make(ids)
        inner = prop.propose

        def propose(state):
            out = inner(state)
            seen.append((state.ids.shape[1], torch.cat([state.captured[l] for l in LAYERS], -1).clone()))
            return out
        prop.propose = propose
        return prop
    dec.make_proposer = recording
    prompt = torch.tensor([_train_prompt(trained[0], 0)])  # the head has learnt its answer: drafts are taken
    tokens = dec.generate(prompt, 24).tokens
    full = torch.cat([prompt, torch.tensor([tokens])], dim=1)
    assert len(seen) > 1 and any(p.shape[0] > 1 for _, p in seen[1:])  # some step accepted a draft
    for length, pending in seen:
        # the root (position length - 1) is not processed yet: the states end at length - 2
        ref = layer_states(model, full[:, :length - 1], LAYERS)
        want = torch.cat([ref[l][0, -pending.shape[0]:] for l in LAYERS], dim=-1)
        torch.testing.assert_close(pending, want, rtol=1e-4, atol=1e-4)
