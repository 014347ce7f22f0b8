"""tools/checkpoints.py: finished components kept in git without their optimizer state, and put back."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from common.training import read_trained, save_trained

spec = importlib.util.spec_from_file_location("checkpoints_tool", Path(__file__).parent.parent / "tools" / "checkpoints.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def test_keep_strips_run_state_and_restore_puts_it_back(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("REPRO_CACHE_DIR", str(cache))
    lin = torch.nn.Linear(3, 2)
    ckpt = cache / "components" / "embedded" / "maps" / "main" / "maps.pt"
    save_trained(lin, ckpt, {"hidden": 3})
    state = torch.load(ckpt, weights_only=False)
    state["optimizer"] = {"big": torch.zeros(100)}
    state["best"] = {"step": 4, "value": 0.5, "params": {"weight": torch.zeros(2, 3)}}  # restore_best's run state
    state["last_module"] = {"weight": torch.ones(2, 3)}
    torch.save(state, ckpt)
    (ckpt.parent / "tree_16.json").write_text("{}")

    tool.keep("pkg", ["maps/main"], "embedded", root=tmp_path)
    kept = tmp_path / "results" / "pkg" / "checkpoints" / "embedded" / "maps" / "main" / "maps.pt"
    k = read_trained(kept)
    assert not {"optimizer", "best", "last_module"} & set(k) and torch.equal(k["module"]["weight"], lin.state_dict()["weight"])

    assert (kept.parent / "tree_16.json").read_text() == "{}"
    ckpt.unlink()
    (ckpt.parent / "tree_16.json").unlink()
    tool.restore("pkg", "embedded", root=tmp_path)
    assert torch.equal(read_trained(ckpt)["module"]["bias"], lin.state_dict()["bias"])
    assert (ckpt.parent / "tree_16.json").exists()
    tool.restore("pkg", "embedded", root=tmp_path)  # already there: left alone
    assert "kept in the cache already" in capsys.readouterr().out


def test_unfinished_or_missing_is_one_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(tool.UserError, match="holds no checkpoint"):
        tool.keep("pkg", ["nothing"], "embedded", root=tmp_path)
    assert tool.main(["restore", "nopkg"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
