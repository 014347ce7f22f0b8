"""EAGLE's draft head and decoder (common.decoders.eagle) on tiny random LLaMAs: the head's
cached drafting equals its uncached forward, both tree modes decode exactly vanilla's tokens,
dynamic trees keep the best paths, and bad heads/trees are one error."""
import json

import pytest
import torch

from common.checkpoints import save_trained
from common.decoders import get_decoder
from common.decoders.eagle import Eagle, EagleProposer
from common.components.eagle_head import CHECKPOINT, EagleHead, head_meta
from common.decoders.tree_loop import ProposerState
from common.errors import UserError
from common.engine.forward import embed
from common.assets.models import tiny_llama
from decoding_checks import tiny_corpus


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=1, scale=10.0)


@pytest.fixture(scope="module")
def head_dir(model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle")
    torch.manual_seed(0)
    head = EagleHead(model)
    with torch.no_grad():
        for p in head.parameters():  # a head whose proposals vary with the context
            p.add_(torch.randn(p.shape) * 0.3)
    save_trained(head, folder / CHECKPOINT, head_meta(model))
    return folder


def test_cached_chunks_equal_one_forward(model):
    torch.manual_seed(0)
    head = EagleHead(model).eval()
    feats, toks = torch.randn(1, 9, 64), torch.randint(3, 96, (1, 9))
    pos = torch.arange(9)[None]
    with torch.no_grad():
        whole = head(feats, embed(model, toks), pos)
        cache = head.new_cache()
        a = head(feats[:, :5], embed(model, toks[:, :5]), pos[:, :5], cache)
        b = head(feats[:, 5:], embed(model, toks[:, 5:]), pos[:, 5:], cache)
    torch.testing.assert_close(torch.cat([a, b], 1), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("opts", [{"mode": "dynamic", "depth": 4, "topk": 3, "total": 10},
                                  {"mode": "dynamic", "depth": 6, "topk": 2, "total": 6},
                                  {"mode": "static"}])
def test_decodes_exactly_vanilla(model, head_dir, opts, tmp_path):
    from common.engine.tree import save_tree
    if opts["mode"] == "static":
        save_tree(tmp_path / "t.json", [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
        opts = {**opts, "tree": str(tmp_path / "t.json")}
    dec = Eagle(model, head=str(head_dir), **opts)
    van = get_decoder("vanilla", model)
    van.eos = dec.eos = set()
    for prompt in ([1, 5, 9, 33, 7], [1, 80, 81], [1, 4]):
        ids = torch.tensor([prompt])
        out, ref = dec.generate(ids, 40), van.generate(ids, 40)
        assert out.tokens == ref.tokens
        assert out.stats["steps"] < 41 and out.stats["draft_forwards"] > 0


def test_dynamic_tree_keeps_the_most_probable_paths(model, head_dir):
    dec = Eagle(model, head=str(head_dir), mode="dynamic", depth=3, topk=3, total=7)
    prop = dec.make_proposer(None)
    assert isinstance(prop, EagleProposer)
    with torch.inference_mode():
        logits, hidden = dec.target.start(torch.tensor([[1, 5, 9, 33]]), want_hidden=True)
        state = ProposerState(torch.tensor([[1, 5, 9, 33]]), [int(logits.argmax())], hidden, 20, 0.0, None)
        p = prop.propose(state)
    assert p.tree.size == 7 and p.tokens.numel() == 6
    # every kept node's parent is kept (build_tree would refuse otherwise) and depth-1 nodes are
    # the head's top tokens at the root, in rank order
    ids = state.ids[0, -4:]  # the prompt's features paired with the tokens after them
    with torch.no_grad():
        root = torch.log_softmax(model.lm_head(prop.head(hidden, embed(model, ids[None]), torch.arange(4)[None])[0, -1:]), -1)
    depth1 = [t for path, t in zip(p.tree.paths, p.tokens.tolist()) if len(path) == 1]
    assert depth1 == root[0].topk(len(depth1)).indices.tolist()


def test_bad_head_and_tree(model, head_dir, tmp_path):
    other = tiny_llama(seed=1, hidden=32, heads=4, kv_heads=2)
    with pytest.raises(UserError, match="trained for"):
        Eagle(other, head=str(head_dir))
    with pytest.raises(UserError, match="needs head="):
        Eagle(model)
    with pytest.raises(UserError, match="no stored tree of that size"):
        Eagle(model, head=str(head_dir), mode="static", tree=16)
    with pytest.raises(UserError, match="mode"):
        Eagle(model, head=str(head_dir), mode="beam")
    with pytest.raises(UserError, match="draft_vocab.json"):
        Eagle(model, head=str(head_dir), vocab=8)


# -- training (common.components.eagle_head) ----------------------------------------------------------------
def test_batch_masks_the_answer_predictions(model, tmp_path):
    import numpy as np
    from common.training import corpus
    from common.components.eagle_head import SeqData
    shard = corpus.Shard(np.arange(10, 16, dtype=np.int32), np.array([0, 6]), np.array([3], dtype=np.int32),
                         np.array([0]))
    data = SeqData([shard], [np.arange(12, dtype=np.float32).reshape(6, 2).repeat(32, 1)])
    f, ids, mask = data.batch([(0, 0)], 384, "cpu")
    assert ids.tolist() == [[10, 11, 12, 13, 14, 15]] and f.shape == (1, 6, 64)
    # prediction j gives x_{j+2}: the answer starts at 3, so j = 1..4
    assert mask.tolist() == [[False, True, True, True, True]]
    f, ids, mask = data.batch([(0, 0)], 4, "cpu")  # cut to the last 4 tokens: the answer starts at 1
    assert ids.tolist() == [[12, 13, 14, 15]] and mask.tolist() == [[True, True, True]]


def _teacher(model, tmp_path):
    from common.training import teacher
    cdir = tiny_corpus(tmp_path / "corpus", model, max_shards=2, answer_tokens=12, batch_size=4)
    return teacher.load_or_build(tmp_path / "teacher.pt", model, None, None, 0, 0, 0, topk=4, corpus_dir=cdir,
                                 pass_dtype="float32")


def test_training_learns_and_the_head_decodes_exactly(model, tmp_path):
    from common.config import TrainConfig
    from common.components.eagle_head import train_head
    from common.training.loop import Stopping
    data = _teacher(model, tmp_path)
    cfg = TrainConfig(lr=3e-3, epochs=20, batch_size=4, max_steps=40, checkpoint_every=10)
    stats = train_head(model, data, tmp_path / "head", cfg, Stopping(eval_every=10, patience=10),
                       max_len=64, noise=0.0)
    curve = [json.loads(l) for l in (tmp_path / "head" / "curve.jsonl").read_text().splitlines()]
    assert curve[-1]["heldout_loss"] < curve[0]["heldout_loss"]
    assert stats["steps"] == 40 and stats["answer_tokens"] > 0 and stats["sequences"] == 16
    assert stats["teacher"] == data["key"]
    dec = Eagle(model, head=str(tmp_path / "head"), mode="dynamic", depth=3, topk=2, total=6)
    van = get_decoder("vanilla", model)
    van.eos = dec.eos = set()
    ids = torch.tensor([[1, 5, 9, 33, 7]])
    assert dec.generate(ids, 30).tokens == van.generate(ids, 30).tokens
    assert len(stats["depth_acc_top1"]) == 6 and 0 <= stats["depth_acc_top1"][0] <= 1
    static = Eagle(model, head=str(tmp_path / "head"), mode="static", tree=8)  # a tree from the measured accuracies
    assert static.tree.size == 8
    assert static.generate(ids, 30).tokens == van.generate(ids, 30).tokens
    small = Eagle(model, head=str(tmp_path / "head"), mode="dynamic", depth=3, topk=2, total=6, vocab=10)
    drafted = small.generate(ids, 30)
    assert drafted.tokens == van.generate(ids, 30).tokens
    with pytest.raises(UserError, match="exceeds the"):
        Eagle(model, head=str(tmp_path / "head"), vocab=10 ** 6)


def test_depth_one_accuracy_is_the_held_out_top1(model, tmp_path):
    from common.components.eagle_head import depth_accuracy, evaluate, from_teacher
    held = from_teacher(_teacher(model, tmp_path)["heldout"])
    torch.manual_seed(0)
    head = EagleHead(model).eval()
    with torch.inference_mode():
        acc = depth_accuracy(head, model, held, depth=3, topk=4, every=1)
        ev = evaluate(head, model, held, 10 ** 6)
    assert acc[0][0] == pytest.approx(ev["heldout_top1"], abs=1e-6)
    assert sum(acc[0][:4]) <= ev["heldout_top5"] + 1e-6


def test_reduced_readout_drafts_only_kept_tokens(model, tmp_path):
    from common.components.reduced_head import reduced_readout, write_draft_vocab
    write_draft_vocab(tmp_path, torch.arange(95, -1, -1))  # most frequent first: 95, 94, ...
    readout = reduced_readout(model, tmp_path, 7)
    logits = readout(torch.randn(5, 64))
    assert set(logits.topk(7, dim=-1).indices.flatten().tolist()) <= set(range(89, 96))
    full = model.lm_head(torch.randn(1, 64))
    assert logits.shape[-1] == full.shape[-1]


def test_depth_accuracy_chains_see_what_the_decoder_drafts(model, head_dir):
    """depth_accuracy's batched chains (common.components.eagle_head.chain_features) feed the head exactly what
    the decoder's proposer feeds a chain of greedy tokens: same features at every depth, for
    several chain roots at once."""
    from common.checkpoints import load_trained
    from common.components.eagle_head import chain_features
    from common.engine.tree import build_tree

    head = EagleHead(model)
    load_trained(head, head_dir / CHECKPOINT)
    head.eval()
    torch.manual_seed(3)
    n, depth = 14, 4
    f, ids = torch.randn(1, n, 64), torch.randint(3, 96, (1, n))
    greedy = model.lm_head(f[0]).argmax(-1)
    starts = torch.tensor([3, 6, 9])
    with torch.inference_mode():
        batched = [feat.clone() for _, feat in chain_features(head, model, f, ids, greedy, starts, depth)]
        for r, j in enumerate(starts.tolist()):
            prop = EagleProposer(head, model, "static", tree=build_tree([(0,) * d for d in range(1, depth + 1)]))
            seen = []

            def forced(feats, k, j=j, seen=seen):  # drafts greedy[j + d] at depth d, recording the features
                seen.append(feats.clone())
                lp = torch.full((feats.shape[0], 96), -1e9)
                lp[:, greedy[j + len(seen)]] = 0.0
                return lp.topk(k, dim=-1)
            prop._top = forced
            prop.propose(ProposerState(ids[:, :j + 1], [int(ids[0, j + 1])], f[:, :j + 1], 20, 0.0, None))
            assert len(seen) == depth
            for d in range(depth):
                # the random head's features grow ~10x a depth: compare relative to their size
                scale = float(batched[d][r].abs().max())
                torch.testing.assert_close(seen[d][0], batched[d][r], atol=1e-5 * scale, rtol=1e-5)


def test_a_reduced_readout_ranks_as_the_full_log_softmax():
    """EagleProposer._top over a reduced readout normalizes over the kept tokens only; the
    log-probabilities and token ids equal those of the full-vocabulary log-softmax of the
    same head (every other logit is the minimum: its exponential is exactly 0)."""
    from types import SimpleNamespace

    from common.decoders.eagle import EagleProposer
    from common.components.reduced_head import ReducedHead
    torch.manual_seed(0)
    full = torch.nn.Linear(16, 50, bias=False)
    head = ReducedHead(full, torch.tensor([3, 7, 11, 20, 31, 42, 49]))
    feats = torch.randn(4, 16)
    with torch.no_grad():
        v, i = EagleProposer._top(SimpleNamespace(readout=head, device=feats.device), feats, 3)
        ref_v, ref_i = torch.log_softmax(head(feats).float(), dim=-1).topk(3, dim=-1)
    assert torch.equal(i, ref_i) and torch.allclose(v, ref_v, atol=1e-6)
    assert set(i.flatten().tolist()) <= {3, 7, 11, 20, 31, 42, 49}


def test_the_readout_counts_as_proposing_time(model, head_dir):
    """The draft's readout through the LM head is proposing work: it runs inside propose, which
    the tree loop times, so its time lands in propose_s and in draft_forward_s (the records'
    propose column), not in the target's or the loop's other time."""
    import time

    dec = Eagle(model, head=str(head_dir), mode="dynamic", depth=2, topk=2, total=4)
    fast = dec.generate(torch.tensor([[1, 2, 3, 4]]), 4).stats

    class Slow(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            time.sleep(0.02)
            return self.inner(x)

    dec.make_proposer = lambda ids, make=dec.make_proposer: setattr(p := make(ids), "readout", Slow(p.readout)) or p
    st = dec.generate(torch.tensor([[1, 2, 3, 4]]), 4).stats
    slept = 0.02 * (st["steps"] - 1)  # at least the root's readout each step after the prefill
    assert st["draft_forward_s"] == pytest.approx(sum(st["propose_s"][1:]))
    assert st["draft_forward_s"] >= slept > fast["draft_forward_s"]
    assert sum(st["other_s"]) < slept and st["target_forward_s"] < slept
