"""The distilled draft: first layers of the target, KL distillation lowers the loss, exactness."""
import pytest
import torch

from common.decoders import get_decoder
from common.draft import distill, truncated_copy
from common.errors import UserError
from common.forward import embed, logits_from_hidden, run_layers
from common.training import TrainConfig


def test_truncated_copy_is_the_first_layers(tiny):
    draft = truncated_copy(tiny, 2)
    assert len(draft.model.layers) == 2 and len(tiny.model.layers) == 4
    ids = torch.tensor([[1, 5, 9, 4]])
    pos = torch.arange(4)[None]
    ref = logits_from_hidden(tiny, run_layers(tiny, embed(tiny, ids), None, 0, 2, pos))
    torch.testing.assert_close(draft(input_ids=ids).logits, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(UserError, match="layers=4"):
        truncated_copy(tiny, 4)


def test_distilled_draft_is_exact_in_speculative(tiny, tmp_path):
    van = get_decoder("vanilla", tiny)
    van.eos = set()
    corpus = []
    for i in range(6):
        prompt = [1] + torch.randint(3, 96, (5,), generator=torch.Generator().manual_seed(i)).tolist()
        corpus.append({"ids": prompt + van.generate(torch.tensor([prompt]), 16).tokens, "start": len(prompt)})
    for p in tiny.parameters():
        p.requires_grad_(False)
    stats = distill(tiny, corpus, 2, tmp_path, TrainConfig(lr=3e-3, epochs=3, batch_size=2))
    assert stats["final_loss"] < stats["first_loss"]
    assert (tmp_path / "model" / "config.json").is_file()
    from transformers import AutoModelForCausalLM
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    spec = get_decoder("speculative", tiny, draft=draft, gamma=3)
    for prompt in ([1, 7, 8, 9], [1, 30, 31]):
        ids = torch.tensor([prompt])
        assert spec.generate(ids, 24).tokens == get_decoder("vanilla", tiny).generate(ids, 24).tokens
