"""From raw benchmark records to summary tables (used by ``common.harness.bench`` and the notebooks).

Which averages: ``tokens_per_s`` is a ratio of totals (every new token of a decoder over its
summed wall time), so prompts with long answers weigh more than a mean of per-prompt rates
would let them; ``speedup`` is that ratio over vanilla's on the same prompts in the same run.
``mean_accepted_length`` is likewise total new tokens over total target forwards (steps).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from ..config import AA_LABEL  # noqa: F401  (the A/A pair's label; re-exported for the notebooks)
from ..config import placeholder
from ..cost import cost_of, curve_fits
from ..records import read_jsonl

# How a missing cell prints in a markdown table (never "nan").
MISSING = "—"

NO_AA = "no A/A pair in this run"
BOOTSTRAP = 1000  # resamples of the prompts; seeded, so a re-render gives the same interval

# What summarize reads from every record.
BENCH_FIELDS = {"question_id", "decoder", "tokens", "new_tokens", "steps", "wall_time", "peak_mem_bytes"}


def summarize(records: list[dict], baseline: str = "vanilla") -> pd.DataFrame:
    """One row per decoder: prompts, tokens/s, speedup, mean accepted length, peak memory,
    and whether every output equals the baseline's on the same prompt."""
    df = pd.DataFrame(records)
    base = df[df.decoder == baseline].set_index("question_id")["tokens"] if baseline in set(df.decoder) else None
    rows = []
    for name, g in df.groupby("decoder", sort=False):
        row = {
            "decoder": name,
            "prompts": len(g),
            "new_tokens": int(g.new_tokens.sum()),
            "tokens_per_s": g.new_tokens.sum() / g.wall_time.sum(),
            "mean_accepted_length": g.new_tokens.sum() / g.steps.sum(),
            "peak_mem_mib": g.peak_mem_bytes.max() / 2**20,
        }
        if base is not None:
            same = [t == base.get(q) for q, t in zip(g.question_id, g.tokens)]
            row["identical_to_vanilla"] = f"{sum(same)}/{len(same)}"
        rows.append(row)
    out = pd.DataFrame(rows)
    if base is not None:
        out["speedup"] = out.tokens_per_s / out.loc[out.decoder == baseline, "tokens_per_s"].iloc[0]
        ci = {d: speedup_interval(records, d, baseline) for d in out.decoder}
        out["speedup_lo"] = out.decoder.map(lambda d: ci[d][0])
        out["speedup_hi"] = out.decoder.map(lambda d: ci[d][1])
    return out


def extra_memory(records: list[dict], baseline: str = "vanilla") -> dict[str, float | None]:
    """``{decoder: MiB}``: the most memory one call of the decoder added above its entry
    (``mem_growth_bytes``, the largest over its prompts) minus the same for ``baseline``, in
    the same records. What a decoder's own buffers, trees and drafts' caches cost at decode time;
    the weights of a trained component are loaded before any call and are not in it (their size
    is the component's parameter count).

    None for every decoder when a record lacks ``mem_growth_bytes``: records written before
    ``common.harness.bench`` kept it carry only ``peak_mem_bytes``, the call's resident peak, which
    counted every page earlier calls of any decoder had left to the allocator (the resident set
    fell between calls a few times in a run of hundreds), so differences of those peaks say
    nothing about a decoder."""
    decoders = list(dict.fromkeys(r["decoder"] for r in records))
    if not records or any("mem_growth_bytes" not in r for r in records) or baseline not in decoders:
        return {d: None for d in decoders}
    most = {d: max(r["mem_growth_bytes"] for r in records if r["decoder"] == d) for d in decoders}
    return {d: (most[d] - most[baseline]) / 2**20 for d in decoders}


def speedup_interval(records: list[dict], decoder: str, baseline: str = "vanilla",
                     level: float = 0.95, n_boot: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """A ``level`` bootstrap interval of ``decoder``'s speedup over ``baseline``, resampling
    prompts (the same draw for both, so a prompt's length weighs on both alike); NaN bounds
    when they share no prompt. The speedup is the ratio of totals, as in :func:`summarize`."""
    df = pd.DataFrame(records)
    a = df[df.decoder == decoder].set_index("question_id")
    b = df[df.decoder == baseline].set_index("question_id")
    common = [q for q in a.index if q in b.index]
    if not common:
        return float("nan"), float("nan")
    a, b = a.loc[common], b.loc[common]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(common), size=(n_boot, len(common)))   # [n_boot, prompts]

    def rate(g):
        return g.new_tokens.to_numpy(float)[idx].sum(1) / g.wall_time.to_numpy(float)[idx].sum(1)
    ratio = rate(a) / rate(b)
    lo, hi = np.quantile(ratio, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def aa_spread(records: list[dict], baseline: str = "vanilla") -> float | None:
    """The group's A/A spread: ``|tokens/s(vanilla@aa) / tokens/s(vanilla) - 1|`` over the
    prompts both ran; None when the run has no A/A pair."""
    df = pd.DataFrame(records)
    if df.empty or AA_LABEL not in set(df.decoder) or baseline not in set(df.decoder):
        return None
    s = summarize([r for r in records if r["decoder"] in (baseline, AA_LABEL)], baseline).set_index("decoder")
    return abs(float(s.loc[AA_LABEL, "speedup"]) - 1.0)


def noise_line(runs: dict[str, list[dict]], baseline: str = "vanilla") -> str:
    """What every speedup of these benchmark runs (name -> records) is worth: each run's A/A
    spread (or that it has none) and the half-width of the speedups' bootstrap intervals."""
    parts = []
    for name, recs in runs.items():
        if not recs or baseline not in {r.get("decoder") for r in recs}:
            continue
        spread = aa_spread(recs, baseline)
        s = summarize(recs, baseline)
        s = s[~s.decoder.isin([baseline, AA_LABEL])]
        half = ((s.speedup_hi - s.speedup_lo) / 2).dropna()
        prompts = int(s.prompts.max()) if len(s) else 0
        ci = (f"95% bootstrap intervals over {prompts} prompts ±{half.median():.3f} (median; widest ±{half.max():.3f})"
              if len(half) else "no interval")
        parts.append(f"{name}: " + (f"A/A spread {100 * spread:.1f}%" if spread is not None else NO_AA) + f", {ci}")
    return "; ".join(parts)


def components_line(runs: dict[str, list[dict]]) -> str:
    """Which trained weights these runs (name -> records) decoded with: per decoder option that
    names a component (records' ``components``: content digests, :func:`common.records.content_digest`),
    one digest when every run used the same weights, else each run's. Runs span sessions, and a
    component retrained in between is close but not bit-identical; records written before the
    digests existed are named as such."""
    seen: dict[str, dict[str, set]] = {}   # "decoder.option" -> run -> digests
    undigested = set()
    for name, recs in runs.items():
        for r in recs:
            if "components" not in r:
                if r.get("decoder_config"):
                    undigested.add(name)
                continue
            for opt, digest in r["components"].items():
                seen.setdefault(f"{r['decoder']}.{opt}", {}).setdefault(name, set()).add(digest)
    parts = []
    for key, per_run in sorted(seen.items()):
        digests = set().union(*per_run.values())
        if len(digests) == 1:
            parts.append(f"{key} {next(iter(digests))} (every run)")
        else:
            parts.append(f"{key} differs: " + ", ".join(f"{n} {'/'.join(sorted(d))}" for n, d in sorted(per_run.items())))
    if undigested:
        parts.append("no digests in " + ", ".join(sorted(undigested)))
    return "; ".join(parts) if parts else "no trained components"


def weights_match(trained: str | None, decoded: set) -> str:
    """Did a benchmark decode the weights a training wrote? A component retrained after its
    benchmark leaves that benchmark on the old weights, under the same cache path, until it reruns.

    Args:
        trained: the digest the training's stats name (``weights_digest``; ``model_digest`` of a
            benchmarked model folder); None where the stats predate it.
        decoded: the digests the benchmark's records name for the component (None for a record
            that names none).
    Returns:
        ``yes`` (every record decoded the trained weights), ``no`` (other weights: rerun the
        benchmark), ``unknown`` (a digest is missing on either side).
    """
    if trained is None or not decoded or None in decoded:
        return "unknown"
    return "yes" if decoded == {trained} else "no"


def stats_match(stats: dict, records: list[dict]) -> str:
    """:func:`weights_match` of a training's stats (``weights_path``, ``weights_digest``:
    :func:`common.training.cli.component_main`) with the records whose decoder options load that path."""
    path = stats.get("weights_path")
    if path is None:
        return "unknown"
    decoded = {(r.get("components") or {}).get(opt) for r in records
               for opt, v in (r.get("decoder_config") or {}).items()
               if isinstance(v, str) and os.path.normpath(v) == os.path.normpath(path)}
    return weights_match(stats.get("weights_digest"), decoded)


def decoded_weights(stats: dict, records: list[dict]) -> str:
    """Did benchmark records decode the weights a training record describes? Its ``model_digest``
    against theirs (:func:`common.harness.bench.model_digest`), in words (:func:`weights_match`)."""
    theirs = {r.get("model_digest") for r in records}
    match = weights_match(stats.get("model_digest"), theirs)
    if match == "unknown":
        return "benchmarked weights unknown (records or training without digests)"
    if match == "yes":
        return "benchmarked with these weights"
    return f"benchmarked with other weights ({'/'.join(sorted(theirs))}; trained {stats['model_digest']}): rerun its benchmark"


def decoded_components(records: list[dict]) -> dict[str, dict[str, set]]:
    """Which weights records decoded, by the path they loaded them from: ``{path: {"decoder.option":
    digests}}``, from each record's ``components`` (the options' digests) and ``decoder_config``
    (the paths), and from ``model_digest`` with ``model`` (a benchmarked local model folder)."""
    out: dict[str, dict[str, set]] = {}
    for r in records:
        for opt, digest in (r.get("components") or {}).items():
            path = (r.get("decoder_config") or {}).get(opt)
            if isinstance(path, str):
                out.setdefault(path, {}).setdefault(f"{r['decoder']}.{opt}", set()).add(digest)
        if r.get("model_digest"):
            out.setdefault(r["model"], {}).setdefault(f"{r['decoder']}.model", set()).add(r["model_digest"])
    return out


def weights_status(runs: dict[str, list[dict]], committed: dict[str, float],
                   now: dict[str, tuple[str, str]], earlier: dict[str, dict[str, str]] | None = None) -> pd.DataFrame:
    """Did each run decode the weights its components hold now? One row per run and component path.

    Records name a component by its cache path, which a later training overwrites; their digests
    (:func:`decoded_components`) say which weights they loaded. The reference for a path is
    ``now[path] = (digest, where)`` (the cache's copy, or the one kept in git) when there is one;
    else the weights of the run committed last (``committed``: run -> time) that decoded it, since
    a benchmark loads what its cache holds when it runs. ``state``: ``current`` (the reference's
    weights), ``stale`` (other weights: its benchmark reruns on the reference's), ``unchecked``
    (the only run naming the path, and nothing to compare with). A run that decoded the
    reference's folder as it was before a file was added to it, or with a file as an older writer
    wrote it (``earlier``), is current: the same weights, and its ``note`` says what differed.

    Args:
        runs: run name (a record file) -> its records.
        committed: run name -> when it was last committed (seconds; missing: oldest).
        now: path -> (its digest now, where that copy is).
        earlier: path -> {another digest of the reference's weights: why it differs}, e.g. the
            folder's digest without one file: "<file> was added to the folder since".
    Returns:
        columns run, path, decoders, decoded, reference, state, note.
    """
    earlier = earlier or {}
    per_run = {name: decoded_components(recs) for name, recs in runs.items()}
    paths = sorted({p for d in per_run.values() for p in d})
    rows = []
    for path in paths:
        users = [n for n in per_run if path in per_run[n]]
        from_record = path not in now   # the reference is one of the runs' own weights
        if not from_record:
            ref, where = now[path]
        else:
            newest = max(users, key=lambda n: committed.get(n, float("-inf")))
            digests = set().union(*per_run[newest][path].values())
            ref, where = (next(iter(digests)), f"newest record ({newest})") if len(digests) == 1 else (None, None)
        for name in users:
            decoded = set().union(*per_run[name][path].values())
            added = {earlier.get(path, {}).get(d) for d in decoded} - {None}
            note = ""
            if ref is None or (from_record and len(users) == 1):
                state = "unchecked"
            elif decoded == {ref}:
                state = "current"
            elif len(added) == 1 and all(d in earlier.get(path, {}) for d in decoded):
                state, note = "current", f"the same weights; {next(iter(added))}"
            else:
                state = "stale"
            rows.append({"run": name, "path": path, "decoders": ", ".join(sorted(per_run[name][path])),
                         "decoded": "/".join(sorted(decoded)), "reference": f"{ref} ({where})" if ref else MISSING,
                         "state": state, "note": note})
    return pd.DataFrame(rows, columns=["run", "path", "decoders", "decoded", "reference", "state", "note"])


def within_noise(a: float, b: float, spread: float | None) -> bool:
    """Do two speedups of one run differ by no more than its A/A spread (relative)? False when
    the run has no A/A pair: then the noise is unknown, and the table says so."""
    return spread is not None and abs(a - b) <= spread * max(abs(a), abs(b))


def step_positions(records: list[dict]) -> list[float] | None:
    """The verified positions of every verification step (the prefill excluded) of one decoder's
    records: proposed tokens + the root + positions injected into the forward (prompt tokens,
    pseudo states, in full-forward equivalents). None when a record has no per-step proposals."""
    qs = []
    for r in records:
        extra = r.get("extra") if isinstance(r.get("extra"), dict) else {}  # a DataFrame row may hold NaN
        p = extra.get("proposed")
        if p is None:
            return None
        inj = extra.get("injected") or [0.0] * len(p)
        qs += [n + 1 + x for n, x in zip(p[1:], inj[1:])]  # p[0] is the prefill
    return qs


def limits(records: list[dict], curve: list[dict], baseline: str = "vanilla") -> pd.DataFrame:
    """The hardware limit of each tree-verified decoder, beside what it reached.

    ``step_cost`` is the mean over its verification steps (the prefill excluded) of
    ``T(q) / T(1)`` on the machine's cost curve, ``q`` being the step's verified positions
    (proposed tokens + the root + injected positions, in full-forward equivalents); ``limit = tau * T(1) / T(step)`` with ``tau`` its mean accepted
    length: the speedup it would reach if a step cost only its verification forward. ``pct_of_limit``
    = measured speedup / limit: below 100% is the price of proposing (drafts, heads) and of
    everything around the forward. Decoders that record no per-step proposals (``vanilla``:
    limit 1; transformers' own, pipelined workers) get blanks, and so does every decoder when the
    curve was measured on other hardware than the records (T(q) is the machine's own).
    """
    df = pd.DataFrame(records)
    paths = set(df.get("forward_path", pd.Series(["stock"])).fillna("stock"))
    if len(paths) != 1:
        raise ValueError(f"records of several forward paths ({sorted(paths)}) cannot share one cost curve")
    devices = set(df.device)
    if len(devices) != 1:
        raise ValueError(f"records of several devices ({sorted(devices)}) cannot share one cost curve")
    device = devices.pop()
    if not curve_fits(curve, device):
        return pd.DataFrame([{"decoder": d, "step_cost": None, "limit": None, "pct_of_limit": None}
                             for d in df.decoder.unique()])
    ratio = cost_of(curve, paths.pop(), device)
    summary = summarize(records, baseline).set_index("decoder")
    rows = []
    for name, g in df.groupby("decoder", sort=False):
        qs = step_positions(g.to_dict("records"))
        if name == baseline:
            cost = 1.0
        elif qs is not None:
            cost = sum(map(ratio, qs)) / len(qs) if qs else float("nan")
        else:
            rows.append({"decoder": name, "step_cost": None, "limit": None, "pct_of_limit": None})
            continue
        tau = summary.loc[name, "mean_accepted_length"]
        limit = tau / cost
        rows.append({"decoder": name, "step_cost": cost, "limit": limit,
                     "pct_of_limit": 100 * summary.loc[name, "speedup"] / limit})
    return pd.DataFrame(rows)


def step_times(records: list[dict]) -> pd.DataFrame:
    """Where a decoder's step goes, in milliseconds per step (sums over its records / its steps).

    ``step_ms``: wall time (prefill included) per step; ``target_ms``: the target's forwards
    (``extra.target_forward_s``, the prefill's among them); ``propose_ms``: the proposer's own work
    (``extra.draft_forward_s``, a draft model's or draft head's forwards and EAGLE's readout, and
    ``extra.retrieval_s``, REST's datastore lookups, one entry a step); ``other_ms``: the rest
    (building trees and masks, acceptance, cache bookkeeping, Python). The three parts are blank (None) for a decoder whose
    records time no target forward (``vanilla``, transformers' own loops, pipelined workers).
    """
    rows = []
    for name, g in pd.DataFrame(records).groupby("decoder", sort=False):
        steps, wall = g.steps.sum(), g.wall_time.sum()
        extras = [e if isinstance(e, dict) else {} for e in g.get("extra", pd.Series([{}] * len(g)))]
        row = {"decoder": name, "step_ms": 1e3 * wall / steps, "target_ms": None, "propose_ms": None, "other_ms": None}
        if all("target_forward_s" in e for e in extras):
            target = sum(e["target_forward_s"] for e in extras)
            propose = sum(e.get("draft_forward_s", 0.0) + sum(e.get("retrieval_s", [])) for e in extras)
            row.update(target_ms=1e3 * target / steps, propose_ms=1e3 * propose / steps,
                       other_ms=1e3 * (wall - target - propose) / steps)
        rows.append(row)
    return pd.DataFrame(rows)


def check_decoders(records: list[dict], expected, source: str, where: str, options: dict | None = None) -> None:
    """Raise ValueError unless a run's records hold exactly the decoder labels its config lists
    (``where``), so a table never silently drops a label added to the config, nor shows one
    removed from it, before the run is redone; with ``options`` (label -> the config's decoder
    options, :func:`common.config.labels_config`), also unless every label ran with the options
    the config sets now (:func:`stale_settings`): a setting re-chosen in the config after the run
    must not be read under the label's new meaning."""
    have = list(dict.fromkeys(r["decoder"] for r in records))
    if set(have) != set(expected):
        raise ValueError(f"{source} has decoders {', '.join(have)} but config {where} lists {', '.join(expected)}; "
                         "valid: records of the configured run (rerun it with --config rerun=true)")
    if options is not None:
        check_settings(records, options, source, where)


def check_settings(records: list[dict], options: dict, source: str, where: str) -> None:
    """Raise ValueError naming every label of a run that ran with other decoder options than the
    config (``where``) sets now (:func:`stale_settings`)."""
    stale = stale_settings(records, options)
    if stale:
        raise ValueError(f"{source} ran " + "; ".join(f"{label} with {ran} where config {where} now sets {now}"
                                                      for label, (ran, now) in stale.items())
                         + "; valid: records of the configured settings (rerun it with --config rerun=true)")


# decoder options a run sets for every label (common.harness.bench's sampling flags)
RUN_SAMPLING = ("temperature", "top_p", "top_k", "seed", "acceptance")


def stale_settings(records: list[dict], options: dict) -> dict[str, tuple[dict, dict]]:
    """The labels whose records ran with other decoder options than ``options`` (label -> the
    config's options) sets: ``{label: (options recorded, options configured)}``, each without
    the options that name a trained component (``"{name}"`` in the config, a folder in the record:
    the record's ``components`` digest says which weights those were). Records without a
    ``decoder_config`` field (older than it), and labels ``options`` does not name (whose options
    are not the config's to say), are not judged. An option the config sets and a record does
    not name (older than the option) is read as the option's ``legacy`` value, when it declares
    one (:class:`common.decoders.base.Option`). The run-level sampling options
    (:data:`RUN_SAMPLING`) are judged only where the config sets them for the label."""
    def masked(ran, conf):
        # where the config names a component, the record holds its folder: compare the name
        if placeholder(conf) is not None:
            return conf
        if isinstance(ran, dict) and isinstance(conf, dict):
            return {k: masked(v, conf.get(k)) for k, v in ran.items()}
        if isinstance(ran, list) and isinstance(conf, list) and len(ran) == len(conf):
            return [masked(v, c) for v, c in zip(ran, conf)]
        return ran

    def plain(opts: dict, names: dict) -> dict:
        return {k: masked(v, names.get(k)) for k, v in opts.items() if placeholder(names.get(k)) is None}
    out = {}
    for r in records:
        label = r["decoder"]
        if "decoder_config" not in r or label in out or label not in options:
            continue
        configured = options[label]
        # the run's own sampling (the benchmark's --temperature, --category-temperatures, --acceptance ...,
        # a section's sampling entry) is recorded per label; unless the label's options set it, it is the
        # run's to say (each table's decoding line states it), not a stale label setting
        recorded = {k: v for k, v in (r["decoder_config"] or {}).items() if k in configured or k not in RUN_SAMPLING}
        recorded = {**legacy_values(label, set(configured) - set(recorded)), **recorded}
        ran, now = plain(recorded, configured), plain(configured, configured)
        if ran != now:
            out[label] = (ran, now)
    return out


def legacy_values(label: str, keys) -> dict:
    """The ``legacy`` values (what runs older than an option used) of the options ``keys`` of the
    decoder behind ``label`` (``name@variant``); options without one are left out."""
    from ..decoders import NO_LEGACY, Option, decoder_class
    from ..errors import UserError
    try:
        opts = decoder_class(label.split("@")[0]).options()
    except UserError:
        return {}
    return {k: opts[k].legacy for k in keys if isinstance(opts.get(k), Option) and opts[k].legacy != NO_LEGACY}


def provenance(records: list[dict]) -> dict:
    """Model, data, profile and hardware named by the records (each must be unique)."""
    df = pd.DataFrame(records)
    keys = ["model", "dataset", "profile", "device", "dtype", "max_new_tokens", "code_version"]
    return {k: ", ".join(sorted(map(str, df[k].unique()))) for k in keys if k in df}


def data_of(stats: dict) -> str:
    """One training's data from its stats file: '8960 sequences (64 held out)'."""
    return f"{stats.get('train_sequences', '?')} sequences ({stats.get('heldout_sequences', '?')} held out)"


def mixed_data(stats: dict[str, dict]) -> str | None:
    """None when every training in ``stats`` (stats file by training name) learned from and was
    measured on as many sequences as the others; else the caveat a verdict comparing them
    carries, naming who saw what (a comparison across data sizes measures the data, not the
    setting it varies)."""
    groups: dict[str, list[str]] = {}
    for name, s in stats.items():
        groups.setdefault(data_of(s), []).append(name)
    if len(groups) < 2:
        return None
    return "trained on different data: " + "; ".join(f"{', '.join(n)} on {d}" for d, n in groups.items())


def share(flags: Iterable[bool]) -> str:
    """'7/9' for a list of comparisons that should each hold."""
    flags = [bool(f) for f in flags if f is not None and not (isinstance(f, float) and np.isnan(f))]
    return f"{sum(flags)}/{len(flags)}"


# "mostly holds" needs at least this share of the cases (7/12 or 2/3 is "partly holds").
MOSTLY = 0.75
# "partly holds" needs at least half the cases; below, the paper's trend does not hold here.
PARTLY = 0.5


def verdict_word(held: int, cases: int) -> str:
    """The verdict of a comparison that holds in ``held`` of ``cases`` cases: "holds" (all),
    "mostly holds" (at least :data:`MOSTLY`), "partly holds" (at least :data:`PARTLY`), "does
    not hold" (fewer: 1/8 is no partial confirmation; the count beside it says how many held),
    "untested" (no case)."""
    if not cases:
        return "untested"
    return ("holds" if held == cases else "mostly holds" if held >= MOSTLY * cases
            else "partly holds" if held >= PARTLY * cases else "does not hold")


def trend(what: str, ours: Iterable[bool], paper: Iterable[bool] | None = None) -> str:
    """One computed line: how often a comparison holds in the paper's numbers and in ours
    (``paper`` None: the paper states it as a claim, with no numbers to count)."""
    ours = share(ours)
    n_o, d_o = map(int, ours.split("/"))
    verdict = verdict_word(n_o, d_o)
    if paper is None:
        return f"{what}: ours {ours} -> the paper's claim {verdict} here"
    paper = share(paper)
    n_p, d_p = map(int, paper.split("/"))
    return f"{what}: paper {paper}, ours {ours} -> the paper's trend {verdict} here" + (
        "" if n_p == d_p else " (the paper itself has exceptions)")


# The accuracy gap below which a comparison decided on one or two seeds is a tie. Not measured
# here (every training in this repository ran one seed): a stated bound, printed in every verdict
# it decides, at about twice the binomial standard error of a held-out top-1 accuracy near 0.3
# over a few thousand positions.
ACCURACY_TOL = 0.02


def tie(a: float, b: float, tol: float, seeds: int = 1) -> bool:
    """Is an accuracy comparison of ``a`` with ``b`` a tie: decided on fewer than 3 seeds with a
    gap below ``tol`` (a gap that small is inside what another seed moves, so neither side wins)."""
    return seeds < 3 and abs(a - b) < tol


def tie_note(tol: float, seeds: int = 1) -> str:
    """How a tied comparison (:func:`tie`) reads in a verdict line."""
    return f"tie ({'single seed' if seeds == 1 else f'{seeds} seeds'}, gap < {tol:g})"


HOST_FIELDS = ("device", "hardware")  # where records name the machine they ran on


def hosts(records: Iterable[dict]) -> list[str]:
    """The distinct machines the records name (``device``, else ``hardware``), sorted."""
    return sorted({str(next(r[k] for k in HOST_FIELDS if r.get(k))) for r in records
                   if isinstance(r, dict) and any(r.get(k) for k in HOST_FIELDS)})


def host_caveat(records: Iterable[dict]) -> str | None:
    """None when the records come from one host (or name none); else what a verdict resting on
    them must say: a ratio or ranking across machines measures the machines too."""
    h = hosts(records)
    if len(h) < 2:
        return None
    # " / " between hosts: a verdict line's own parts are split on "; " (render._verdicts_of)
    return f"records from {len(h)} hosts: {' / '.join(h)}, not one-host evidence"


# The fields that split decoded records into a table's cells: one decoder (or oracle setting,
# match-rate method, threshold, small model) of one run.
CELL_FIELDS = ("decoder", "setting", "threshold", "method", "small")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")


def is_decoded(record) -> bool:
    """Is ``record`` one prompt's decoded output (a ``question_id`` and its tokens), not a prompt
    list, a training curve or a cost curve?"""
    return isinstance(record, dict) and "question_id" in record and ("tokens" in record or "new_tokens" in record)


def prompts_line(runs: dict[str, list[dict]]) -> str | None:
    """How many prompts stand behind each cell: per run (``name -> records``) and cell
    (:data:`CELL_FIELDS`), the distinct ``question_id`` s; "80 per cell", or the range when cells
    differ. None when no record names a prompt (training curves, stats, cost curves)."""
    counts: dict[tuple, set] = {}
    for name, recs in runs.items():
        for r in recs:
            if is_decoded(r):
                key = (name,) + tuple(str(r.get(f)) for f in CELL_FIELDS)
                counts.setdefault(key, set()).add(r["question_id"])
    if not counts:
        return None
    n = sorted(len(q) for q in counts.values())
    each = f"{n[0]}" if n[0] == n[-1] else f"{n[0]}-{n[-1]}"
    return f"{each} per cell ({len(counts)} cells)"


def decoding_of(record: dict) -> dict:
    """The sampling settings a decoded record ran with (``temperature``, ``top_p``, ``top_k``,
    ``acceptance``), from its decoder options or its own fields (a match-rate record's
    ``method_params``); {} for greedy decoding (temperature 0 or none named)."""
    opts = {**(record.get("method_params") or {}), **(record.get("decoder_config") or {})}
    opts.update({k: record[k] for k in SAMPLING_FIELDS if k in record})
    # the defaults change nothing (top-p 1 and top-k 0 truncate nothing): a bench record names all four
    out = {k: opts[k] for k in SAMPLING_FIELDS if opts.get(k) and not (k == "top_p" and float(opts[k]) >= 1.0)}
    if out and opts.get("acceptance"):
        out["acceptance"] = opts["acceptance"]
    return out


def decoding_line(records: Iterable[dict]) -> str | None:
    """Greedy or sampled, from the decoded records (those naming a ``question_id``): "greedy
    (temperature 0 in every record)", else each sampled label with its settings and acceptance
    rule (a decoder's default rule when the record names none). None without decoded records."""
    decoded_ = [r for r in records if is_decoded(r)]
    if not decoded_:
        return None
    sampled: dict[str, list[str]] = {}
    greedy_too: set[str] = set()  # labels with greedy records beside sampled ones (per-category temperatures)
    for r in decoded_:
        d = decoding_of(r)
        label = r.get("decoder") or r.get("method") or "records"
        if not d:
            greedy_too.add(label)
            continue
        rule = d.pop("acceptance", None)
        what = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in d.items())
        what += (f", acceptance {rule}" if rule else
                 ", acceptance by the decoder's default sampling rule" if r.get("decoder") else "")
        if what not in sampled.setdefault(label, []):
            sampled[label].append(what)
    if not sampled:
        return "greedy (temperature 0 in every record)"
    per = {k: " or ".join(v) + (" (greedy where the prompt's temperature is 0)" if k in greedy_too else "")
           for k, v in sampled.items()}
    tables = sorted({str(r["category_temperatures"]) for r in decoded_ if r.get("category_temperatures")})
    head = f"each prompt at its category's temperature ({', '.join(tables)}) - " if tables else ""
    if len(sampled) == len({r.get("decoder") or r.get("method") for r in decoded_}):
        return head + "sampled: " + "; ".join(f"{k}: {v}" for k, v in per.items())
    return head + "greedy, except " + "; ".join(f"{k}: {v}" for k, v in per.items())


def cut_line(what: str, ours: Iterable, paper: Iterable) -> str | None:
    """Where a sweep is cut from the paper's: "EPTs 1, 2, 5, 10 of the paper's 1, 2, 5, 10, 20,
    50, 100"; None when ours covers every value the paper swept."""
    def listed(values) -> str:
        v = sorted(set(values), key=lambda x: (isinstance(x, str), x))
        ints = all(isinstance(x, int) for x in v)
        if ints and len(v) > 2 and v == list(range(v[0], v[-1] + 1)):
            return f"{v[0]}-{v[-1]}"
        return ", ".join(map(str, v))
    ours, paper = list(ours), list(paper)
    if set(paper) <= set(ours):
        return None
    return f"{what} {listed(ours) if ours else 'none'} of the paper's {listed(paper)}"


def measured_header(meta: dict, runs: dict[str, list[dict]] | None) -> dict:
    """``meta`` with what every measured table states from its records (``runs``: name ->
    records): ``prompts`` per cell and ``decoding`` (greedy or the sampling settings), placed
    before ``sources``; keys ``meta`` already sets are kept. The one place both
    :func:`write_table` and the notebooks' renderer add them."""
    if not runs:
        return meta
    add = {"prompts": prompts_line(runs), "decoding": decoding_line([r for recs in runs.values() for r in recs])}
    out = {k: v for k, v in meta.items() if k != "sources"}
    for k, v in add.items():
        if v is not None and k not in meta:
            out[k] = v
    if "sources" in meta:
        out["sources"] = meta["sources"]
    return out


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """``df`` as a markdown table, missing cells (None, NaN) printed as :data:`MISSING`."""
    # tabulate applies missingval to None only: NaN would print as "nan"
    cells = df.astype(object).where(df.notna(), None)
    return cells.to_markdown(index=False, floatfmt=floatfmt, missingval=MISSING)


def write_table(df: pd.DataFrame, artifact_id: str, out_dir: Path, meta: dict, floatfmt: str = ".3f",
                runs: dict[str, list[dict]] | None = None) -> None:
    """Write ``tables/<id>.csv`` and ``tables/<id>.md``; the markdown names its provenance and,
    with ``runs`` (name -> the records behind the table), its prompts per cell and decoding mode
    (:func:`measured_header`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / f"{artifact_id}.csv", index=False)
    meta = measured_header(meta, runs)
    head = "\n".join(f"- **{k}**: {v}" for k, v in meta.items())
    md = f"# {artifact_id}\n\n{head}\n\n{to_markdown(df, floatfmt)}\n"
    (out_dir / f"{artifact_id}.md").write_text(md)


def main(argv=None) -> None:
    """``python -m common.harness.report RECORDS.jsonl ...``: the summary table of benchmark records."""
    from ..checks import ArgumentParser
    from ..errors import UserError
    from ..records import read_jsonl

    ap = ArgumentParser(prog="python -m common.harness.report",
                        description="summary per decoder of common.harness.bench records (tokens/s, speedup, "
                                    "mean accepted length, peak memory, identical to the baseline)")
    ap.add_argument("records", nargs="+", type=Path, help="JSONL files written by common.harness.bench")
    ap.add_argument("--baseline", default="vanilla", help="decoder the speedup is relative to")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table with provenance")
    a = ap.parse_args(argv)
    records = []
    for path in a.records:
        if not path.is_file():
            raise UserError(f"{path} is not a file; valid: a JSONL file written by common.harness.bench")
        try:
            records += read_jsonl(path)
        except ValueError as e:
            raise UserError(f"{path} is not JSONL ({e})") from None
    missing = sorted(BENCH_FIELDS - set().union(*map(set, records))) if records else sorted(BENCH_FIELDS)
    if missing:
        raise UserError(f"{', '.join(map(str, a.records))}: no common.harness.bench records (missing "
                        f"{', '.join(missing)}); valid: files written by python -m common.harness.bench")
    decoders = list(dict.fromkeys(r["decoder"] for r in records))
    if a.baseline not in decoders:  # summarize would just drop the speedup column
        raise UserError(f"--baseline {a.baseline!r} is not a decoder of these records; valid: {', '.join(decoders)}")
    df = summarize(records, a.baseline)
    if a.markdown:
        print("\n".join(f"- **{k}**: {v}" for k, v in provenance(records).items()) + "\n")
        print(df.to_markdown(index=False, floatfmt=".3f"))
    else:
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    from ..errors import cli_main

    cli_main(main)
