"""The artifact contract: which raw records each artifact reads and which files it writes
(config/artifacts.yaml expanded over a profile), and the notebooks' side of it (the declared
inputs checked before reading, tables and figures published together).

:func:`artifact_inputs` is the one list of raw records an artifact reads: the rules declare it
and the notebooks read exactly it.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

import yaml

from ..config import AA_LABEL, CONFIG_DIR, Profile, group_config, labels_config, placeholders
from ..errors import UserError, unknown

# Trained components a decoder option may name, and the statistics file each training writes.
COMPONENTS = ("medusa", "draft", "eagle", "eagle3")
# The sharded corpora (rules corpus_shards, corpus_turns) by the name a recipe's ``corpus`` gives them,
# and their folders under the results root (``<name>`` the profile's).
CORPORA = {"shards": ("corpus_shards", "corpus/{profile}"), "turns": ("corpus_turns", "corpus/{profile}-turns")}


def corpus_folder(profile: Profile, corpus: str) -> str:
    """The results-root-relative folder of the sharded corpus ``corpus`` (a key of :data:`CORPORA`)."""
    if corpus not in CORPORA:
        raise UserError(f"corpus {corpus!r} is unknown; valid: {', '.join(CORPORA)}")
    rule, folder = CORPORA[corpus]
    if rule not in profile.raw["components"]:
        raise UserError(f"profile {profile.name!r} names corpus {corpus!r} but has no components.{rule}; "
                        f"valid: add components.{rule}, or train on another corpus")
    return folder.format(profile=profile.name)


def eagle3_recipes(profile: Profile) -> dict[str, dict]:
    """Every EAGLE-3 head the profile trains, name -> recipe: ``eagle3`` (``components.eagle3``)
    and each of ``components.eagle3_variants`` (that recipe with the variant's changes: the
    ablation's heads, each its own component ``"{name}"``). ``corpus`` defaults to ``shards``."""
    c = profile.raw["components"]
    if "eagle3" not in c:
        return {}
    base = {"corpus": "shards", **c["eagle3"]}
    return {"eagle3": base, **{name: {**base, **v} for name, v in (c.get("eagle3_variants") or {}).items()}}


def component_names(profile: Profile) -> tuple[str, ...]:
    """:data:`COMPONENTS` and the profile's EAGLE-3 variants, in that order."""
    return (*COMPONENTS, *(n for n in eagle3_recipes(profile) if n not in COMPONENTS))


def load_artifacts() -> dict:
    """Artifact registry (config/artifacts.yaml): id -> package, notebook, inputs, outputs."""
    return yaml.safe_load((CONFIG_DIR / "artifacts.yaml").read_text())


def cross_components(profile: Profile) -> list[str]:
    """The trained components (``medusa``, ``draft``, ...) that some benchmark group's options
    name (a ``"{name}"`` value, nested ones included), in :func:`component_names` order."""
    named = {n for g in profile.cross.groups for opts in group_config(profile, g).values()
             for n in placeholders(opts)}
    return [c for c in component_names(profile) if c in named]


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
        for n in placeholders(opts):
            if n not in named:
                named.append(n)
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


def sampling_parts(profile: Profile) -> list[str]:
    """The exact-distribution check's parts, for ``{sampling_parts}`` (rule ``sampling_part``, one
    record each under ``cross/raw/sampling/``): the negative controls, then each decoder of the
    profile's ``sampling_report.decoders``; none without that section."""
    section = profile.raw.get("sampling_report")
    return ["controls", *section["decoders"]] if section else []


# artifact-pattern names computed from the config rather than read at a dotted path
_COMPUTED = {"cross_components": cross_components, "cross_joined": cross_joined, "study_labels": study_labels,
             "study_stats": study_stats, "kept_cost_curves": kept_cost_curves, "sampling_parts": sampling_parts}


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



def missing_records(paths: list[str], shown: int = 3, width: int = 150) -> str:
    """The declared raw records not on disk, said in a few words for one error line: the first
    of them (at most ``shown``, within about ``width`` characters, at least one), how many more
    and of how many (``""`` when none is missing)."""
    missing = [p for p in paths if not Path(p).is_file()]
    if not missing:
        return ""
    named = missing[:1]
    for p in missing[1:shown]:
        if len(", ".join([*named, p])) > width:
            break
        named.append(p)
    more = f" and {len(missing) - len(named)} more" if len(missing) > len(named) else ""
    return f"{', '.join(named)}{more} ({len(missing)} of {len(paths)})"


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

