"""The paper profile's code paths without GPUs or the hub: profile inheritance (``extends``),
local copies of hub repositories (``$DECODING_REPRO_MODELS``), the tiny stand-ins written
there, and the paper-tiny profile run end to end (every rule of the paper profile once)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.config import load_config, load_profile, resolve_profiles
from common.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


# ---------------------------------------------------------------- extends / replace
def _cfg(profiles):
    return {"profile": "a", "resource_classes": {}, "profiles": profiles}


def test_extends_merges_mappings_and_replaces_everything_else():
    base = {"x": 1, "sec": {"a": 1, "b": {"c": 1, "d": 2}, "l": [1, 2]}, "keep": {"k": 1}}
    child = {"extends": "base", "x": 2, "sec": {"b": {"d": 3}, "l": [9]}}
    out = resolve_profiles(_cfg({"base": base, "child": child}))["profiles"]
    assert out["child"] == {"x": 2, "sec": {"a": 1, "b": {"c": 1, "d": 3}, "l": [9]}, "keep": {"k": 1}}
    assert out["base"] == base and child["extends"] == "base"  # the input is untouched


def test_extends_chains_and_replace_drops_the_base_mapping():
    profiles = {"a": {"sec": {"v": {"p": 1, "q": 2}, "w": 1}},
                "b": {"extends": "a", "sec": {"w": 2}},
                "c": {"extends": "b", "replace": ["sec/v"], "sec": {"v": {"r": 3}}}}
    out = resolve_profiles(_cfg(profiles))["profiles"]
    assert out["c"] == {"sec": {"v": {"r": 3}, "w": 2}}
    assert "extends" not in out["c"] and "replace" not in out["c"]


@pytest.mark.parametrize("profiles,msg", [
    ({"a": {"extends": "nope"}}, "unknown profile (in config profiles/a/extends) 'nope'; valid: a"),
    ({"a": {"extends": "b"}, "b": {"extends": "a"}}, "in a cycle (a -> b -> a)"),
    ({"a": {}, "b": {"extends": "a", "replace": ["sec/v"], "sec": {}}}, "'sec/v' is not a mapping the profile sets"),
])
def test_extends_refused(profiles, msg):
    with pytest.raises(UserError) as e:
        resolve_profiles(_cfg(profiles))
    assert msg in str(e.value)


def test_paper_tiny_is_the_paper_profile_on_stand_ins():
    cfg = load_config()
    paper, tiny = cfg["profiles"]["paper"], cfg["profiles"]["paper-tiny"]
    # the paper's model kinds, layer indices, variants, decoders and groups; only sizes and places differ
    for path in ("model", "ppd_pipelined/layers", "prompt_decoding/variants", "firp/variants", "cross/groups",
                 "prompt_decoding/bench/decoders", "bild/tasks/iwslt/large", "released"):
        a, b = paper, tiny
        for part in path.split("/"):
            a, b = a[part], b[part]
        assert a == b, path
    p = load_profile(profile="paper-tiny")
    assert (p.device, p.dtype, p.offline) == ("cpu", "float32", True)
    assert not any("gpus" in r for r in p.raw["resources"].values())  # replaced, not merged
    # every hub model and released component the paper profile names has a stand-in
    named = {paper["model"], paper["ppd_pipelined"]["model"], paper["ppd_pipelined"]["sampling"]["model"],
             paper["prompt_decoding"]["variants"]["draft"]["base"], *paper["released"].values(), paper["bild"]["model"]}
    for t in paper["bild"]["tasks"].values():
        named |= {t["large"], *t["small"].values()}
    assert named <= set(tiny["stand_ins"])


# ---------------------------------------------------------------- local copies and stand-ins
def test_model_root_is_read_before_the_hub(tmp_path, monkeypatch):
    from common.assets.models import MODEL_ROOT_ENV, resolve
    from common.components.released_heads import source_folder

    copy = tmp_path / "lmsys" / "vicuna-7b-v1.3"
    copy.mkdir(parents=True)
    (copy / "config.json").write_text("{}")
    monkeypatch.setenv(MODEL_ROOT_ENV, str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert resolve("vicuna-7b") == str(copy) == resolve("lmsys/vicuna-7b-v1.3")
    assert resolve("someone/else") == "someone/else"  # no copy, hub on: the hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"someone/else has no local copy in DECODING_REPRO_MODELS=.* hub is off"):
        resolve("someone/else")
    released = tmp_path / "FasterDecoding" / "medusa-x"
    released.mkdir(parents=True)
    assert source_folder("FasterDecoding/medusa-x", ("medusa_lm_head.pt",)) == released


@pytest.mark.model
def test_stand_ins_load_and_released_ones_convert(embedded, tmp_path, monkeypatch):
    from common.assets.models import MODEL_ROOT_ENV, load_model
    from common.components.released_heads import convert_medusa
    from common.harness.stand_ins import build
    from prompt_decoding.released import convert_prompt_tokens

    stand_ins = {"org/llama": {"arch": "llama", "layers": 3}, "org/t5": {"arch": "t5", "layers": 2},
                 "org/mt5": {"arch": "mt5", "layers": 2},
                 "org/medusa": {"arch": "medusa", "base": "org/llama", "heads": 2},
                 "org/ppd": {"arch": "prompt_tokens", "base": "org/llama", "m": 2, "n": 2}}
    build(stand_ins, tmp_path, "smollm2-135m-instruct")
    monkeypatch.setenv(MODEL_ROOT_ENV, str(tmp_path))
    model, tok = load_model("org/llama")
    assert model.config.num_hidden_layers == 3 and model.config.vocab_size == len(tok) == len(embedded[1])
    first = model.model.layers[0].self_attn.q_proj.weight.clone()
    build({"org/llama": stand_ins["org/llama"]}, tmp_path, "smollm2-135m-instruct")
    assert torch.equal(load_model("org/llama")[0].model.layers[0].self_attn.q_proj.weight, first)  # seeded by name
    for name, depth in (("org/t5", 2), ("org/mt5", 2)):
        m, _ = load_model(name)
        assert m.config.is_encoder_decoder and m.config.num_layers == depth
    # the released stand-ins are in their authors' formats: the converters read them for this base
    convert_medusa("org/medusa", model, tmp_path / "heads")
    assert (tmp_path / "heads" / "heads.pt").is_file()
    convert_prompt_tokens("org/ppd", model, tmp_path / "prompts")
    assert (tmp_path / "prompts" / "prompts.pt").is_file()
    assert not list(tmp_path.rglob("*.partial"))


def test_stand_ins_cli_refuses_a_profile_without_them():
    r = subprocess.run([sys.executable, "-m", "common.harness.stand_ins", "--profile", "smoke"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert [l for l in r.stderr.splitlines() if l.startswith("error:")] == [
        "error: profile 'smoke' has no stand_ins and model_root; valid: a profile that names both (paper-tiny)"]


# ---------------------------------------------------------------- the paper profile's DAG, run
def _job_counts(text: str) -> dict[str, int]:
    """Snakemake's "Job stats" table (rule -> count) from its output."""
    table = text.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


def _snakemake(*args):
    return subprocess.run([*SNAKEMAKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=3600)


@pytest.mark.dag
@pytest.mark.model
def test_paper_tiny_runs_every_paper_rule_end_to_end(embedded):
    """``snakemake all --config profile=paper-tiny rerun=true`` from nothing: the paper profile's
    jobs, rule for rule (plus the stand-ins), run on tiny stand-ins and fixtures, and every
    artifact renders with the profile's provenance."""
    plan = {p: _snakemake("-n", "-F", "--nolock", "all", "--config", f"profile={p}", "rerun=true")
            for p in ("paper", "paper-tiny")}
    for p, r in plan.items():
        assert r.returncode == 0, (p, r.stdout[-2000:] + r.stderr[-2000:])
    paper, tiny = (_job_counts(plan[p].stdout + plan[p].stderr) for p in ("paper", "paper-tiny"))
    extra = {k: v for k, v in tiny.items() if k not in paper}
    assert set(extra) <= {"stand_ins", "prepare_model"} and tiny["stand_ins"] == 1, extra
    # jobs per listed item where paper-tiny cuts the list: the exact-distribution check's decoders (two of the
    # paper's 19) and the sampled study's datasets (one of six)
    raw = load_profile(profile="paper-tiny").raw
    cut = {"sampling_part": 1 + len(raw["sampling_report"]["decoders"]),
           "study_sampled_bench": len(raw["study"]["sampled"]["datasets"])}
    assert {k: v for k, v in tiny.items() if k in paper} == {**paper, **cut}

    shutil.rmtree(ROOT / ".cache" / "paper-tiny", ignore_errors=True)
    shutil.rmtree(ROOT / ".cache" / "components" / "paper-tiny", ignore_errors=True)
    r = _snakemake("-j2", "all", "--config", "profile=paper-tiny", "rerun=true")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    md = (ROOT / ".cache" / "paper-tiny" / "results" / "cross" / "tables" / "cross.table.md").read_text()
    assert "profile**: paper-tiny" in md and "vicuna-7b" in md
    done = json.loads((ROOT / ".cache" / "paper-tiny" / "hub" / "stand_ins.json").read_text())
    assert set(done["stand_ins"]) == set(load_profile(profile="paper-tiny").raw["stand_ins"])
