"""The one config path: ``config/config.yaml`` (what every profile shares) and one file per profile
(``config/profiles/<name>.yaml``) -> each profile's ``extends`` resolved -> JSON-schema validation
-> frozen dataclass.

The Snakefile, every CLI and every notebook load profiles through :func:`load_profile`, so a
typo in the config or an unknown profile fails once, in one line, before any rule runs.
:func:`artifact_inputs` is the one list of raw records an artifact reads: the rules declare
it and the notebooks read exactly it.
"""
from __future__ import annotations

import ast
import atexit
import itertools
import json
import os
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import jsonschema
import yaml

from .errors import UserError, check_range, unknown

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
PROFILES_DIR = CONFIG_DIR / "profiles"  # <name>.yaml: the profile ``name``
# Trained components a decoder option may name, and the statistics file each training writes.
COMPONENTS = ("medusa", "draft", "eagle")
# The A/A pair: ``vanilla`` run a second time under this label, interleaved per prompt in the
# same benchmark (python -m common.harness.bench --aa). Two runs of one decoder differ only by the
# machine's noise, so their tokens/s ratio is the run's noise floor for every speedup.
AA_LABEL = "vanilla@aa"


def _decoder_names() -> frozenset[str] | None:
    """Registered decoder names, read without importing anything (planning a workflow should
    not import torch): the ``decoding_repro.decoders`` entry points of pyproject.toml when
    decoders register there, else the DECODERS literal of common/decoders/__init__.py.
    None when neither holds them (then names are not checked)."""
    root = Path(__file__).resolve().parent
    try:
        project = tomllib.loads((root.parent / "pyproject.toml").read_text()).get("project", {})
        names = project.get("entry-points", {}).get("decoding_repro.decoders")
        if names:
            return frozenset(names)
        tree = ast.parse((root / "decoders" / "__init__.py").read_text())
    except (OSError, SyntaxError, tomllib.TOMLDecodeError):
        return None
    for node in tree.body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "DECODERS" and isinstance(node.value, ast.Dict):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return None


DECODER_NAMES = _decoder_names()


SCHEDULES = ("linear", "cosine")


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and schedule of :func:`common.training.loop.train` (AdamW, linear warmup then a
    ``linear`` decay as Medusa and PPD train, or a ``cosine`` one as prompt decoding does).
    Torch-free, so the workflow can build it while planning.

    ``max_steps`` caps the steps of ``epochs`` (quick runs); the schedule spans the capped total.
    """
    lr: float = 1e-3
    warmup_frac: float = 0.04
    weight_decay: float = 0.0
    epochs: int = 1
    batch_size: int = 8
    seed: int = 0
    checkpoint_every: int = 50
    max_grad_norm: float = 1.0
    schedule: str = "linear"
    max_steps: int | None = None

    def __post_init__(self):
        if not self.lr > 0:
            raise UserError(f"lr={self.lr} is out of range; valid: > 0")
        check_range("warmup_frac", self.warmup_frac, 0, 1)
        check_range("weight_decay", self.weight_decay, 0)
        check_range("epochs", self.epochs, 1)
        check_range("batch_size", self.batch_size, 1)
        check_range("checkpoint_every", self.checkpoint_every, 1)
        check_range("max_grad_norm", self.max_grad_norm, 0)
        if self.schedule not in SCHEDULES:
            raise UserError(f"schedule {self.schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")
        if self.max_steps is not None:
            check_range("max_steps", self.max_steps, 1)


@dataclass(frozen=True)
class BenchConfig:
    dataset: str
    n: int
    max_new_tokens: int
    max_prompt_tokens: int
    groups: Mapping[str, tuple[str, ...]]  # group -> decoders, vanilla among them
    decoder_config: Mapping[str, Mapping] = field(default_factory=dict)  # label -> options


@dataclass(frozen=True)
class Profile:
    """One validated profile (smoke, embedded or paper)."""
    name: str
    results_root: str
    offline: bool
    model: str
    device: str
    dtype: str
    threads: int
    cross: BenchConfig
    raw: Mapping = field(default_factory=dict, repr=False)
    # rule -> its resource class (the top-level resource_classes, inverted)
    resource_class: Mapping = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class RuleResources:
    """What the scheduler reserves for one rule (a profile's ``resources`` entry).

    ``runtime`` is in minutes; ``gpus`` become SLURM's ``--gpus``; an ``exclusive`` rule (a
    timing rule) never shares the machine: locally it takes every core Snakemake was given,
    under SLURM it asks for a node of its own."""
    threads: int
    mem_mb: int
    runtime: int
    gpus: int = 0
    exclusive: bool = False

    def snakemake(self) -> dict:
        """The rule's ``resources:`` (names the SLURM executor plugin reads; an executor that
        does not know ``cpus_per_task`` or ``slurm_extra`` ignores them)."""
        res = {"mem_mb": self.mem_mb, "runtime": self.runtime, "cpus_per_task": self.threads}
        if self.gpus:
            res["gpu"] = self.gpus
        if self.exclusive:
            res["slurm_extra"] = "--exclusive"
        return res


def rule_resources(profile: Profile, key: str) -> RuleResources:
    """Rule ``key``'s reservation: its class's entry of the profile's ``resources`` with the
    profile's ``overrides`` for the rule on top (validated by the schema); UserError when the rule
    has no class or the profile no entry for it, so a rule cannot go without."""
    table = profile.raw["resources"]
    cls = profile.resource_class.get(key)
    if cls is None:
        raise UserError(f"config resource_classes: rule {key!r} is in no class "
                        f"(classes: {', '.join(sorted(set(profile.resource_class.values())))})")
    if cls not in table:
        raise UserError(f"config profiles/{profile.name}/resources: no entry for class {cls!r} of rule {key!r} "
                        f"(threads, mem_mb, runtime); entries: {', '.join(sorted(set(table) - {'overrides'}))}")
    return RuleResources(**{**table[cls], **table.get("overrides", {}).get(key, {})})


def resource_class_of(config: dict) -> dict:
    """``{rule: class}`` from the top-level ``resource_classes``; UserError for a rule in two
    classes or an override naming a rule in none (a typo would otherwise be ignored)."""
    out = {}
    for cls, rules in config["resource_classes"].items():
        for rule in rules:
            if rule in out:
                raise UserError(f"config resource_classes: rule {rule!r} is in both {out[rule]!r} and {cls!r}")
            out[rule] = cls
    for name, p in config["profiles"].items():
        for rule in p["resources"].get("overrides", {}):
            if rule not in out:
                raise UserError(f"config profiles/{name}/resources/overrides: {rule!r} is in no resource class "
                                f"(rules: {', '.join(sorted(out))})")
    return out


def validate(config: dict, schema_path: Path = CONFIG_DIR / "schema.yaml") -> None:
    """Raise UserError naming the first schema violation (path and message)."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(map(str, e.absolute_path)) or "<top>"
        hint = f" ({e.schema['description']})" if isinstance(e.schema, dict) and "description" in e.schema else ""
        raise UserError(f"config invalid at {where}: {e.message}{hint}") from None
    check_decoder_labels(config)
    for name, p in config["profiles"].items():
        check_variant_refs(name, p)


def check_variant_refs(name: str, profile_raw: Mapping) -> None:
    """Raise UserError where a section's ``ablation`` lists or a variant's ``init_from`` name a
    training (variant) the section does not define, or a variant starts from itself or from a
    training of another shape (``m``, ``n``, ``mask``)."""
    for sec_name, sec in profile_raw.items():
        if not isinstance(sec, Mapping) or not isinstance(sec.get("variants"), Mapping):
            continue
        variants, where = sec["variants"], f"config profiles/{name}/{sec_name}"
        for art, names in (sec.get("ablation") or {}).items():
            unknown = [v for v in names if v not in variants]
            if unknown:
                raise UserError(f"{where}/ablation/{art}: no variant {', '.join(unknown)}; valid: {', '.join(variants)}")
        for v, over in variants.items():
            src = over.get("init_from")
            if src is None:
                continue
            if src == v or src not in variants:
                raise UserError(f"{where}/variants/{v}/init_from: {src!r} is not another variant; "
                                f"valid: {', '.join(x for x in variants if x != v)}")
            shape = lambda x: [{**sec.get("train", {}), **variants[x]}.get(k) for k in ("m", "n", "mask")]
            if shape(src) != shape(v):
                raise UserError(f"{where}/variants/{v}/init_from: {src!r} has m, n, mask {shape(src)}, "
                                f"{v!r} has {shape(v)}; valid: a variant of the same shape")


def label_lists(profile_raw: Mapping) -> dict[str, list[str]]:
    """Every list of decoder labels a profile runs, by where it is: the cross groups
    (``cross/groups/<group>``) and each paper section's benchmark (``<section>/bench/decoders``)."""
    out = {f"cross/groups/{g}": list(ls) for g, ls in profile_raw["cross"]["groups"].items()}
    for name, sec in profile_raw.items():
        bench = sec.get("bench") if isinstance(sec, Mapping) else None
        if isinstance(bench, Mapping) and "decoders" in bench:
            out[f"{name}/bench/decoders"] = list(bench["decoders"])
    return out


def labels_config(profile: Profile, labels) -> dict:
    """Options of the given decoder labels (labels without options left out)."""
    return {k: dict(v) for k, v in profile.cross.decoder_config.items() if k in labels}


def check_decoder_labels(config: dict) -> None:
    """Raise UserError on a decoder label or decoder_config key that nothing would use.

    A label ``name@variant`` (of a cross group or a paper section's benchmark,
    :func:`label_lists`) must name a registered decoder and, when it has a variant, a
    decoder_config entry; the shared decoder_config's keys must each be a label some profile
    runs, a profile's own keys a label it runs. Otherwise a
    typo would silently run a decoder with default options.
    """
    profiles = config["profiles"]
    used = {n: {l for ls in label_lists(p).values() for l in ls} for n, p in profiles.items()}
    everywhere = set().union(*used.values())
    shared = config.get("decoder_config", {})
    for key in shared:
        if key not in everywhere:
            raise UserError(f"config decoder_config/{key}: no group of any profile runs {key!r}; "
                            f"labels in use: {', '.join(sorted(everywhere))}")
    for name, p in profiles.items():
        own = p["cross"].get("decoder_config", {})
        for key in own:
            if key not in used[name]:
                raise UserError(f"config profiles/{name}/cross/decoder_config/{key}: no group of profile "
                                f"{name!r} runs {key!r}; labels in use: {', '.join(sorted(used[name]))}")
        check_bench_subsets(name, p)
        for place, labels in label_lists(p).items():
            for label in labels:
                where = f"config profiles/{name}/{place}"
                decoder = label.split("@")[0]
                if DECODER_NAMES is not None and decoder not in DECODER_NAMES:
                    raise UserError(f"{where}: unknown decoder {decoder!r} in {label!r}; "
                                    f"valid: {', '.join(sorted(DECODER_NAMES))}")
                if "@" in label and label not in own and label not in shared:
                    raise UserError(f"{where}: label {label!r} has no decoder_config entry "
                                    "(a variant label names its options there)")


def check_bench_subsets(name: str, profile_raw: Mapping) -> None:
    """Raise UserError where a section's ``bench/decoders_by_dataset`` names a dataset the
    benchmark does not run or a decoder outside its ``decoders`` (the rule's inputs and options
    come from ``decoders``, so a subset is all a dataset may narrow it to), or its
    ``figure_datasets`` names a dataset the benchmark does not run."""
    for sec_name, sec in profile_raw.items():
        bench = sec.get("bench") if isinstance(sec, Mapping) else None
        if not isinstance(bench, Mapping):
            continue
        for ds, labels in (bench.get("decoders_by_dataset") or {}).items():
            where = f"config profiles/{name}/{sec_name}/bench/decoders_by_dataset/{ds}"
            if ds not in bench["datasets"]:
                raise UserError(f"{where}: the benchmark runs no dataset {ds!r}; valid: {', '.join(bench['datasets'])}")
            extra = [l for l in labels if l not in bench["decoders"]]
            if extra:
                raise UserError(f"{where}: {', '.join(extra)} not among the benchmark's decoders; "
                                f"valid: {', '.join(bench['decoders'])}")
        for art, datasets in (sec.get("figure_datasets") or {}).items():
            unknown = [d for d in datasets if d not in bench["datasets"]]
            if unknown:  # the artifact would wait on a benchmark no rule runs
                raise UserError(f"config profiles/{name}/{sec_name}/figure_datasets/{art}: the benchmark runs no "
                                f"dataset {', '.join(unknown)}; valid: {', '.join(bench['datasets'])}")


def bench_decoders(bench: Mapping, dataset: str) -> list[str]:
    """The decoder labels a section's benchmark runs on ``dataset`` (``decoders_by_dataset``'s
    subset where it names the dataset, else every decoder), in ``decoders``' order."""
    subset = (bench.get("decoders_by_dataset") or {}).get(dataset)
    return [d for d in bench["decoders"] if subset is None or d in subset]


def _merged(base: Mapping, own: Mapping, replace: set[str], path: str = "") -> dict:
    """``base`` with ``own`` on top: mappings merge key by key, except at a path in ``replace``;
    any other value (a list, a number, a string, null) replaces the base's."""
    out = dict(base)
    for key, value in own.items():
        where = f"{path}{key}"
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and where not in replace:
            out[key] = _merged(out[key], value, replace, f"{where}/")
        else:
            out[key] = value
    return out


def resolve_profiles(config: dict) -> dict:
    """``config`` with each profile's ``extends`` resolved (a new dict; ``config`` is untouched).

    A profile that ``extends`` another is that profile's settings (resolved first, so bases
    chain) with its own merged on top: mappings key by key, any other value replacing the
    base's; a mapping whose path (``cross/groups``) is in the profile's ``replace``
    list is the profile's own, not merged, so a smaller profile drops what it does not run. So a
    profile states only how it differs (paper-tiny: the paper profile on tiny stand-ins).
    UserError for an unknown base, a cycle, or a ``replace`` path the profile does not set.
    """
    profiles = config.get("profiles")
    if not isinstance(profiles, Mapping):
        return config  # the schema names what is missing
    done: dict[str, dict] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> dict:
        if name in done:
            return done[name]
        own = profiles[name]
        base = own.get("extends") if isinstance(own, Mapping) else None
        if base is None:
            done[name] = own
            return own
        where = f"config profiles/{name}/extends"
        if base not in profiles:
            raise unknown(f"profile (in {where})", base, profiles)
        if base in chain:
            raise UserError(f"{where}: profiles extend each other in a cycle ({' -> '.join((*chain, base))}); "
                            "valid: a chain that ends in a profile without extends")
        replace = set(own.get("replace", []))
        for path in replace:  # a replace path the profile does not set would silently merge nothing
            node = own
            for part in path.split("/"):
                node = node.get(part) if isinstance(node, Mapping) else None
            if not isinstance(node, Mapping):
                raise UserError(f"config profiles/{name}/replace: {path!r} is not a mapping the profile sets; "
                                "valid: the path of a mapping under the profile (section/key)")
        mine = {k: v for k, v in own.items() if k not in ("extends", "replace")}
        done[name] = _merged(resolve(base, (*chain, base)), mine, replace)
        return done[name]

    return {**config, "profiles": {name: resolve(name, (name,)) for name in profiles}}


def read_profiles(folder: Path = PROFILES_DIR) -> dict:
    """Every profile as written (``extends`` unresolved): ``{name: mapping}`` from ``<name>.yaml``."""
    return {f.stem: yaml.safe_load(f.read_text()) for f in sorted(folder.glob("*.yaml"))}


def read_config(config_dir: Path = CONFIG_DIR) -> dict:
    """The config as written: ``config.yaml`` with ``profiles`` read from ``profiles/*.yaml``."""
    config = yaml.safe_load((config_dir / "config.yaml").read_text())
    return {**config, "profiles": read_profiles(config_dir / "profiles")}


def with_profile_files(config: Mapping) -> dict:
    """Snakemake's ``config`` (``config.yaml``, then ``--configfile`` / ``--config`` on top) over the
    profile files: a ``profiles`` mapping in it overrides theirs key by key, so an extra
    ``--configfile`` can change one setting of one profile."""
    return {**config, "profiles": _merged(read_profiles(), config.get("profiles") or {}, set())}


def load_config(config: dict | None = None) -> dict:
    """The validated config, every profile's ``extends`` resolved: ``config`` as given (default:
    :func:`read_config`; the Snakefile's goes through :func:`with_profile_files` first)."""
    if config is None:
        config = read_config()
    config = resolve_profiles(config)
    validate(config)
    return config


def load_profile(config: dict | None = None, profile: str | None = None) -> Profile:
    """Validate ``config`` (default: :func:`read_config`) and return the named profile.

    The top-level ``decoder_config`` holds the options every profile shares; a profile's own
    ``cross.decoder_config`` adds labels or overrides them.
    """
    config = load_config(config)
    name = profile or config["profile"]
    if name not in config["profiles"]:
        raise unknown("profile", name, config["profiles"])
    p = config["profiles"][name]
    c = p["cross"]
    dcfg = {**config.get("decoder_config", {}), **c.get("decoder_config", {})}
    return Profile(name=name, results_root=p["results_root"], offline=p["offline"], model=p["model"],
                   device=p["device"], dtype=p["dtype"], threads=p["threads"],
                   cross=BenchConfig(c["dataset"], c["n"], c["max_new_tokens"], c["max_prompt_tokens"],
                                     MappingProxyType({g: tuple(d) for g, d in c["groups"].items()}),
                                     MappingProxyType(dcfg)),
                   raw=MappingProxyType(p), resource_class=MappingProxyType(resource_class_of(config)))


def load_artifacts() -> dict:
    """Artifact registry (config/artifacts.yaml): id -> package, notebook, inputs, outputs."""
    return yaml.safe_load((CONFIG_DIR / "artifacts.yaml").read_text())


def group_config(profile: Profile, group: str) -> dict:
    """Options of one benchmark group's decoder labels (labels without options left out)."""
    return labels_config(profile, profile.cross.groups[group])


def placeholder(value) -> str | None:
    """The name in a decoder option value that is exactly ``"{name}"`` (a trained component the
    workflow puts the folder of); None for any other value."""
    if isinstance(value, str) and re.fullmatch(r"\{\w+\}", value):
        return value[1:-1]
    return None


def component_ref(value) -> str | None:
    """The cross component (:data:`COMPONENTS`) a decoder option value names, else None."""
    name = placeholder(value)
    return name if name in COMPONENTS else None


def cross_components(profile: Profile) -> list[str]:
    """The trained components (``medusa``, ``draft``) that some benchmark group's options name
    (:func:`component_ref`), in :data:`COMPONENTS` order."""
    named = {component_ref(v) for g in profile.cross.groups for opts in group_config(profile, g).values()
             for v in opts.values()}
    return [c for c in COMPONENTS if c in named]


def cross_joins(profile: Profile) -> dict[str, dict]:
    """The paper sections whose own benchmark run joins ``cross.table`` (config ``cross.joins``):
    section -> ``{record, stats, decoders}``, paths under the results root."""
    return {s: dict(j) for s, j in profile.raw["cross"].get("joins", {}).items()}


def cross_joined(profile: Profile) -> list[str]:
    """The files the joins add to ``cross.table``'s inputs: each run's record and its component's stats."""
    return [f for j in cross_joins(profile).values() for f in (j["record"], j["stats"])]


def study_section(profile: Profile) -> Mapping:
    """The profile's cross-method study (config ``study``: ``bench`` and ``stats``)."""
    if "study" not in profile.raw:
        raise UserError(f"profile {profile.name!r} has no study section in config/profiles/{profile.name}.yaml")
    return profile.raw["study"]


def study_labels(profile: Profile) -> list[str]:
    """Every label a study run records: its decoders, then the A/A pair (``study_bench`` runs ``--aa``)."""
    return [*study_section(profile)["bench"]["decoders"], AA_LABEL]


def study_stats(profile: Profile) -> list[str]:
    """The training records (paths under the results root) of the trained components the
    study's decoders name (a ``"{name}"`` option value), in the order the decoders name them;
    a component without an entry in ``study.stats`` is one error, so no cost goes missing."""
    study = study_section(profile)
    named = []
    for label, opts in labels_config(profile, study["bench"]["decoders"]).items():
        for v in opts.values():
            if placeholder(v) and placeholder(v) not in named:
                named.append(placeholder(v))
    missing = [n for n in named if n not in study["stats"]]
    if missing:
        raise UserError(f"config profiles/{profile.name}/study/stats: no training record for {', '.join(missing)} "
                        f"(named by the study's decoders); valid: a path under the results root for each of "
                        f"{', '.join(named)}")
    return [study["stats"][n] for n in named]


def kept_cost_curves(profile: Profile) -> list[str]:
    """The hosts whose cost curves are kept under ``<results root>/cross/raw/cost_curves/`` (file
    stems), for ``{kept_cost_curves}``: ``cost_curve`` measures the host it runs on, and a
    benchmark record is read against its own host's curve, so the curves of the hosts earlier
    records ran on are kept beside it (``tools/cost_curves.py keep``). Committed records, listed
    as they are on disk: none in a fresh results root."""
    return sorted(p.stem for p in (Path(profile.results_root) / "cross" / "raw" / "cost_curves").glob("*.jsonl"))


# artifact-pattern names computed from the config rather than read at a dotted path
_COMPUTED = {"cross_components": cross_components, "cross_joined": cross_joined, "study_labels": study_labels,
             "study_stats": study_stats, "kept_cost_curves": kept_cost_curves}


def _values(profile: Profile, path: str) -> list[str]:
    """What ``{path}`` in an artifact pattern expands to: the items of a list or the keys of a
    mapping at that dotted path of the profile's config, or a name of :data:`_COMPUTED`."""
    if path in _COMPUTED:
        return _COMPUTED[path](profile)
    # "{?a.b}": "" when the profile sets a.b (to anything but null), else the input is left out
    optional = path.startswith("?")
    node = profile.raw
    for part in path.removeprefix("?").split("."):
        if not isinstance(node, Mapping) or part not in node:
            if optional:
                return []
            raise UserError(f"config/artifacts.yaml: '{{{path}}}' names nothing in profile {profile.name!r}")
        node = node[part]
    if optional:
        return [] if node is None else [""]
    return [str(v) for v in node]


def artifact_inputs(profile: Profile, aid: str, artifacts: dict | None = None) -> list[str]:
    """The raw records artifact ``aid`` reads, under the profile's results root.

    Each ``{dotted.path}`` in an input pattern expands over the config's values there, so the
    list follows the config (a group added to ``cross.groups`` adds its records); an input with
    ``{?dotted.path}`` is declared only where the profile sets that key to something other
    than null (a component some profiles train, e.g. a paper package's ``small_layers``: null
    means released models, none trained).
    """
    artifacts = artifacts if artifacts is not None else load_artifacts()
    if aid not in artifacts:
        raise unknown("artifact", aid, artifacts)
    return [f"{profile.results_root}/{p}" for pattern in artifacts[aid]["inputs"] for p in _expand(profile, pattern)]


def _expand(profile: Profile, pattern: str) -> list[str]:
    """Every path of an artifact pattern, each ``{name}`` in it replaced by its :func:`_values`."""
    keys = re.findall(r"\{(\??[\w.]+)\}", pattern)
    out = []
    for combo in itertools.product(*(_values(profile, k) for k in keys)):
        path = pattern
        for k, v in zip(keys, combo):
            path = path.replace("{" + k + "}", v, 1)
        out.append(path)
    return out


def artifact_outputs(profile: Profile, aid: str, artifacts: dict | None = None) -> list[str]:
    """Files artifact ``aid`` writes: the executed notebook first, then tables, figure and the
    files its ``exports`` patterns name (under the package's folder, e.g. the Spec-Bench export)."""
    spec = (artifacts if artifacts is not None else load_artifacts())[aid]
    base = f"{profile.results_root}/{spec['package']}"
    out = [f"{base}/notebooks/{aid}.ipynb"]
    if "table" in spec["outputs"]:
        out += [f"{base}/tables/{aid}.md", f"{base}/tables/{aid}.csv"]
    if "figure" in spec["outputs"]:
        out += [f"{base}/figures/{aid}.png"]
    return out + [f"{base}/{p}" for pattern in spec.get("exports", []) for p in _expand(profile, pattern)]


# ------------------------------------------------ the notebook side of the artifact contract

def check_inputs(paths: list[str]) -> list[str]:
    """Raise UserError naming the first declared raw record that is missing, empty or
    truncated (a JSONL file must end with a newline; a JSON file must parse)."""
    for p in map(Path, paths):
        if not p.is_file() or p.stat().st_size == 0:
            raise UserError(f"declared input {str(p)!r} is missing or empty")
        text = p.read_text()
        try:
            if p.suffix == ".jsonl":
                if not text.endswith("\n"):
                    raise ValueError("no newline at the end")
                for line in filter(str.strip, text.splitlines()):
                    json.loads(line)
            elif p.suffix == ".json":
                json.loads(text)
        except ValueError as e:
            raise UserError(f"declared input {str(p)!r} is truncated or corrupt ({e})") from None
    return [str(p) for p in paths]


class Staged:
    """Tables and figures of one render, written under a temporary folder and moved into
    place together by :meth:`publish` (the notebook's last step), so a render that fails
    midway leaves the committed files as they were."""

    def __init__(self, final_dirs: dict[str, Path]):
        self.final = {k: Path(v) for k, v in final_dirs.items()}   # kind ('tables', 'figures') -> folder
        root = Path(next(iter(self.final.values()))).parent
        root.mkdir(parents=True, exist_ok=True)
        # Beside the final folders, so that os.replace stays on one file system; removed when
        # the process ends, so a failed render leaves nothing behind either.
        self.tmp = Path(tempfile.mkdtemp(prefix=".render-", dir=root))
        atexit.register(shutil.rmtree, self.tmp, True)

    def dir(self, kind: str) -> Path:
        """The staging folder for ``kind``; files written there are published under its final folder."""
        d = self.tmp / kind
        d.mkdir(exist_ok=True)
        return d

    def publish(self) -> list[str]:
        """Move every staged file to its final folder (os.replace: atomic per file)."""
        done = []
        for kind, final in self.final.items():
            for f in sorted((self.tmp / kind).glob("*")) if (self.tmp / kind).is_dir() else []:
                final.mkdir(parents=True, exist_ok=True)
                os.replace(f, final / f.name)
                done.append(str(final / f.name))
        shutil.rmtree(self.tmp, ignore_errors=True)
        return done


def section(profile: Profile, name: str, build):
    """A paper package's section of a profile (``profile.raw[name]``) through its
    ``build(mapping)``; a missing section or a key the builder does not take is one error."""
    if name not in profile.raw:
        raise UserError(f"profile {profile.name!r} has no {name} section in config/profiles/{profile.name}.yaml")
    try:
        return build(profile.raw[name])
    except TypeError as e:  # unknown/missing keys when built outside the schema
        raise UserError(f"{name} config of profile {profile.name!r}: {e}") from None
