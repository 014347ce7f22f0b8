"""The one config path: ``config/config.yaml`` (what every profile shares) and one file per profile
(``config/profiles/<name>.yaml``) -> each profile's ``extends`` resolved -> JSON-schema validation
-> frozen dataclass.

The Snakefile, every CLI and every notebook load profiles through :func:`load_profile`, so a
typo in the config or an unknown profile fails once, in one line, before any rule runs.
What the workflow derives from a profile lives in :mod:`common.workflow`: each rule's
reservation (:mod:`common.workflow.resources`) and each artifact's raw records and outputs
(:mod:`common.workflow.artifacts`).
"""
from __future__ import annotations

import ast
import re
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


def resource_class_of(config: dict) -> dict:
    """``{rule: class}`` from the top-level ``resource_classes``; UserError for a rule in two
    classes or an override naming a rule in none (a typo would otherwise be ignored). Part of
    loading, so a bad class fails every entry point; what a rule reserves from it:
    :func:`common.workflow.resources.rule_resources`."""
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
    (``cross/groups/<group>``), each paper section's benchmark (``<section>/bench/decoders``) and
    the study's ``pending`` labels (``study/pending``: measured by the final one-host study, run
    by no rule yet; listed so their names and decoder_config entries are checked now)."""
    out = {f"cross/groups/{g}": list(ls) for g, ls in profile_raw["cross"]["groups"].items()}
    for name, sec in profile_raw.items():
        bench = sec.get("bench") if isinstance(sec, Mapping) else None
        if isinstance(bench, Mapping) and "decoders" in bench:
            out[f"{name}/bench/decoders"] = list(bench["decoders"])
    pending = (profile_raw.get("study") or {}).get("pending")
    if pending:
        out["study/pending"] = list(pending)
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


def group_config(profile: Profile, group: str) -> dict:
    """Options of one benchmark group's decoder labels (labels without options left out)."""
    return labels_config(profile, profile.cross.groups[group])


def placeholder(value) -> str | None:
    """The name in a decoder option value that is exactly ``"{name}"`` (a trained component the
    workflow puts the folder of); None for any other value."""
    if isinstance(value, str) and re.fullmatch(r"\{\w+\}", value):
        return value[1:-1]
    return None


# Placeholders that name a measured result, not a trained component: the file under the results
# root the workflow puts in their place (and waits for). A pool's ``cost`` names this host's cost
# curve so its cut follows the machine it runs on.
RESULT_PLACEHOLDERS = {"cost_curve": "cross/raw/cost_curve.jsonl"}


def placeholders(value) -> list[str]:
    """Every component name ``"{name}"`` in a decoder option value, nested lists and mappings
    included (a pool's ``sources`` name their heads inside), in order, each once; the names of
    :data:`RESULT_PLACEHOLDERS` are results, not components, and left out."""
    if isinstance(value, Mapping):
        found = [n for v in value.values() for n in placeholders(v)]
    elif isinstance(value, (list, tuple)):
        found = [n for v in value for n in placeholders(v)]
    else:
        found = [placeholder(value)] if placeholder(value) not in (None, *RESULT_PLACEHOLDERS) else []
    return list(dict.fromkeys(found))


def section(profile: Profile, name: str, build):
    """A paper package's section of a profile (``profile.raw[name]``) through its
    ``build(mapping)``; a missing section or a key the builder does not take is one error."""
    if name not in profile.raw:
        raise UserError(f"profile {profile.name!r} has no {name} section in config/profiles/{profile.name}.yaml")
    try:
        return build(profile.raw[name])
    except TypeError as e:  # unknown/missing keys when built outside the schema
        raise UserError(f"{name} config of profile {profile.name!r}: {e}") from None
