"""The shared training loop: loss goes down, resume equals an uninterrupted run, config checks."""
import pytest
import torch

from common.errors import UserError
from common.training import TrainConfig, load_trained, train

DATA = [(torch.randn(4, generator=torch.Generator().manual_seed(i)), i % 3) for i in range(40)]


def loss_fn(m, batch):
    x = torch.stack([b[0] for b in batch])
    y = torch.tensor([b[1] for b in batch])
    return torch.nn.functional.cross_entropy(m(x), y)


def fresh():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def test_loss_decreases_and_resume_is_exact(tmp_path):
    cfg = TrainConfig(lr=0.05, epochs=4, batch_size=8, checkpoint_every=3)
    full = fresh()
    log = train(full, DATA, loss_fn, cfg, tmp_path / "a.pt")
    assert log[-1]["loss"] < log[0]["loss"] and len(log) == 20

    # interrupt after 7 steps, then resume from the step-6 checkpoint
    part = fresh()
    calls = {"n": 0}

    def stopping(m, b):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return loss_fn(m, b)

    with pytest.raises(KeyboardInterrupt):
        train(part, DATA, stopping, cfg, tmp_path / "b.pt")
    resumed = fresh()
    log_b = train(resumed, DATA, loss_fn, cfg, tmp_path / "b.pt", log_path=tmp_path / "b.jsonl")
    assert [r["step"] for r in log_b] == list(range(1, 21))
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert (tmp_path / "b.jsonl").read_text().count("\n") == 20


def test_checkpoint_identity_is_checked(tmp_path):
    cfg = TrainConfig(lr=0.05, epochs=1, batch_size=8)
    train(fresh(), DATA, loss_fn, cfg, tmp_path / "c.pt", meta={"layer": 3})
    with pytest.raises(UserError, match="another config"):
        train(fresh(), DATA, loss_fn, TrainConfig(lr=0.01, epochs=1, batch_size=8), tmp_path / "c.pt",
              meta={"layer": 3})
    with pytest.raises(UserError, match="trained for"):
        load_trained(fresh(), tmp_path / "c.pt", meta={"layer": 4})
    load_trained(fresh(), tmp_path / "c.pt", meta={"layer": 3})
    with pytest.raises(UserError, match="does not exist"):
        load_trained(fresh(), tmp_path / "nope.pt")
    with pytest.raises(UserError, match="batch_size=0"):
        TrainConfig(batch_size=0)
