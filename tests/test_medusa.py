"""Medusa heads on a tiny model: training lowers the loss, decoding equals vanilla greedy."""
import json

import pytest
import torch

from common.decoders import get_decoder
from common.errors import UserError
from common.medusa import MedusaHeads, train_heads
from common.models import tiny_llama
from common.training import TrainConfig


@pytest.fixture(scope="module")
def corpus(tiny):
    van = get_decoder("vanilla", tiny)
    van.eos = set()  # long, EOS-free answers for training
    out = []
    for i in range(12):
        prompt = [1] + torch.randint(3, 96, (6,), generator=torch.Generator().manual_seed(i)).tolist()
        ans = van.generate(torch.tensor([prompt]), 24).tokens
        out.append({"ids": prompt + ans, "start": len(prompt)})
    return out


@pytest.fixture(scope="module", params=[False, True], ids=["own_heads", "shared_lm_head"])
def trained(request, tiny, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("medusa")
    stats = train_heads(tiny, corpus, out, n_heads=3, holdout=3,
                        cfg=TrainConfig(lr=3e-3, epochs=6, batch_size=3, checkpoint_every=10),
                        share_lm_head=request.param)
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
    assert len(stats["accuracy"]) == 3 and all(len(r) == 10 for r in stats["accuracy"])
    assert all((out / f"tree_{n}.json").is_file() for n in (16, 32, 63))
    assert stats["trees"][63] >= stats["trees"][16] >= 1.0


@pytest.mark.parametrize("tree", [16, 63])
def test_medusa_equals_vanilla(tiny, trained, tree):
    out, _ = trained
    med = get_decoder("medusa", tiny, heads=str(out), tree=tree)
    van = get_decoder("vanilla", tiny)
    for seed in range(4):
        ids = torch.tensor([[1] + torch.randint(3, 96, (5,), generator=torch.Generator().manual_seed(100 + seed)).tolist()])
        o = med.generate(ids, 30)
        assert o.tokens == van.generate(ids, 30).tokens
        assert sum(o.stats["accept_lengths"]) == len(o.tokens)


def test_medusa_bad_input(tiny, trained, tmp_path):
    out, _ = trained
    with pytest.raises(UserError, match="needs heads"):
        get_decoder("medusa", tiny)
    with pytest.raises(UserError, match="heads.pt does not exist; train Medusa heads first"):
        get_decoder("medusa", tiny, heads=str(tmp_path))
    other = tiny_llama(seed=1, layers=2)
    with pytest.raises(UserError, match="trained for"):
        get_decoder("medusa", other, heads=str(out))
