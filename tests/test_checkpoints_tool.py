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
    torch.save(state, ckpt)
    (ckpt.parent / "tree_16.json").write_text("{}")

    tool.keep("pkg", ["maps/main"], "embedded", root=tmp_path)
    kept = tmp_path / "results" / "pkg" / "checkpoints" / "embedded" / "maps" / "main" / "maps.pt"
    k = read_trained(kept)
    assert "optimizer" not in k and torch.equal(k["module"]["weight"], lin.state_dict()["weight"])

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


def test_model_folder_kept_as_its_difference_from_the_base(tmp_path, monkeypatch):
    """A save_pretrained component (the draft, BiLD's small models) is kept as the tensors that
    differ from its base; restore rebuilds the exact weights, and refuses another base."""
    from safetensors.torch import load_file, save_file

    from common.models import checkpoint_dir, tiny_llama

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    tiny_llama(seed=0, layers=2).save_pretrained(checkpoint_dir("tinybase"))
    draft = tiny_llama(seed=0, layers=2)
    with torch.no_grad():  # "training" touched one layer and the final norm only
        draft.model.layers[1].mlp.down_proj.weight.add_(0.5)
        draft.model.norm.weight.mul_(2.0)
    comp = tmp_path / "cache" / "components" / "embedded" / "draft"
    draft.save_pretrained(comp / "model")
    torch.save({"optimizer": torch.zeros(10)}, comp / "train.pt")  # the run state: not kept
    (comp / "stats.json").write_text('{"steps": 3}')
    original = load_file(comp / "model" / "model.safetensors")

    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tinybase")
    kept = tmp_path / "results" / "pkg" / "checkpoints" / "embedded" / "draft"
    own = load_file(kept / "model" / "delta.safetensors")
    assert set(own) == {"model.layers.1.mlp.down_proj.weight", "model.norm.weight"}
    assert not (kept / "train.pt").exists() and not (kept / "model" / "model.safetensors").exists()
    assert (kept / "stats.json").exists() and (kept / "model" / "config.json").exists()

    import shutil
    shutil.rmtree(comp)
    tool.restore("pkg", "embedded", root=tmp_path)
    rebuilt = load_file(comp / "model" / "model.safetensors")
    assert set(rebuilt) == set(original) and all(torch.equal(rebuilt[k], original[k]) for k in original)
    assert (comp / "stats.json").read_text() == '{"steps": 3}'

    shutil.rmtree(comp)
    base = checkpoint_dir("tinybase") / "model.safetensors"
    weights = load_file(base)
    weights["model.embed_tokens.weight"][0, 0] += 1.0  # another base
    save_file(weights, str(base), metadata={"format": "pt"})
    with pytest.raises(tool.UserError, match="model.embed_tokens.weight.*different values"):
        tool.restore("pkg", "embedded", root=tmp_path)
    assert not (comp / "model" / "model.safetensors").exists()
