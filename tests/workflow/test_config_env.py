"""Config validation, profiles, and the pins of requirements.txt vs env.yml."""
import copy
from collections.abc import Mapping
import re
from pathlib import Path

import pytest
import yaml

from common.config import bench_decoders, load_profile, read_config
from common.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
CFG = read_config()


@pytest.mark.parametrize("name", ["smoke", "embedded", "paper", "paper-tiny"])
def test_profiles_validate(name):
    p = load_profile(CFG, name)
    assert p.name == name and p.cross.max_new_tokens >= 1 and "vanilla" in p.cross.groups["baselines"]


def test_default_is_embedded_offline():
    p = load_profile()
    assert p.name == "embedded" and p.offline and p.device == "cpu" and p.results_root == "results"


def test_unknown_profile():
    with pytest.raises(UserError, match="unknown profile 'gpu'; valid: embedded, paper, paper-tiny, smoke"):
        load_profile(CFG, "gpu")


@pytest.mark.parametrize("path,value,msg", [
    (("cross", "max_new_tokens"), 0, "max_new_tokens"),
    (("threads",), "two", "threads"),
    (("dtype",), "int8", "dtype"),
    (("cross", "typo_key"), 1, "typo_key"),
    (("cross", "groups"), {"g": ["hf_generate", "prompt_lookup"]}, "vanilla"),
    # a variant's override is typed like train's key it overrides (the key set alone used to be checked)
    (("prompt_decoding", "variants", "main", "max_steps"), 0, "variants/main/max_steps"),
    (("prompt_decoding", "variants", "ept2", "mask"), "causal", "variants/ept2/mask"),
    (("firp", "variants", "main", "lr"), -1e-3, "variants/main/lr"),
    (("firp", "variants", "k1l9", "layers"), [0], "variants/k1l9/layers"),
    (("firp", "train", "anchors"), 0, "firp/train/anchors"),
])
def test_invalid_config_one_line(path, value, msg):
    cfg = copy.deepcopy(CFG)
    d = cfg["profiles"]["smoke"]
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(UserError, match=msg) as e:
        load_profile(cfg, "smoke")
    assert "\n" not in str(e.value)


def _pins(lines):
    pins = {}
    for line in lines:
        m = re.match(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_env_yml_and_requirements_pin_the_same():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((ROOT / "env.yml").read_text())
    pip_list = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert req and req == _pins(pip_list)
    assert req["torch"] == "2.13.0"
    assert "python=3.11" in env["dependencies"]


def _with(cfg_edit):
    cfg = copy.deepcopy(CFG)
    cfg_edit(cfg)
    return cfg


@pytest.mark.parametrize("edit,msg", [
    (lambda c: c["decoder_config"].update({"medusa@t99": {"tree": 16}}), "no group of any profile runs 'medusa@t99'"),
    (lambda c: c["profiles"]["smoke"]["cross"].update(decoder_config={"medusa@t63": {"tree": 63}, "hf_assisted@x": {}}),
     "no group of profile 'smoke' runs 'hf_assisted@x'"),
    (lambda c: c["profiles"]["smoke"]["cross"]["groups"].update(x=["vanilla", "speculative@fast"]),
     "label 'speculative@fast' has no decoder_config entry"),
    (lambda c: c["profiles"]["smoke"]["cross"]["groups"].update(x=["vanilla", "jacobi"]), "unknown decoder 'jacobi'"),
])
def test_decoder_labels_checked(edit, msg):
    with pytest.raises(UserError, match=re.escape(msg)) as e:
        load_profile(_with(edit), "smoke")
    assert "\n" not in str(e.value)


def _pd_bench(c):
    return c["profiles"]["smoke"]["prompt_decoding"]["bench"]


@pytest.mark.parametrize("edit,msg", [
    (lambda c: _pd_bench(c)["decoders_by_dataset"].update({"gsm8k": ["vanilla", "prompt_decoding@t8"]}),
     "decoders_by_dataset/gsm8k: the benchmark runs no dataset 'gsm8k'; valid: mt-bench, humaneval"),
    (lambda c: _pd_bench(c)["decoders_by_dataset"].update({"humaneval": ["vanilla", "medusa@t63"]}),
     "decoders_by_dataset/humaneval: medusa@t63 not among the benchmark's decoders; valid: vanilla,"),
    (lambda c: _pd_bench(c)["decoders_by_dataset"].update({"humaneval": ["prompt_decoding@t8", "medusa@t16"]}),
     "does not contain"),
    (lambda c: c["profiles"]["smoke"]["firp"]["figure_datasets"].update(fig1=["xsum"]),
     "firp/figure_datasets/fig1: the benchmark runs no dataset xsum; valid: mt-bench, sharegpt-summarize"),
])
def test_bench_subsets_checked(edit, msg):
    """A per-dataset decoder subset must name a dataset the benchmark runs and only its decoders
    (the rule's inputs and options come from the full list), vanilla among them."""
    with pytest.raises(UserError, match=re.escape(msg)) as e:
        load_profile(_with(edit), "smoke")
    assert "\n" not in str(e.value)


def test_bench_decoders_per_dataset():
    bench = {"datasets": {"a": 1, "b": 1}, "decoders": ["vanilla", "x@1", "y", "x@2"],
             "decoders_by_dataset": {"b": ["x@2", "vanilla"]}}
    assert bench_decoders(bench, "a") == ["vanilla", "x@1", "y", "x@2"]
    assert bench_decoders(bench, "b") == ["vanilla", "x@2"]  # the list's order, not the subset's
    assert bench_decoders({k: v for k, v in bench.items() if k != "decoders_by_dataset"}, "b") == bench["decoders"]


def test_shared_decoder_config_merged_and_overridable():
    cfg = _with(lambda c: c["profiles"]["smoke"]["cross"].update(decoder_config={"medusa@t63": {"heads": "{medusa}", "tree": 32}}))
    smoke, embedded = load_profile(cfg, "smoke"), load_profile(cfg, "embedded")
    assert smoke.cross.decoder_config["medusa@t63"]["tree"] == 32 and embedded.cross.decoder_config["medusa@t63"]["tree"] == 63
    assert smoke.cross.decoder_config["speculative"] == CFG["decoder_config"]["speculative"]


def test_ppd_keys_are_all_read():
    """Every ppd_pipelined key the config may hold is required by the schema or read by a dataclass."""
    from ppd_pipelined.config import from_profile
    c = from_profile(load_profile(CFG, "embedded"))
    raw = CFG["profiles"]["embedded"]["ppd_pipelined"]
    assert c.mid_layer == raw["mid_layer"] and c.ks == tuple(raw["ks"])
    assert c.sampling.tasks == tuple(raw["sampling"]["tasks"]) and c.table3.tasks == tuple(raw["table3"]["tasks"])


def test_profile_files_under_snakemake_overrides():
    """Snakemake's config (config.yaml and --configfile on top) over config/profiles/*.yaml: a
    profiles mapping there changes one key of one profile, every other setting comes from the files."""
    from common.config import with_profile_files
    snake = {k: v for k, v in CFG.items() if k != "profiles"}
    assert with_profile_files(snake)["profiles"] == CFG["profiles"]
    over = with_profile_files({**snake, "profiles": {"smoke": {"cross": {"n": 7}}}})["profiles"]
    assert over["smoke"]["cross"]["n"] == 7 and over["smoke"]["cross"]["groups"] == CFG["profiles"]["smoke"]["cross"]["groups"]
    assert over["embedded"] == CFG["profiles"]["embedded"]
    assert load_profile(with_profile_files({**snake, "profiles": {"smoke": {"cross": {"n": 7}}}}), "smoke").cross.n == 7


def _bench_sections(node, path=()):
    """Every (path, section) in a profile's raw config that names benchmark datasets with prompt counts."""
    if isinstance(node, Mapping):
        if isinstance(node.get("datasets"), Mapping):
            yield path, node
        for k, v in node.items():
            yield from _bench_sections(v, (*path, str(k)))


@pytest.mark.parametrize("name", ["smoke", "paper-tiny"])
def test_ci_profiles_run_every_benchmark_at_ci_size(name):
    """The CI profiles inherit every section they do not override: a section added to the embedded or
    paper profile (80 prompts, 512 tokens) must be cut here too, or CI runs it at full size."""
    p = load_profile(CFG, name)
    found = list(_bench_sections(p.raw))
    assert found, "no benchmark sections found: the walk no longer matches the config's shape"
    for path, s in found:
        assert all(n <= 2 for n in s["datasets"].values()), (path, s["datasets"])
        assert s.get("max_new_tokens", 0) <= 16, (path, s.get("max_new_tokens"))
