"""The distilled draft: first layers of the target, distillation on the teacher cache lowers the
loss and the held-out divergence, the held-out metrics, exactness."""
import pytest
import torch

from common.decoders import get_decoder
from decoding_checks import teacher_corpus
from common.components.draft_model import distill, evaluate, position_logits, truncated_copy
from common.errors import UserError
from common.engine.forward import embed, logits_from_hidden, run_layers
from common.training.teacher import teacher_pass
from common.training.loop import Stopping, TrainConfig


def test_truncated_copy_is_the_first_layers(tiny):
    draft = truncated_copy(tiny, 2)
    assert len(draft.model.layers) == 2 and len(tiny.model.layers) == 4
    ids = torch.tensor([[1, 5, 9, 4]])
    pos = torch.arange(4)[None]
    ref = logits_from_hidden(tiny, run_layers(tiny, embed(tiny, ids), None, 0, 2, pos))
    torch.testing.assert_close(draft(input_ids=ids).logits, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(UserError, match="layers=4"):
        truncated_copy(tiny, 4)


def test_position_logits_are_the_full_forwards_rows_and_their_gradients(tiny):
    """The head runs on the marked rows only; logits and the gradients they send into the layers
    are the full forward's at those rows."""
    draft = truncated_copy(tiny, 2)
    ids = torch.tensor([[1, 5, 9, 4, 7], [3, 2, 8, 0, 0]])
    rows = torch.tensor([[True, True, False, True, True], [False, True, True, False, False]])
    got = position_logits(draft, ids, rows)
    full = draft(input_ids=ids).logits
    assert got.shape == (int(rows.sum()), full.shape[-1])
    torch.testing.assert_close(got, full[rows], atol=1e-5, rtol=1e-5)
    w = draft.model.layers[0].mlp.down_proj.weight
    g_rows, = torch.autograd.grad(got.log_softmax(-1)[:, 3].sum(), w)
    g_full, = torch.autograd.grad(draft(input_ids=ids).logits[rows].log_softmax(-1)[:, 3].sum(), w)
    torch.testing.assert_close(g_rows, g_full, atol=1e-5, rtol=1e-4)
    assert position_logits(draft, ids, torch.zeros_like(rows)).shape == (0, full.shape[-1])


def test_heldout_metrics_of_the_target_itself(chaotic_llama):
    """The target as its own draft: full agreement, zero divergence; a one-layer copy: neither
    (the chaotic model, whose greedy output depends on the context)."""
    held = teacher_pass(chaotic_llama, teacher_corpus(chaotic_llama, 3, 50, 16), 96, 2)  # top-k = the whole vocabulary
    r = evaluate(chaotic_llama, held)
    assert r["heldout_top1"] == 1.0 and abs(r["heldout_kl"]) < 1e-3
    other = evaluate(truncated_copy(chaotic_llama, 1), held)
    assert other["heldout_top1"] < 1.0 and other["heldout_kl"] > 0.01


def test_distilled_draft_is_exact_in_speculative(tiny, tmp_path):
    teacher = {"key": {"test": 1}, "train": teacher_pass(tiny, teacher_corpus(tiny, 6, 0, 16), 8, 4),
               "heldout": teacher_pass(tiny, teacher_corpus(tiny, 3, 50, 16), 8, 4)}
    for p in tiny.parameters():
        p.requires_grad_(False)
    stats = distill(tiny, teacher, 2, tmp_path, TrainConfig(lr=3e-3, epochs=3, batch_size=2),
                    stop=Stopping(eval_every=3, patience=5), curve_path=tmp_path / "curve_copy.jsonl")
    assert stats["final_loss"] < stats["first_loss"]
    assert set(stats["final"]) == {"heldout_top1", "heldout_loss", "heldout_kl"} and stats["steps"] == 9
    assert (tmp_path / "curve_copy.jsonl").read_text() == (tmp_path / "curve.jsonl").read_text()
    assert (tmp_path / "model" / "config.json").is_file()
    from transformers import AutoModelForCausalLM
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    spec = get_decoder("speculative", tiny, draft=draft, gamma=3)
    for prompt in ([1, 7, 8, 9], [1, 30, 31]):
        ids = torch.tensor([prompt])
        assert spec.generate(ids, 24).tokens == get_decoder("vanilla", tiny).generate(ids, 24).tokens


@pytest.mark.parametrize("labels", ["greedy", "text"])
def test_hard_label_small_models_train_and_serve_bild(tiny, tmp_path, labels):
    """BiLD's small models from the same trainer: hard labels (the target's greedy tokens, or
    the text's), the loss falls, the model loads as bild's small model (exact at alpha_RB=0)."""
    teacher = {"key": {"test": 2}, "train": teacher_pass(tiny, teacher_corpus(tiny, 6, 10, 16), 8, 4),
               "heldout": teacher_pass(tiny, teacher_corpus(tiny, 3, 60, 16), 8, 4)}
    stats = distill(tiny, teacher, 2, tmp_path, TrainConfig(lr=3e-3, epochs=3, batch_size=2),
                    stop=Stopping(eval_every=3, patience=5), labels=labels)
    assert stats["labels"] == labels and stats["final_loss"] < stats["first_loss"]
    from transformers import AutoModelForCausalLM
    small = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()  # a tiny model has no tokenizer to save
    bild = get_decoder("bild", tiny, small=small, rollback_threshold=0.0)
    ids = torch.tensor([[1, 7, 8, 9]])
    assert bild.generate(ids, 20).tokens == get_decoder("vanilla", tiny).generate(ids, 20).tokens
    with pytest.raises(UserError, match="labels='soft'"):
        distill(tiny, teacher, 2, tmp_path / "x", TrainConfig(), labels="soft")


@pytest.mark.parametrize("labels", ["topk", "greedy"])
def test_reduced_head_trained_with_the_draft(tiny, tmp_path, labels):
    """--keep: the draft trains with a head over its most frequent labels from the first step
    (finite losses although some labels are dropped, falling), is saved with the sidecar that
    loading cuts the head with again, proposes only kept tokens, and BiLD at alpha_RB = 0 with
    it is still exactly the large model's greedy output."""
    from transformers import AutoModelForCausalLM
    from common.components.reduced_head import ReducedHead, apply_sidecar
    teacher = {"key": {"test": 3}, "train": teacher_pass(tiny, teacher_corpus(tiny, 6, 10, 16), 8, 4),
               "heldout": teacher_pass(tiny, teacher_corpus(tiny, 3, 60, 16), 8, 4)}
    stats = distill(tiny, teacher, 2, tmp_path, TrainConfig(lr=3e-3, epochs=3, batch_size=2),
                    stop=Stopping(eval_every=3, patience=5), labels=labels, keep=5)
    assert stats["keep"] == 5 and 0 < stats["train_coverage"] < 1  # some labels really are dropped
    assert 0 < stats["final_loss"] < stats["first_loss"] < 20  # no dropped label scored at the dtype's minimum
    assert stats["final_loss"] < stats["first_loss"]
    small = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    assert apply_sidecar(small, tmp_path / "model") and isinstance(small.lm_head, ReducedHead)
    kept = set(small.lm_head.keep.tolist())
    assert len(kept) == 5
    logits = small(input_ids=torch.tensor([[1, 7, 8, 9, 40, 41]])).logits[0]
    assert set(logits.argmax(-1).tolist()) <= kept
    r = evaluate(small, teacher["heldout"])
    assert r["heldout_top1"] <= stats["heldout_coverage"] + 1e-9  # a dropped token is never predicted
    bild = get_decoder("bild", tiny, small=small, rollback_threshold=0.0)
    ids = torch.tensor([[1, 7, 8, 9]])
    assert bild.generate(ids, 20).tokens == get_decoder("vanilla", tiny).generate(ids, 20).tokens
