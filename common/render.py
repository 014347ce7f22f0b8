"""What every artifact notebook does around its own computation: read exactly the raw records
its rule declares, stage its tables and figure, publish them atomically at the end, and put the
paper's reported numbers beside ours.

    R = Render(artifact_id, results_root, package, profile, inputs)   # papermill's parameters
    ...                                                               # the artifact's own cells
    R.save_table(df, meta); R.save_figure(fig); R.publish()
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import pandas as pd
import yaml

from .config import Profile, Staged, artifact_inputs, check_inputs, load_profile
from .records import read_jsonl
from .report import write_table

REPO = Path(__file__).resolve().parent.parent


def paper_numbers(package: str) -> dict:
    """A paper package's ``paper_numbers.yaml``: its reported numbers and claims, each citing
    the table or figure they come from."""
    return yaml.safe_load((REPO / package / "paper_numbers.yaml").read_text())


class Render:
    """One artifact's render: its declared inputs (checked), its profile (and the package's
    config of it, through ``build_cfg``), its staged outputs."""

    def __init__(self, artifact_id: str, results_root: str, package: str, profile: str,
                 inputs: list[str] | None = None, build_cfg: Callable[[Profile], object] | None = None):
        self.artifact_id, self.profile_name = artifact_id, profile
        prof = load_profile(None, profile)
        if inputs is None:  # run by hand: the same list the rule declares, for this results root
            prof = dataclasses.replace(prof, results_root=results_root)
            inputs = artifact_inputs(prof, artifact_id)
        self.inputs = check_inputs(list(inputs))
        self.profile = prof
        self.cfg = build_cfg(prof) if build_cfg is not None else None
        base = Path(results_root) / package
        self.staged = Staged({"tables": base / "tables", "figures": base / "figures"})

    def path(self, name: str) -> str:
        """The declared input whose file name is ``name`` (an undeclared name is an error)."""
        hits = [p for p in self.inputs if Path(p).name == name]
        if not hits:
            raise FileNotFoundError(f"{name} is not among {self.artifact_id}'s declared inputs {self.inputs}")
        return hits[0]

    def records(self, prefix: str) -> tuple[list[dict], list[str]]:
        """Every record of the declared JSONL inputs named ``<prefix>*.jsonl``, and their paths."""
        paths = [p for p in self.inputs if Path(p).name.startswith(prefix) and p.endswith(".jsonl")]
        return [r for p in paths for r in read_jsonl(p)], paths

    def runs(self, prefix: str = "bench_") -> dict[str, list[dict]]:
        """The records of each declared ``<prefix><name>.jsonl`` input, by ``name`` (one
        benchmark run per dataset, one training curve per variant)."""
        return {Path(p).name.removeprefix(prefix).removesuffix(".jsonl"): read_jsonl(p)
                for p in self.inputs if Path(p).name.startswith(prefix) and p.endswith(".jsonl")}

    def find(self, suffix: str, required: bool = True):
        """The declared input whose path ends with ``suffix``, read (JSON or JSONL); None when
        it is optional and not declared (a component this profile does not train)."""
        hits = [p for p in self.inputs if p.endswith(suffix)]
        if not hits:
            if required:
                raise FileNotFoundError(f"no input ending with {suffix} among {self.artifact_id}'s {self.inputs}")
            return None
        return read_jsonl(hits[0]) if hits[0].endswith(".jsonl") else json.loads(Path(hits[0]).read_text())

    def save_table(self, df: pd.DataFrame, meta: dict, floatfmt: str = ".3f") -> None:
        """Stage ``tables/<id>.{md,csv}`` (published by :meth:`publish`) and print the markdown."""
        write_table(df, self.artifact_id, self.staged.dir("tables"), {"artifact": self.artifact_id, **meta}, floatfmt)
        print((self.staged.dir("tables") / f"{self.artifact_id}.md").read_text())

    def save_figure(self, fig) -> None:
        fig.savefig(self.staged.dir("figures") / f"{self.artifact_id}.png", dpi=120, bbox_inches="tight")

    def publish(self) -> None:
        """The notebook's last step: move the staged tables and figure into place."""
        for f in self.staged.publish():
            print("wrote", f)
