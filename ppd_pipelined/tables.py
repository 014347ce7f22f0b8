"""What the ``ppdp.*`` notebooks share: their inputs, provenance, match-rate frames, the
paper's reported numbers and the one-line trend statements that compare the two.

Notebooks (notebooks/src/ppdp_*.py) stay narrative plus the computation of one artifact;
everything two of them need lives here. They read exactly the raw records their artifact
declares (:func:`common.config.artifact_inputs`) and publish tables and figures atomically
(:class:`common.config.Staged`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

import pandas as pd
import yaml

from common.config import Staged, artifact_inputs, check_inputs, load_profile
from common.records import read_jsonl
from common.report import write_table

from .config import from_profile

LABEL = {"squad": "SQuAD 1.1", "wmt": "WMT EN-FR", "cnn_dm": "CNN/DM"}
PAPER_NUMBERS = Path(__file__).with_name("paper_numbers.yaml")


def paper_numbers(key: str) -> dict:
    """One table's entry of ppd_pipelined/paper_numbers.yaml (numbers plus the citation)."""
    return yaml.safe_load(PAPER_NUMBERS.read_text())[key]


class Render:
    """One artifact's render: its declared inputs (checked), its config, its staged outputs."""

    def __init__(self, artifact_id: str, results_root: str, package: str, profile: str,
                 inputs: list[str] | None = None):
        self.artifact_id, self.profile_name = artifact_id, profile
        prof = load_profile(None, profile)
        if inputs is None:  # run by hand: the same list the rule declares, for this results root
            prof = dataclasses.replace(prof, results_root=results_root)
            inputs = artifact_inputs(prof, artifact_id)
        self.inputs = check_inputs(list(inputs))
        self.cfg = from_profile(prof)
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

    def save_table(self, df: pd.DataFrame, meta: dict) -> None:
        """Stage ``tables/<id>.{md,csv}`` (published by :meth:`publish`) and print the markdown."""
        write_table(df, self.artifact_id, self.staged.dir("tables"), {"artifact": self.artifact_id, **meta})
        print((self.staged.dir("tables") / f"{self.artifact_id}.md").read_text())

    def save_figure(self, fig) -> None:
        fig.savefig(self.staged.dir("figures") / f"{self.artifact_id}.png", dpi=120, bbox_inches="tight")

    def publish(self) -> None:
        """The notebook's last step: move the staged table and figure into place."""
        for f in self.staged.publish():
            print("wrote", f)


def data_note(recs: Iterable[dict], tasks: Iterable[str]) -> str:
    """'SQuAD 1.1: mt-bench (offline stand-in ...)' per task, from the records themselves."""
    seen = {}
    for r in recs:
        t = r.get("task") or r.get("category")
        seen[t] = f"{LABEL.get(t, t)}: {r.get('dataset')}" + (
            " (offline stand-in for the paper's set)" if r.get("stand_in") else "")
    return "; ".join(seen[t] for t in tasks if t in seen)


def provenance(recs: list[dict], sources: Iterable[str], tasks: Iterable[str], **extra) -> dict:
    """Model, profile, hardware, dtype and data named by the records, then ``extra`` and the sources."""
    meta = {}
    for label, k in {"model": "model", "profile": "profile", "hardware": "device", "dtype": "dtype"}.items():
        vals = sorted({str(r[k]) for r in recs if k in r})
        if vals:
            meta[label] = ", ".join(vals)
    meta["data"] = data_note(recs, tasks)
    meta.update(extra)
    meta["sources"] = ", ".join(sources)
    return meta


def ranks_frame(recs: list[dict]) -> pd.DataFrame:
    """One row per (record, classifier, layer, generated position): the chosen token's early rank."""
    rows = []
    for i, r in enumerate(recs):
        for c, by_layer in r["early"].items():
            for layer, v in by_layer.items():
                for pos, rank in enumerate(v["rank"]):
                    rows.append((r["task"], r.get("method", "greedy"), i, c, int(layer), pos, rank))
    return pd.DataFrame(rows, columns=["task", "method", "rec", "classifier", "layer", "pos", "rank"])


def pct(x) -> float:
    return round(100 * float(x), 2)


