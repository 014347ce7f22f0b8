"""What the ``ppdp.*`` notebooks share: their inputs, provenance, match-rate frames, the
paper's reported numbers and the one-line trend statements that compare the two.

Notebooks (notebooks/src/ppdp_*.py) stay narrative plus the computation of one artifact;
everything two of them need lives here. They read exactly the raw records their artifact
declares (:func:`common.config.artifact_inputs`) and publish tables and figures atomically
(:class:`common.config.Staged`).
"""
from __future__ import annotations

from typing import Iterable

import pandas as pd

from common.harness.render import Render as _Render, paper_numbers as _paper_numbers

from .config import from_profile

LABEL = {"squad": "SQuAD 1.1", "wmt": "WMT EN-FR", "cnn_dm": "CNN/DM"}


def paper_numbers(key: str) -> dict:
    """One table's entry of ppd_pipelined/paper_numbers.yaml (numbers plus the citation)."""
    return _paper_numbers("ppd_pipelined")[key]


class Render(_Render):
    """One ``ppdp.*`` render (:class:`common.harness.render.Render`) with PPD's config as ``cfg``."""

    def __init__(self, artifact_id: str, results_root: str, package: str, profile: str,
                 inputs: list[str] | None = None):
        super().__init__(artifact_id, results_root, package, profile, inputs, build_cfg=from_profile)


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


