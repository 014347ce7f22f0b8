"""The one config path: ``config/config.yaml`` -> JSON-schema validation -> frozen dataclass.

The Snakefile and every CLI load profiles through :func:`load_profile`, so a typo in the
config or an unknown profile fails once, in one line, before any rule runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import jsonschema
import yaml

from .errors import UserError, unknown

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"


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


def validate(config: dict, schema_path: Path = CONFIG_DIR / "schema.yaml") -> None:
    """Raise UserError naming the first schema violation (path and message)."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(map(str, e.absolute_path)) or "<top>"
        hint = f" ({e.schema['description']})" if isinstance(e.schema, dict) and "description" in e.schema else ""
        raise UserError(f"config invalid at {where}: {e.message}{hint}") from None


def load_profile(config: dict | None = None, profile: str | None = None) -> Profile:
    """Validate ``config`` (default: config/config.yaml) and return the named profile."""
    if config is None:
        config = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())
    validate(config)
    name = profile or config["profile"]
    if name not in config["profiles"]:
        raise unknown("profile", name, config["profiles"])
    p = config["profiles"][name]
    c = p["cross"]
    return Profile(name=name, results_root=p["results_root"], offline=p["offline"], model=p["model"],
                   device=p["device"], dtype=p["dtype"], threads=p["threads"],
                   cross=BenchConfig(c["dataset"], c["n"], c["max_new_tokens"], c["max_prompt_tokens"],
                                     MappingProxyType({g: tuple(d) for g, d in c["groups"].items()}),
                                     MappingProxyType(c.get("decoder_config", {}))),
                   raw=MappingProxyType(p))


def load_artifacts() -> dict:
    """Artifact registry (config/artifacts.yaml): id -> package, notebook, inputs, outputs."""
    return yaml.safe_load((CONFIG_DIR / "artifacts.yaml").read_text())
