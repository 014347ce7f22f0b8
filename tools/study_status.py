"""Where the cross-method study stands: which datasets' runs are done, partial or not started.

The study (config ``study``; docs/study.md) is one benchmark job per dataset and spans several
sessions, so a researcher picking it up needs to know what is left, on which machine the
finished runs were made, whether they decoded with the same trained weights, and roughly how long
the rest will take:

    python tools/study_status.py [--profile embedded]

Per dataset: ``done`` (its record ``<results>/cross/raw/study_<dataset>.jsonl`` exists; the
hardware and code version it names), ``stale`` (it exists, but some decoder ran with other options
than the config sets now, ``common.harness.report.stale_settings``: a setting re-chosen after the run; or
it decoded older weights than its components hold now, tools/weights_status.py: one retrained
after the run; the whole dataset is rerun, so that its decoders stay interleaved with one vanilla), ``partial`` (a
resume log under ``.cache/resume/``: how many prompts are finished, on which hardware; only that
hardware may continue it), or ``not started``.
The estimate of what is left is rough: seconds per prompt (every decoder's wall time summed) of the
finished prompts of the same dataset where there are some, else their mean over the other
datasets; long-prompt datasets take longer than that mean.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.config import AA_LABEL, bench_decoders, labels_config, load_profile  # noqa: E402
from common.workflow.artifacts import study_section  # noqa: E402
from common.assets.data import load_dataset_samples  # noqa: E402
from common.errors import cli_main  # noqa: E402
from common.records import ResumeLog, read_jsonl  # noqa: E402
from common.harness.report import components_line, decoded_components, stale_settings  # noqa: E402

import weights_status  # noqa: E402  (tools/, beside this script)


def _per_prompt_s(records: list[dict]) -> float:
    """Seconds per prompt: every decoder's wall time of a prompt summed, averaged over prompts (nan: none)."""
    by_q: dict[str, float] = {}
    for r in records:
        by_q[r["question_id"]] = by_q.get(r["question_id"], 0.0) + r["wall_time"]
    return sum(by_q.values()) / len(by_q) if by_q else float("nan")


def _partial(out: Path) -> tuple[dict, list[dict]] | None:
    """A resume log's identity and the records of its finished prompts (None: no log)."""
    path = ResumeLog.for_output(out, {}).path
    if not path.is_file():
        return None
    identity, done = ResumeLog.read(path)
    return identity or {}, [r for recs in done.values() for r in recs]


def status(profile: str, root: Path = ROOT) -> tuple[pd.DataFrame, str]:
    """``(one row per dataset, the components line)``."""
    P = load_profile(None, profile)
    datasets = study_section(P)["bench"]["datasets"]
    results = root / P.results_root
    rows, runs = [], {}
    for ds, n in datasets.items():
        out = results / "cross" / "raw" / f"study_{ds}.jsonl"
        row = {"dataset": ds, "prompts": len(load_dataset_samples(ds, n=n))}  # a source may have fewer than n
        options = labels_config(P, [*bench_decoders(study_section(P)["bench"], ds), AA_LABEL])
        if out.is_file():
            recs = read_jsonl(out)
            runs[ds] = recs
            stale = stale_settings(recs, options)
            row.update(state="stale: " + ", ".join(stale) if stale else "done",
                       finished=len({r["question_id"] for r in recs}),
                       hardware="; ".join(sorted({r["device"] for r in recs})),
                       code=", ".join(sorted({r["code_version"] for r in recs})), s_per_prompt=_per_prompt_s(recs))
        elif (part := _partial(out)) is not None:
            identity, recs = part
            if recs:
                runs[ds] = recs
            row.update(state="partial", finished=len({r["question_id"] for r in recs}),
                       hardware=identity.get("hardware", "(not named: a log from before the hardware was)"),
                       code=", ".join(sorted({r["code_version"] for r in recs})), s_per_prompt=_per_prompt_s(recs))
        else:
            row.update(state="not started", finished=0, hardware="", code="", s_per_prompt=float("nan"))
        rows.append(row)
    weights = weights_status.status(profile, root)
    for row in rows:
        run = os.path.relpath(results / "cross" / "raw" / f"study_{row['dataset']}.jsonl", root)  # as weights_status names it
        old = weights[(weights.run == run) & (weights.state == "stale")]
        if row["state"] == "done" and len(old):
            row["state"] = "stale: weights of " + ", ".join(sorted({d for ds in old.decoders for d in ds.split(", ")}))
    table = pd.DataFrame(rows)
    known = table.s_per_prompt.dropna()
    mean = float(known.mean()) if len(known) else None
    table["s_per_prompt"] = table.s_per_prompt.astype(float)
    left = []
    for _, r in table.iterrows():
        per = r.s_per_prompt if not pd.isna(r.s_per_prompt) else mean
        todo = 0 if r.state == "done" else r.prompts if r.state.startswith("stale") else r.prompts - r.finished
        left.append(0.0 if todo == 0 else float("nan") if per is None else todo * per / 60)
    table["min_left_est"] = left
    return table, components_line(runs) if runs else "no runs yet"


def missing_components(profile: str, root: Path = ROOT) -> list[str]:
    """The component paths the study's records decoded that this machine holds no copy of (not in
    the cache, not kept in git): a rerun's jobs, restricted to the benchmark rule, need them
    retrained first (docs/study.md)."""
    results = root / load_profile(None, profile).results_root
    paths = set()
    for f in sorted((results / "cross" / "raw").glob("study_*.jsonl")):
        paths |= set(decoded_components(read_jsonl(f)))
    return sorted(p for p in paths if weights_status.local_copy(p, profile, root) is None)


def next_commands(table: pd.DataFrame, profile: str, results_root: str) -> list[str]:
    """The command of each dataset left, one job each (run alone on the machine): a partial run
    resumes, a stale one is forced (its record exists, so Snakemake would not remake it). Put the
    target first: ``--config`` takes every argument after it."""
    lines = []
    for _, r in table[table.state != "done"].iterrows():
        force = "-f " if r.state.startswith("stale") else ""
        lines.append(f"next ({r.dataset}, {r.state}): .venv/bin/snakemake {force}{results_root}/cross/raw/"
                     f"study_{r.dataset}.jsonl "
                     "-j1 --rerun-incomplete --rerun-triggers mtime --allowed-rules rest_datastore study_bench "
                     f"--config profile={profile} rerun=true")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="embedded", help="the profile whose study to report (default: embedded)")
    args = ap.parse_args(argv)
    table, comps = status(args.profile)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    total = table.min_left_est.sum(min_count=1)
    print(f"\nleft (rough estimate): {'unknown' if pd.isna(total) else f'{total:.0f} min'} of machine time, "
          f"one dataset per job, each alone on the machine")
    print(f"components: {comps}")
    for line in next_commands(table, args.profile, load_profile(None, args.profile).results_root):
        print(line)
    if (table.state != "done").any() and (missing := missing_components(args.profile)):
        print("not on this machine (neither in the cache nor kept in git): " + ", ".join(missing)
              + "; the jobs above build REST's datastore themselves (rule rest_datastore), the trained "
              "components are retrained first and kept (docs/study.md, step 1: tools/keep_components.py keep cross "
              "draft bild_small_aligned), so no later session retrains them")
    done = int((table.state == "done").sum())
    old_weights = int(table.state.str.startswith("stale: weights").sum())
    if done + old_weights < len(table):
        print(f"the study's artifacts stay pending until every dataset's record exists and ran the configured "
              f"settings ({done + old_weights} of {len(table)})")
    if old_weights:
        print(f"{old_weights} of {len(table)} datasets decoded older weights than their components hold now "
              "(tools/weights_status.py): the study's artifacts render from them until they rerun")


if __name__ == "__main__":
    cli_main(main)
