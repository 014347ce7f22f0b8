"""The hardware's cost curve read back: ``q -> T(q) / T(1)``, the time of one verification
forward of ``q`` positions over that of one, on the host that measured it.

:mod:`common.harness.cost_curve` measures it (rule ``cost_curve``: ``cross/raw/cost_curve.jsonl``,
the latest host it ran on; ``tools/cost_curves.py keep`` keeps earlier hosts' curves under
``cross/raw/cost_curves/``). The tables' limit columns, prompt decoding's hardware-aware tree and
the pool's cut read it through here, always one host's curve: a curve of other hardware is an
error, never silently applied.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .records import read_jsonl


def cost_curve_paths(inputs: Iterable[str | Path]) -> list[Path]:
    """The cost-curve files among an artifact's declared inputs, the rule's own first: the
    ``cost_curve`` rule's ``cross/raw/cost_curve.jsonl`` (the latest host it ran on), then the
    curves kept from other hosts under ``cross/raw/cost_curves/`` (``tools/cost_curves.py keep``)."""
    paths = [Path(p) for p in inputs]
    return ([p for p in paths if p.name == "cost_curve.jsonl"]
            + sorted(p for p in paths if p.parent.name == "cost_curves" and p.suffix == ".jsonl"))


def read_cost_curves(inputs: Iterable[str | Path]) -> list[dict]:
    """The records of every cost-curve file among ``inputs`` (:func:`cost_curve_paths`) as one list
    holding one curve per device (:func:`merge_curves`)."""
    return merge_curves(cost_curve_paths(inputs))


def merge_curves(paths: Iterable[Path]) -> list[dict]:
    """The records of the cost-curve files ``paths`` as one list holding one curve per device: a
    device's records come from the first file that has it (the rule's latest measurement before
    the kept copies), so a kept copy never doubles a host's points."""
    out: list[dict] = []
    seen: set[str] = set()
    for p in paths:
        recs = read_jsonl(p, "write it with python -m common.harness.cost_curve")
        out += [r for r in recs if r.get("device") not in seen]
        seen |= {r.get("device") for r in recs}
    return out


def host_curve(curve: list[dict], device: str) -> list[dict]:
    """The records of ``curve`` measured on ``device``: a ValueError where there are none (T(q) is
    the machine's own, never another's)."""
    own = [r for r in curve if r.get("device") == device]
    if not own:
        raise ValueError(f"the cost curve was measured on {sorted({r.get('device') for r in curve})}, "
                         f"not on {device!r} where the records were: rerun the cost curve there")
    return own


def cost_of(curve: list[dict], forward_path: str = "fast", device: str | None = None):
    """``q -> T(q) / T(1)`` from :mod:`common.harness.cost_curve` records of one forward path: linear in
    ``q`` between measured points (beyond the last, along the last segment).

    ``device``: the hardware the curve must have been measured on (the benchmark records' own
    ``device``); only that device's records are read (``curve`` may hold several hosts' curves),
    and a curve of other hardware is a ValueError, never silently applied. Without ``device``
    the records must be one device's."""
    if device is not None:
        curve = host_curve(curve, device)
    elif len({r.get("device") for r in curve}) > 1:
        raise ValueError(f"cost curves of several devices ({sorted({str(r.get('device')) for r in curve})}): "
                         "name the device whose curve applies")
    pts = sorted((int(r["q"]), float(r["ms"])) for r in curve if r.get("forward_path", "stock") == forward_path)
    if not pts or pts[0][0] != 1:
        raise ValueError(f"the cost curve has no q=1 record for forward path {forward_path!r}")
    t1 = pts[0][1]

    def ratio(q: float) -> float:
        if len(pts) == 1:
            return 1.0
        for (qa, ta), (qb, tb) in zip(pts, pts[1:]):
            if q <= qb or (qb, tb) == pts[-1]:
                return (ta + (q - qa) * (tb - ta) / (qb - qa)) / t1
        raise AssertionError
    return ratio


def curve_fits(curve: list[dict], device: str) -> bool:
    """Whether the cost curve was measured on ``device`` (a record's ``device`` string)."""
    return any(r.get("device") == device for r in curve)
