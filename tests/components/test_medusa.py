"""Medusa heads on a tiny model: training on the teacher cache lowers the loss and raises
held-out accuracy, labels are the model's own greedy tokens, decoding equals vanilla greedy,
the fast path projects through the packed LM head."""
import json

import pytest
import torch

from common.decoders import get_decoder
from common.errors import UserError
from common.components.medusa_heads import HeadData, MedusaHeads, head_labels, new_heads, train_heads
from common.assets.models import tiny_llama
from common.training.teacher import teacher_pass
from common.training.loop import Stopping, TrainConfig


def greedy_corpus(model, n, seed0, length):
    van = get_decoder("vanilla", model)
    van.eos = set()  # long, EOS-free answers
    out = []
    for i in range(n):
        prompt = [1] + torch.randint(3, 96, (6,), generator=torch.Generator().manual_seed(seed0 + i)).tolist()
        out.append({"ids": prompt + van.generate(torch.tensor([prompt]), length).tokens, "start": len(prompt)})
    return out


@pytest.fixture(scope="module")
def teacher(chaotic_llama):
    """Training text: the model's greedy continuations of random prompts (its 'real text' would
    carry no signal); held out: other prompts' greedy continuations. The chaotic model, since
    the plain tiny one repeats a token (its untrained heads would already be right)."""
    m = chaotic_llama
    return {"key": {"test": 1}, "train": teacher_pass(m, greedy_corpus(m, 12, 0, 24), 8, 4),
            "heldout": teacher_pass(m, greedy_corpus(m, 4, 100, 24), 8, 4)}


@pytest.fixture(scope="module", params=[False, True], ids=["own_heads", "shared_lm_head"])
def trained(request, chaotic_llama, teacher, tmp_path_factory):
    out = tmp_path_factory.mktemp("medusa")
    for p in chaotic_llama.parameters():
        p.requires_grad_(False)
    stats = train_heads(chaotic_llama, teacher, out, n_heads=3, share_lm_head=request.param,
                        cfg=TrainConfig(lr=3e-3, epochs=6, batch_size=32, checkpoint_every=10),
                        stop=Stopping(eval_every=4, patience=3, min_delta=0.0), curve_path=out / "copy.jsonl")
    return out, stats


def test_heads_start_as_the_lm_head(tiny):
    heads = MedusaHeads(64, 96, 2, tiny.lm_head.weight.detach())
    h = torch.randn(5, 64)
    torch.testing.assert_close(heads(h)[1], tiny.lm_head(h))


def test_shared_heads_start_as_the_lm_head_and_save_only_blocks(tiny, tmp_path):
    heads = MedusaHeads(64, 96, 2, tiny.lm_head.weight.detach(), share_lm_head=True)
    h = torch.randn(5, 64)
    torch.testing.assert_close(heads(h)[1], tiny.lm_head(h))
    torch.testing.assert_close(heads.head_logits(0, h), tiny.lm_head(h))
    assert all(k.startswith("blocks.") for k in heads.state_dict())
    assert sum(p.numel() for p in heads.parameters()) == 2 * (64 * 64 + 64)


def test_training_and_stats(trained):
    out, stats = trained
    log = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
    curve = [json.loads(l) for l in (out / "copy.jsonl").read_text().splitlines()]
    assert curve[0]["step"] == 0 and len(curve[0]["heldout_top1"]) == 3 and curve[-1]["step"] == stats["steps"]
    assert curve[-1]["heldout_loss"][0] < curve[0]["heldout_loss"][0]  # held-out head-1 loss fell
    assert stats["stopped"] in ("flat", "epochs")
    assert len(stats["accuracy"]) == 3 and all(len(r) == 10 for r in stats["accuracy"])
    assert all((out / f"tree_{n}.json").is_file() for n in (16, 32, 63))
    assert stats["trees"][63] >= stats["trees"][16] >= 1.0
    # training time as every trainer reports it: the checkpoint's loop total, this session beside it
    state = torch.load(out / "heads.pt", weights_only=False, map_location="cpu")
    assert stats["train_wall_s"] == state["wall_s"] <= stats["session_wall_s"] and "curve_wall_s" not in stats


@pytest.mark.parametrize("tree", [16, 63])
def test_medusa_equals_vanilla(chaotic_llama, trained, tree):
    out, _ = trained
    med = get_decoder("medusa", chaotic_llama, heads=str(out), tree=tree)
    van = get_decoder("vanilla", chaotic_llama)
    for seed in range(4):
        ids = torch.tensor([[1] + torch.randint(3, 96, (5,), generator=torch.Generator().manual_seed(100 + seed)).tolist()])
        o = med.generate(ids, 30)
        assert o.tokens == van.generate(ids, 30).tokens
        assert sum(o.stats["accept_lengths"]) == len(o.tokens)


def test_medusa_bad_input(tiny, trained, tmp_path):
    out, _ = trained
    with pytest.raises(UserError, match="needs heads"):
        get_decoder("medusa", tiny)
    with pytest.raises(UserError, match=r"heads.pt does not exist; train it first \(python -m common.components.medusa_heads\)"):
        get_decoder("medusa", tiny, heads=str(tmp_path))
    other = tiny_llama(seed=1, layers=2)
    with pytest.raises(UserError, match="trained for"):
        get_decoder("medusa", other, heads=str(out))


def test_shared_heads_write_their_answer_tokens_draft_vocabulary(trained, teacher):
    """Shared heads' trainer writes draft_vocab.json: the training answers' tokens, most frequent
    first (what the decoder's ``vocab`` option keeps a prefix of); own heads get none."""
    import numpy as np
    out, stats = trained
    path = out / "draft_vocab.json"
    if not stats["meta"]["share_lm_head"]:
        assert not path.exists()
        return
    tr = teacher["train"]
    answers = torch.cat([tr.ids[a + int(p):b] for (a, b), p in
                         ((tr.span(s), tr.start[s]) for s in range(len(tr)))]).numpy()
    data = json.loads(path.read_text())
    counts = np.bincount(answers, minlength=96)
    assert sum(data["counts"]) == answers.size and len(data["order"]) == int((counts > 0).sum())
    assert data["counts"] == sorted(data["counts"], reverse=True)
    assert all(counts[t] == c for t, c in zip(data["order"], data["counts"]))


def test_reduced_vocabulary_proposes_the_kept_tokens_top_k(chaotic_llama, trained, tmp_path):
    """vocab=k: each depth's candidates are the heads' k-token top-k: the full logits' ranking
    restricted to the kept ids; decoding stays exactly greedy; its time counts as proposing."""
    import shutil
    from common.decoders.medusa import MedusaProposer
    from common.decoders.tree_loop import ProposerState, candidates_from_topk
    from common.components.reduced_head import write_draft_vocab
    out, stats = trained
    if not stats["meta"]["share_lm_head"]:
        with pytest.raises(UserError, match="share the base model's LM head"):
            get_decoder("medusa", chaotic_llama, heads=str(out), tree=16, vocab=8)
        return
    folder = tmp_path / "heads"
    shutil.copytree(out, folder)
    order = torch.randperm(96, generator=torch.Generator().manual_seed(1))
    write_draft_vocab(folder, order)
    med = get_decoder("medusa", chaotic_llama, heads=str(folder), tree=16, vocab=12)
    keep = torch.sort(order[:12]).values
    prop = MedusaProposer(med.heads, med.tree, med.readout)
    h = torch.randn(1, 1, 64)
    cand = prop.propose(ProposerState(torch.tensor([[1, 5]]), [7], h, 20, 0.0, None)).tokens
    full = med.heads(h[0, -1])[: med.tree.max_depth]  # [depth, V]
    masked = torch.full_like(full, float("-inf"))
    masked[:, keep] = full[:, keep]
    assert torch.equal(cand, candidates_from_topk(med.tree, masked.topk(prop.width, dim=-1).indices))
    assert set(cand.tolist()) <= set(keep.tolist())
    assert prop.stats() == {"draft_forwards": 1}  # the loop, not the proposer, times proposing
    van = get_decoder("vanilla", chaotic_llama)
    ids = torch.tensor([[1, 9, 4, 33, 70]])
    o = med.generate(ids, 24)
    assert o.tokens == van.generate(ids, 24).tokens
    assert 0 < o.stats["draft_forward_s"] == pytest.approx(sum(o.stats["propose_s"][1:]))
    # near the budget the tree is cut to what the step can still keep (remaining - 1 deep)
    last = prop.propose(ProposerState(torch.tensor([[1, 5]]), [7], h, 2, 0.0, None))
    assert last.tree.max_depth == 1 and last.tokens.numel() == last.tree.size - 1 > 0
    assert prop.propose(ProposerState(torch.tensor([[1, 5]]), [7], h, 1, 0.0, None)).tree.size == 1
    with pytest.raises(UserError, match="smaller than the tree's"):
        get_decoder("medusa", chaotic_llama, heads=str(folder), tree=63, vocab=1)
    with pytest.raises(UserError, match="exceeds the 96 tokens"):
        get_decoder("medusa", chaotic_llama, heads=str(folder), tree=16, vocab=97)
    (folder / "draft_vocab.json").unlink()
    with pytest.raises(UserError, match="draft_vocab.json"):
        get_decoder("medusa", chaotic_llama, heads=str(folder), tree=16, vocab=12)


def test_labels_are_the_models_greedy_tokens(tiny):
    seqs = [{"ids": [1, 5, 9, 14, 20, 31], "start": 2}, {"ids": [1, 7, 8], "start": 1}]
    d = teacher_pass(tiny, seqs, 4, 2)
    pos = torch.arange(d.n_tokens)
    teacher = head_labels(d, pos, 2, "teacher")
    text = head_labels(d, pos, 2, "text")
    # head 0 at t: the model's greedy token at t + 1 (its guess of ids[t + 2]) / the text's ids[t + 2]
    assert teacher[0, 0] == d.argmax[1] and text[0, 0] == 9 and text[1, 0] == 14
    assert teacher[0, 4] == d.argmax[5] and teacher[0, 5] == -100 and text[0, 4] == -100
    assert teacher[1, 6] == d.argmax[8] and teacher[0, 8] == -100 and teacher[1, 7] == -100  # no crossing
    data = HeadData(d, pos, 2, "teacher")
    assert len(data) == int((teacher[0] >= 0).sum())


def test_fast_path_projects_through_the_packed_lm_head():
    from common.engine.fast import PackedLinear, accelerate

    model = tiny_llama(seed=2)
    ref = {s: new_heads(model, 2, s) for s in (True, False)}
    accelerate(model)
    if not model._fast_path["packed"]:
        pytest.skip("no oneDNN packing on this machine")
    h = torch.randn(3, 64)
    for shared, heads in ref.items():
        with torch.no_grad():
            for b in heads.blocks:
                b.linear.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
        fast = new_heads(model, 2, shared)
        fast.load_state_dict(heads.state_dict())
        fast.for_decoding(model)
        if shared:
            assert fast._lm_head == (model.lm_head,) and set(fast.state_dict()) == set(heads.state_dict())
        else:
            assert isinstance(fast.out[0], PackedLinear) and isinstance(fast.blocks[0].linear, PackedLinear)
        with torch.inference_mode():
            torch.testing.assert_close(fast(h), heads(h), atol=1e-4, rtol=1e-4)
    # decoding with trained-format heads on the fast path stays exact (the lossless test covers both kinds)


def test_greedy_path_labels_keep_positions_where_the_text_followed_the_model(chaotic_llama):
    d0 = teacher_pass(chaotic_llama, [{"ids": [1, 5, 9, 14, 20, 31, 40], "start": 1}], 4, 1)
    # make the text follow the model's greedy path from position 1 to 4, then leave it
    ids = [1, 5] + [0] * 5
    for t in range(1, 6):
        ids[t + 1] = int(d0.argmax[t]) if t < 4 else (int(d0.argmax[t]) + 1) % 96
        d0 = teacher_pass(chaotic_llama, [{"ids": ids, "start": 1}], 4, 1)
    d = d0
    pos = torch.arange(d.n_tokens)
    g = head_labels(d, pos, 3, "greedy")
    t = head_labels(d, pos, 3, "teacher")
    follows = [int(d.ids[j + 1]) == int(d.argmax[j]) for j in range(d.n_tokens - 1)]
    for p in range(d.n_tokens):
        for k in range(3):
            path = p + k + 1 < d.n_tokens and all(follows[p + i] for i in range(k + 1))
            assert int(g[k, p]) == (int(t[k, p]) if path else -100), (k, p)
    assert (g[0] >= 0).sum() >= 2 and (g[2] >= 0).sum() >= 1  # the test is not vacuous
