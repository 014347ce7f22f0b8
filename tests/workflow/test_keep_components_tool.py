"""tools/keep_components.py: finished components kept in git without their optimizer state, and put back."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from common.training.loop import read_trained, save_trained

spec = importlib.util.spec_from_file_location("checkpoints_tool", Path(__file__).resolve().parents[2] / "tools" / "keep_components.py")
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


def _whole_model(tmp_path, monkeypatch):
    """A converted tiny base model and a 2-layer draft cut from it with trained layers, in the
    cache as rule distill_draft leaves one (model/, stats.json, the training checkpoint)."""
    from common.components.draft_model import truncated_copy
    from common.assets.models import checkpoint_dir, tiny_llama

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    base = tiny_llama(seed=3, layers=4, vocab=512, hidden=64)
    base.save_pretrained(checkpoint_dir("tiny-base"))
    draft = truncated_copy(base, 2)
    with torch.no_grad():
        for n, p in draft.named_parameters():
            if n.startswith("model.layers") or n.startswith("model.norm"):
                p.add_(0.01 * torch.randn_like(p))  # what training changes; the embedding stays the base's
    comp = tmp_path / "cache" / "components" / "embedded" / "draft"
    draft.save_pretrained(comp / "model")
    (comp / "model" / "chat_template.jinja").write_text("{{ messages }}")
    (comp / "stats.json").write_text('{"steps": 3}')
    torch.save({"module": draft.state_dict(), "optimizer": {}}, comp / "train.pt")
    return comp


def test_whole_model_kept_without_the_base_tensors_and_rebuilt_byte_for_byte(tmp_path, monkeypatch):
    from common.records import content_digest
    from common.weights_delta import kept_digest

    comp = _whole_model(tmp_path, monkeypatch)
    weights = (comp / "model" / "model.safetensors").read_bytes()
    digest = content_digest(comp / "model")
    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tiny-base")
    kept = tmp_path / "results" / "pkg" / "checkpoints" / "embedded" / "draft"
    assert not (kept / "model" / "model.safetensors").exists() and not (kept / "train.pt").exists()
    delta = kept / "model" / "model.safetensors.delta"
    # the embedding (512 x 64 of fp32) is the base's: the delta holds the layers and the norm only
    assert delta.stat().st_size < len(weights) - 512 * 64 * 4 + 4096
    assert kept_digest(kept / "model") == digest  # what records name, read off the kept copy
    assert (kept / "stats.json").is_file() and (kept / "model" / "chat_template.jinja").is_file()

    import shutil
    shutil.rmtree(comp)
    tool.restore("pkg", "embedded", root=tmp_path)
    assert (comp / "model" / "model.safetensors").read_bytes() == weights
    assert content_digest(comp / "model") == digest
    assert not list(comp.rglob("*.delta*")) and not list(comp.rglob("*.partial"))


def test_whole_model_against_another_base_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    from common.assets.models import checkpoint_dir, tiny_llama

    comp = _whole_model(tmp_path, monkeypatch)
    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tiny-base")
    import shutil
    shutil.rmtree(comp)
    tiny_llama(seed=4, layers=4, vocab=512, hidden=64).save_pretrained(checkpoint_dir("tiny-base"))  # another model
    with pytest.raises(tool.UserError, match="does not hold the tensor model.embed_tokens.weight"):
        tool.restore("pkg", "embedded", root=tmp_path)
    assert not (comp / "model" / "model.safetensors").exists() and not list(comp.rglob("*.partial"))


def test_truncated_delta_is_one_error_and_no_base_is_named(tmp_path, monkeypatch, capsys):
    comp = _whole_model(tmp_path, monkeypatch)
    with pytest.raises(tool.UserError, match="base model nothing-here is not converted"):
        tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="nothing-here")
    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tiny-base")
    delta = tmp_path / "results" / "pkg" / "checkpoints" / "embedded" / "draft" / "model" / "model.safetensors.delta"
    delta.write_bytes(delta.read_bytes()[:-100])
    import shutil
    shutil.rmtree(comp)
    with pytest.raises(tool.UserError, match="truncated"):
        tool.restore("pkg", "embedded", root=tmp_path)
    assert not (comp / "model" / "model.safetensors").exists()


def test_whole_model_kept_in_parts_no_larger_than_asked_and_rebuilt_byte_for_byte(tmp_path, monkeypatch):
    """A delta over --part-mib is kept as numbered parts (what a device call can bring back, and a
    file git holds comfortably); restore pastes them, each checked, into the same model."""
    import shutil

    from common.records import content_digest
    from common.weights_delta import kept_digest

    comp = _whole_model(tmp_path, monkeypatch)
    weights = (comp / "model" / "model.safetensors").read_bytes()
    digest = content_digest(comp / "model")
    part_mib = 0.05  # 52,428 bytes: the tiny draft's delta (~100 KiB) takes several parts
    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tiny-base", part_mib=part_mib)
    kept = tmp_path / "results" / "pkg" / "checkpoints" / "embedded" / "draft" / "model"
    parts = sorted(kept.glob("model.safetensors.delta.part*"))
    assert len(parts) >= 2 and not (kept / "model.safetensors.delta").exists()
    assert all(p.stat().st_size <= part_mib * 2**20 for p in parts)
    assert kept_digest(kept) == digest
    # kept again whole (a larger part size): no stale part is left to be pasted
    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tiny-base", part_mib=16)
    assert (kept / "model.safetensors.delta").is_file() and not list(kept.glob("*.part*"))
    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tiny-base", part_mib=part_mib)
    assert not (kept / "model.safetensors.delta").exists()

    shutil.rmtree(comp)
    tool.restore("pkg", "embedded", root=tmp_path)
    assert (comp / "model" / "model.safetensors").read_bytes() == weights
    assert content_digest(comp / "model") == digest
    # the parts and the manifest stay in git, not in the cache
    assert not list(comp.rglob("*.delta*")) and not list(comp.rglob("*.partial"))


@pytest.mark.parametrize("fault", ["missing", "truncated", "altered"])
def test_a_missing_or_damaged_part_is_one_error_and_leaves_nothing(tmp_path, monkeypatch, fault):
    import shutil

    comp = _whole_model(tmp_path, monkeypatch)
    tool.keep("pkg", ["draft"], "embedded", root=tmp_path, base="tiny-base", part_mib=0.05)
    kept = tmp_path / "results" / "pkg" / "checkpoints" / "embedded" / "draft" / "model"
    part = sorted(kept.glob("model.safetensors.delta.part*"))[1]
    data = part.read_bytes()
    if fault == "missing":
        part.unlink()
    elif fault == "truncated":
        part.write_bytes(data[:-10])
    else:
        part.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    shutil.rmtree(comp)
    with pytest.raises(tool.UserError, match=f"{part.name} is {fault}"):
        tool.restore("pkg", "embedded", root=tmp_path)
    model = comp / "model"
    assert not (model / "model.safetensors").exists() and not list(model.parent.rglob("*.partial"))


def test_a_part_size_that_holds_nothing_is_one_error(tmp_path, monkeypatch, capsys):
    _whole_model(tmp_path, monkeypatch)
    capsys.readouterr()  # the fixture's save_pretrained progress
    assert tool.main(["keep", "pkg", "draft", "--base", "tiny-base", "--part-mib", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --part-mib 0.0 holds nothing") and err.count("\n") == 1
