"""The shared exit head of BiLD's early-exit model and of CALM's (bild.exits) on tiny random models:
the losses' weights, the loss against a direct computation, training on a frozen trunk, the saved
checkpoint (untied head, trunk unchanged) decoding exactly at the limits, and bad input."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from bild.calm import Calm
from decoding_checks import teacher_corpus
from bild.exits import (ExitHead, _main, exit_labels, exit_loss, exit_states, exit_weights, install, train_exits,
                        train_positions)
from common.decoders import get_decoder
from common.decoders.speculative import perturbed_copy
from common.errors import UserError
from common.records import content_digest
from common.engine.forward import embed, layer_states, logits_from_hidden, num_layers, run_layers
from common.training.teacher import teacher_pass
from common.training.loop import Stopping, TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def teacher(tiny):
    return {"key": {"test": 1}, "train": teacher_pass(tiny, teacher_corpus(tiny, 6, 0, 12), 8, 4),
            "heldout": teacher_pass(tiny, teacher_corpus(tiny, 3, 50, 12), 8, 4)}


def fresh(model):
    """A frozen copy (training installs the head into the model it is given)."""
    m = perturbed_copy(model, 0.0)
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def test_weights():
    assert exit_weights("bild", 30, 4) == {4: 0.5, 30: 0.5}
    w = exit_weights("calm", 4)
    assert list(w) == [1, 2, 3, 4] and sum(w.values()) == pytest.approx(1.0) and w[4] == pytest.approx(0.4)
    with pytest.raises(UserError, match="--exit-layer 4 is out of range"):
        exit_weights("bild", 4, 4)
    with pytest.raises(UserError, match="unknown"):
        exit_weights("medusa", 4)


def test_untrained_head_is_the_models_and_the_loss_is_the_weighted_nll(tiny, teacher):
    model = fresh(tiny)
    head = ExitHead(model)
    data = teacher["train"]
    ids = data.ids[None, : data.span(0)[1]].long()
    with torch.no_grad():
        torch.testing.assert_close(head(layer_states(model, ids, [4])[4]), model(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-5)
    assert head.head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # untied copy
    weights = {1: 0.25, 4: 0.75}
    pos = train_positions(data, None)
    assert torch.equal(pos, data.answer_positions())
    a, b = data.span(0)
    mine = ((pos >= a) & (pos < b)).nonzero().flatten().tolist()              # sequence 0's items
    got = exit_loss(exit_states(model, data, weights, pos), exit_labels(data, pos, "text"), weights)(head, mine)
    t = torch.arange(a + int(data.start[0]) - 1, b - 1) - a                 # answer positions of sequence 0
    y = data.ids[a + t + 1].long()
    pos0 = torch.arange(b - a)[None]
    want = 0.0
    with torch.no_grad():
        for depth, w in weights.items():
            logits = logits_from_hidden(model, run_layers(model, embed(model, ids), None, 0, depth, pos0))[0, t]
            want += w * torch.nn.functional.cross_entropy(logits, y)
    torch.testing.assert_close(got.detach(), want, rtol=1e-4, atol=1e-5)
    capped = train_positions(data, 3, seed=1)
    assert torch.equal(capped, train_positions(data, 3, seed=1)) and not torch.equal(capped, train_positions(data, 3, seed=2))
    for s in range(len(data)):
        a, b = data.span(s)
        assert 0 < int(((capped >= a) & (capped < b)).sum()) <= 3
    assert set(capped.tolist()) <= set(pos.tolist())
    greedy = exit_loss(exit_states(model, data, weights, capped), exit_labels(data, capped, "greedy"), weights)(head, [0, 4])
    assert greedy.requires_grad and torch.isfinite(greedy)
    torch.testing.assert_close(exit_labels(data, capped, "greedy"), data.argmax[capped].long())


def test_exit_states_are_the_trunks_raw_states_at_the_positions(tiny, teacher):
    """The cached states (any subset of positions, in their order) are the frozen trunk's own."""
    model, data = fresh(tiny), teacher["train"]
    pos = train_positions(data, 2, seed=0).flip(0)
    got = exit_states(model, data, {1: 0.5, 3: 0.5}, pos)
    assert got.shape == (2, pos.numel(), model.config.hidden_size) and got.dtype == torch.float32
    for r, p in enumerate(pos.tolist()):
        s = next(s for s in range(len(data)) if data.span(s)[0] <= p < data.span(s)[1])
        a, b = data.span(s)
        with torch.no_grad():
            want = layer_states(model, data.ids[None, a:b].long(), [1, 3])
        for j, depth in enumerate((1, 3)):
            torch.testing.assert_close(got[j, r], want[depth][0, p - a], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("loss", ["bild", "calm"])
def test_training_saves_a_model_that_decodes(tiny, teacher, tmp_path, loss):
    model = fresh(tiny)
    embed_before = model.model.embed_tokens.weight.clone()
    layer_before = {k: v.clone() for k, v in model.model.layers.state_dict().items()}
    stats = train_exits(model, teacher, loss, tmp_path, TrainConfig(lr=3e-3, epochs=2, batch_size=8),
                        # the last step's weights: this test checks that the trained head is what is
                        # saved (which evaluation's weights are kept is tests/training/test_training.py's)
                        stop=Stopping(eval_every=3, patience=5, restore_best=False), curve_path=tmp_path / "curve_copy.jsonl",
                        exit_layer=2 if loss == "bild" else None, labels="greedy", per_sequence=4)
    d = num_layers(model)
    assert stats["train_positions"] == 24 and stats["steps"] == 6                # 6 sequences x 4, batches of 8
    assert stats["final_loss"] < stats["first_loss"]
    assert stats["exit_depths"] == ([2, d] if loss == "bild" else list(range(1, d + 1)))
    assert len(stats["final"]["heldout_top1"]) == len(stats["exit_depths"]) and stats["final"]["heldout_agree"][-1] == 1.0
    assert stats["final"]["heldout_score"] == -stats["final"]["heldout_loss"]
    assert (tmp_path / "curve_copy.jsonl").read_text() == (tmp_path / "curve.jsonl").read_text()
    assert stats["model_digest"] == content_digest(tmp_path / "model")           # what its sweep's records name
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    assert not saved.config.tie_word_embeddings
    torch.testing.assert_close(saved.model.embed_tokens.weight, embed_before)      # the trunk is frozen
    for k, v in saved.model.layers.state_dict().items():
        torch.testing.assert_close(v, layer_before[k])
    assert not torch.equal(saved.lm_head.weight, embed_before)                   # the head trained, untied
    torch.testing.assert_close(saved.lm_head.weight, model.lm_head.weight)
    for prompt in ([1, 7, 8, 9], [1, 30, 31]):
        ids = torch.tensor([prompt])
        ref = get_decoder("vanilla", saved).generate(ids, 12).tokens
        assert get_decoder("bild", saved, exit_layer=2, rollback_threshold=0.0).generate(ids, 12).tokens == ref
        assert Calm(saved, threshold=1.0, tau=0.0).generate(ids, 12).tokens == ref


def test_install_makes_the_head_the_models(tiny):
    model = fresh(tiny)
    head = ExitHead(model)
    with torch.no_grad():
        head.head.weight.mul_(1.5)
        head.norm.weight.add_(0.25)
    install(model, head)
    ids = torch.tensor([[1, 5, 9, 4]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, head(layer_states(model, ids, [4])[4]))


def test_cli_bad_input_fails_before_loading(tmp_path):
    base = ["--model", "no-such-model", "--out", str(tmp_path), "--teacher", str(tmp_path / "t.pt"),
            "--heldout-corpus", str(tmp_path / "c.pt")]
    with pytest.raises(UserError, match="needs --exit-layer"):
        _main(base + ["--loss", "bild"])
    with pytest.raises(UserError, match="takes no --exit-layer"):
        _main(base + ["--loss", "calm", "--exit-layer", "2"])
    with pytest.raises(UserError, match="--per-sequence"):
        _main(base + ["--loss", "calm", "--per-sequence", "0"])
