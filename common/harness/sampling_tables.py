"""The exact-distribution check's table (artifact ``cross.sampling``, rule ``sampling_report``).

``tools/sampling_report.py`` writes JSON records (the workflow one per part, merged here by
:func:`merge_records`): every lossless decoder's option sets on a
tiny peaked LLaMA, G-tested against the enumerated distribution of its first tokens (rows
``decoders``), two negative controls the same test must reject (``controls``), and optionally a
two-sample run on the profile's model against ``vanilla`` (``real_model.rows``). This module
turns that record into one table and the counts its verdicts state; nothing here re-tests or
re-decides: a row passes when its p-value is at least the record's alpha and the same seed gave
the same tokens, the very condition the tool's ``failed`` list uses.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from common.errors import UserError

COLUMNS = ["part", "decoder", "config", "setting", "rule", "G", "dof", "p_value", "draws", "ms_per_draw",
           "same_seed_same_tokens", "passes", "rejected", "note"]


# what every part of one check must share: the test (alpha, pooling, what is counted), the tiny model
# and its settings, the draws; a part drawn under other ones is another check, not a piece of this one
SHARED = ("alpha", "min_expected", "counted_tokens", "max_new_tokens", "prompt", "model", "settings", "draws")
REAL_SHARED = ("model", "draws", "counted_tokens", "dtype")


def merge_records(records: Sequence[Mapping], names: Sequence[str] | None = None) -> dict:
    """One check's record from its parts (rule ``sampling_part``: a record per decoder, one of
    the controls), as the tool writes it whole: decoder rows, controls and real-model rows in
    the order given; ``failed`` and ``controls_rejected`` recomputed; ``code_version``,
    ``device`` and ``threads`` joined over the parts (the parts of hours of draws may come from
    several commits or hosts; the header says which).

    Args:
        records: the parts' records.
        names: their file names, for the error line (default: their positions).
    Raises:
        UserError: a part whose test, model, settings or draws differ from the first's.
    """
    if not records:
        raise UserError("no sampling records to merge; valid: at least the controls part")
    names = list(names or [f"part {i}" for i in range(len(records))])
    first = records[0]
    for name, r in zip(names[1:], records[1:]):
        diff = [k for k in SHARED if r.get(k) != first.get(k)]
        fr, rr = first.get("real_model"), r.get("real_model")
        if fr and rr:
            diff += [f"real_model.{k}" for k in REAL_SHARED if rr.get(k) != fr.get(k)]
        if diff:
            raise UserError(f"sampling record {name} differs from {names[0]} in {', '.join(diff)}; valid: every "
                            f"part drawn with one config (rerun the differing part)")
    rows = [row for r in records for row in r["decoders"]]
    controls = [c for r in records for c in r["controls"]]
    out = {k: first[k] for k in SHARED}
    for key in ("device", "threads", "code_version"):
        seen = list(dict.fromkeys(str(r[key]) for r in records if r.get(key) is not None))
        if seen:
            out[key] = seen[0] if len(seen) == 1 else "; ".join(seen)
    lossy: dict[str, list[str]] = {}
    for r in records:
        for rule, decs in (r.get("lossy_rules") or {}).items():
            lossy.setdefault(rule, []).extend(d for d in decs if d not in lossy.get(rule, []))
    out.update(decoders=rows, controls=controls, lossy_rules=lossy,
               failed=[f"{r['decoder']} [{r['config']}] {r['setting']}" for r in rows
                       if r["status"] == "tested" and not row_passes(r, first["alpha"])],
               controls_rejected=bool(controls) and all(c["p_value"] < first["alpha"] for c in controls))
    real = [r["real_model"] for r in records if r.get("real_model")]
    if real:
        out["real_model"] = {**real[0], "rows": [row for x in real for row in x["rows"]]}
    return out


def row_passes(row: Mapping, alpha: float) -> bool:
    """A tested decoder row's verdict: not rejected at ``alpha`` and reproducible by seed."""
    return row["p_value"] >= alpha and bool(row["same_seed_same_tokens"])


def sampling_table(record: Mapping) -> pd.DataFrame:
    """The record as one table: the decoder rows (one per option set and setting; a decoder
    that cannot run or cannot sample gets a row saying why, with no statistic), then the two
    negative controls (``rejected``: whether the test rejected them, as it must; ``passes`` is
    left empty there), then the real model's two-sample rows when present (``passes``: not
    rejected at alpha).

    Returns:
        a DataFrame with :data:`COLUMNS`; ``part`` is ``lossless``, ``control`` or ``real model``.
    """
    alpha = record["alpha"]
    out = []
    for r in record["decoders"]:
        row = {"part": "lossless", "decoder": r["decoder"], "config": r.get("config"), "setting": r.get("setting")}
        if r["status"] != "tested":
            out.append({**row, "note": f"{r['status']}: {r.get('reason', '')}"})
            continue
        out.append({**row, "rule": r["rule"], "G": r["statistic"], "dof": r["dof"], "p_value": r["p_value"],
                    "draws": r["samples"], "ms_per_draw": r["seconds_per_draw"] * 1e3,
                    "same_seed_same_tokens": bool(r["same_seed_same_tokens"]), "passes": row_passes(r, alpha),
                    "note": f"{r['impossible']} draws of probability 0" if r.get("impossible") else None})
    for c in record["controls"]:
        rejected = c["p_value"] < alpha
        out.append({"part": "control", "decoder": c["control"], "setting": "t1", "rule": c["rule"],
                    "G": c["statistic"], "dof": c["dof"], "p_value": c["p_value"], "draws": c["samples"],
                    "rejected": rejected,
                    "note": "rejected, as it must be" if rejected else "NOT rejected: the check lacks power here"})
    real = record.get("real_model") or {}
    for r in real.get("rows", []):
        row = {"part": "real model", "decoder": r["decoder"], "config": r.get("prompt"), "setting": "t1"}
        if r["status"] != "tested":
            out.append({**row, "note": f"{r['status']}: {r.get('reason', '')}"})
            continue
        na, nb = r["samples"]
        out.append({**row, "rule": r["rule"], "G": r["statistic"], "dof": r["dof"], "p_value": r["p_value"],
                    "draws": na, "passes": r["p_value"] >= alpha,
                    "note": f"two-sample against vanilla's {nb} draws (reported, not asserted)"})
    return pd.DataFrame(out, columns=COLUMNS)


def sampling_counts(record: Mapping) -> dict:
    """What the verdicts state, counted from the record: ``tested`` decoder rows and how many
    ``passed``; ``untested`` rows (cannot run / cannot sample); ``controls`` and how many were
    ``rejected``; ``real_tested`` / ``real_passed`` two-sample rows; ``lossy`` (rule -> decoders
    offering it, left out of the lossless rows by design)."""
    alpha = record["alpha"]
    tested = [r for r in record["decoders"] if r["status"] == "tested"]
    real = [r for r in (record.get("real_model") or {}).get("rows", []) if r["status"] == "tested"]
    return {"tested": len(tested), "passed": sum(row_passes(r, alpha) for r in tested),
            "failed": [f"{r['decoder']} [{r['config']}] {r['setting']}" for r in tested if not row_passes(r, alpha)],
            "untested": len(record["decoders"]) - len(tested),
            "controls": len(record["controls"]), "rejected": sum(c["p_value"] < alpha for c in record["controls"]),
            "real_tested": len(real), "real_passed": sum(r["p_value"] >= alpha for r in real),
            "lossy": dict(record.get("lossy_rules") or {})}


def sampling_meta(record: Mapping) -> dict:
    """The table's header: draws, alpha, the tiny model and what is counted, and where it ran
    (device, threads, code version) when the record says."""
    meta = {"draws": record["draws"], "alpha": record["alpha"], "tiny model": record["model"],
            "counted": f"the first {record['counted_tokens']} new tokens after prompt {record['prompt']} "
                       f"(cells expected < {record['min_expected']} pooled)",
            "settings": "; ".join(f"{k}: {v}" for k, v in record["settings"].items())}
    for key in ("device", "threads", "code_version"):
        if record.get(key) is not None:
            meta[key] = record[key]
    real = record.get("real_model")
    if real:
        meta["real model"] = (f"{real['model']}, {real['draws']} draws per decoder and prompt, first "
                              f"{real['counted_tokens']} tokens"
                              + "".join(f", {real[k]}" for k in ("device", "dtype") if real.get(k)))
    return meta


def sampling_verdicts(record: Mapping) -> list[str]:
    """The table's verdict lines (no "; " inside one: the header joins them with it), plain
    statements counted from the record: how many decoder
    settings pass at alpha out of how many were tested (and which failed), whether both negative
    controls were rejected (they are what makes the check able to fail), and the real model's
    two-sample count when run."""
    n = sampling_counts(record)
    alpha = record["alpha"]
    lines = [f"{n['passed']} of {n['tested']} decoder option sets x settings pass at alpha {alpha:g} "
             f"({record['draws']} draws each: G-test against the exact distribution, same seed gives same tokens)"
             + (f" - failed: {', '.join(n['failed'])}" if n["failed"] else "")
             + (f" - {n['untested']} more could not run or sample on the tiny model (their rows say why)"
                if n["untested"] else "")]
    if n["rejected"] == n["controls"]:
        lines.append(f"all {n['controls']} negative controls were rejected at alpha {alpha:g}: the check can fail")
    else:
        lines.append(f"only {n['rejected']} of {n['controls']} negative controls were rejected at alpha {alpha:g}: "
                     f"at {record['draws']} draws the check cannot tell a wrong sampler, so its passes are no evidence")
    real = record.get("real_model")
    if real:
        lines.append(f"{n['real_passed']} of {n['real_tested']} two-sample comparisons with vanilla on {real['model']} "
                     f"not rejected at alpha {alpha:g} ({real['draws']} draws each, reported, not asserted)")
    return lines


def lossy_note(record: Mapping) -> str | None:
    """Which sampling rules the lossless rows leave out by design (e.g. Medusa's ``typical``),
    with the decoders that offer them; None when the record lists none."""
    lossy = record.get("lossy_rules") or {}
    if not lossy:
        return None
    return "; ".join(f"{rule} (offered by {', '.join(decs)}) is lossy by design: not among the lossless rows"
                     for rule, decs in lossy.items())
