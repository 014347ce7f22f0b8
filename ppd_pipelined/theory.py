"""Section 4 of the PPD paper: the run-length model of latency and compute.

Model (Section 4.1). A transformer has ``d`` layers; PPD reads a top-``k`` early prediction
of the next token at layer ``d_bar`` and starts ``k`` sub-workers on those candidates while
the main worker finishes the last ``d - d_bar`` layers. Each token's early prediction
"matches" (one of the top-k equals the final top-1) independently with probability
``p`` (= p_correct). A *run* is a maximal stretch of tokens whose predictions matched; a
run of length X takes ``T_X = d + (X - 1) * d_bar`` time units.

Units. One *time unit* is the time of one layer forward; greedy decoding takes ``d`` time
units per token. *Compute* counts layer forwards summed over all workers (main + k
sub-workers), so greedy decoding spends ``d`` compute per token and uses 1 worker.

Two levels of the analysis:

* exact, finite length ``length`` (Theorem 4.1, needs ``d_bar >= d/2``):
  :func:`expected_latency`, :func:`expected_compute`, checked by :func:`simulate`;
* the ``length -> infinity`` limit, normalised to greedy (eqs. 3, 5, 6, derived for
  ``d_bar = d/2``): :func:`per_token_latency`, :func:`compute_per_time_unit`,
  :func:`compute_per_token`.

The paper's quoted figures (Section 4.3: "normalized latency per token ranges from 0.629
(SQUAD+tr, k=5) to 0.892 (WMT, k=1)", compute "1.561 to nearly 4.973 times") are the
limit forms with Table 2's layer-20 match rates (Vicuna-13B, d = 40, so d_bar = 20 = d/2):
SQuAD, trained head, k=5: p = 0.7415 and WMT, untrained head, k=1: p = 0.2163. Note that
(i) the compute factors are eq. 5, average compute *per time unit* (workers busy), not
eq. 6 per token (which gives 3.129 and 1.392), and (ii) they ignore the finite generation
length (16 tokens for SQuAD): Theorem 4.1 at length 16 gives a normalised latency of
0.652, not 0.629, because the first token of a sequence can never be predicted early.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Sequence

import numpy as np

from common.errors import UserError

__all__ = [
    "expected_latency", "expected_compute", "per_token_latency", "compute_per_time_unit",
    "compute_per_token", "Cost", "SimResult", "latency_from_matches", "simulate",
]


# ---------------------------------------------------------------- validation

def _bad(name: str, value, valid: str, why: str = "") -> UserError:
    return UserError(f"{name}={value!r} is out of range; valid: {valid}{why}")


def _check_int(name: str, value, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < lo:
        raise _bad(name, value, f"integer >= {lo}")


def _check_p(p) -> None:
    if isinstance(p, bool) or not isinstance(p, Real) or not 0 <= p <= 1:  # NaN fails too
        raise _bad("p", p, "[0, 1]")


def _check_layers(d, d_bar) -> None:
    if isinstance(d, bool) or not isinstance(d, Real) or not d >= 2:
        raise _bad("d", d, "a number of layers >= 2")
    if isinstance(d_bar, bool) or not isinstance(d_bar, Real) or not 1 <= d_bar < d:
        raise _bad("d_bar", d_bar, f"[1, d) = [1, {d})")
    if d_bar < d / 2:
        raise _bad("d_bar", d_bar, f"[d/2, d) = [{d / 2:g}, {d})",
                   " (Theorem 4.1 assumes the early exit is at or after the middle layer)")


def _check_frac(d_bar_frac) -> None:
    if isinstance(d_bar_frac, bool) or not isinstance(d_bar_frac, Real) \
            or not 0.5 <= d_bar_frac < 1:
        raise _bad("d_bar_frac", d_bar_frac, "[0.5, 1) (d_bar/d; Theorem 4.1 needs >= 1/2)")


def _check_all(d, d_bar, k, p, length) -> None:
    _check_layers(d, d_bar)
    _check_int("k", k, 1)
    _check_p(p)
    _check_int("length", length, 1)


# ---------------------------------------------------------- Theorem 4.1 (exact)

def expected_latency(d: float, d_bar: float, k: int, p: float, length: int) -> float:
    """Expected time, in layer-forward time units, to generate ``length`` tokens.

    Theorem 4.1: ``d*l - (d - d_bar)*(l - 1)*p``, from ``E[d_bar*l + (d - d_bar)*N]`` with
    the number of runs ``N = 1 + Bin(l - 1, 1 - p)``. ``k`` does not affect latency (it
    only changes ``p``) but is validated for symmetry with :func:`expected_compute`.
    """
    _check_all(d, d_bar, k, p, length)
    return d * length - (d - d_bar) * (length - 1) * p


def expected_compute(d: float, d_bar: float, k: int, p: float, length: int) -> float:
    """Expected compute, in layer forwards summed over all ``k + 1`` workers.

    Theorem 4.1: ``d*l - (d - d_bar)*(l - 1)*p + k*(d - d_bar)*l``: the main worker is
    busy for the whole latency, and for each of the ``l`` tokens ``k`` sub-workers run the
    next token's first ``d - d_bar`` layers.
    """
    return expected_latency(d, d_bar, k, p, length) + k * (d - d_bar) * length


# ------------------------------------------- limit forms, normalised to greedy

def per_token_latency(p: float, *, d_bar_frac: float = 0.5) -> float:
    """Per-token latency as a fraction of greedy's ``d`` time units (eq. 3), ``l -> inf``.

    Eq. 3 (``d_bar = d/2``): ``d * (1 - p/2)``; divided by ``d`` this is ``1 - p/2``. For
    another ``d_bar_frac = d_bar/d`` (>= 1/2) the limit of Theorem 4.1 is ``1 - (1 - f)*p``.
    """
    _check_p(p)
    _check_frac(d_bar_frac)
    return 1 - (1 - d_bar_frac) * p


def compute_per_time_unit(p: float, k: int, *, d_bar_frac: float = 0.5) -> float:
    """Average number of busy workers (compute per time unit; greedy = 1), eq. 5.

    Eq. 5 (``d_bar = d/2``): ``(k + 2 - p) / (2 - p)``: between ``(k + 2)/2`` at ``p = 0``
    and ``k + 1`` at ``p = 1``. General ``f = d_bar/d``:
    ``(1 + (k - p)*(1 - f)) / (1 - (1 - f)*p)``. These are the paper's "compute" factors
    (1.561 and 4.973) quoted in Section 4.3.
    """
    _check_int("k", k, 1)
    return compute_per_token(p, k, d_bar_frac=d_bar_frac) / per_token_latency(
        p, d_bar_frac=d_bar_frac)


def compute_per_token(p: float, k: int, *, d_bar_frac: float = 0.5) -> float:
    """Compute per token as a multiple of greedy's ``d`` layer forwards, eq. 6.

    Eq. 6 = eq. 3 x eq. 5 (``d_bar = d/2``): ``(2 + k - p) / 2``. General ``f = d_bar/d``:
    ``1 + (k - p)*(1 - f)``, the ``l -> inf`` limit of Theorem 4.1's compute over ``d*l``.
    """
    _check_p(p)
    _check_int("k", k, 1)
    _check_frac(d_bar_frac)
    return 1 + (k - p) * (1 - d_bar_frac)


# ------------------------------------------------- observed matches, simulation

@dataclass(frozen=True)
class Cost:
    """Latency (time units) and compute (layer forwards, all workers) of one generation."""
    latency: float
    compute: float


@dataclass(frozen=True)
class SimResult:
    """Monte Carlo means over ``n_runs`` generations and their standard errors."""
    latency: float
    latency_se: float
    compute: float
    compute_se: float
    n_runs: int


def _costs(d, d_bar, k, matches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run-length accounting along the last axis of a boolean ``matches`` array.

    ``N = 1 + #misses`` runs, run ``i`` costs ``T_X = d + (X_i - 1)*d_bar``, so the total
    is ``N*d + (l - N)*d_bar``; compute adds ``k*(d - d_bar)`` per token.
    """
    length = matches.shape[-1] + 1
    n_runs = 1 + (~matches).sum(axis=-1)
    latency = n_runs * d + (length - n_runs) * d_bar
    return latency, latency + k * (d - d_bar) * length


def latency_from_matches(d: float, d_bar: float, k: int, matches: Sequence[bool]) -> Cost:
    """Latency and compute of one generation, given its observed match sequence.

    ``matches[i]`` says whether token ``i + 2`` (1-based) was among the top-k early
    predictions made while its predecessor was decoded; the first token has no early
    prediction, so ``len(matches) == length - 1`` (an empty sequence means one token).
    """
    m = np.asarray(matches)
    if m.ndim != 1 or (m.size and m.dtype != bool):
        raise UserError(f"matches must be a 1-D sequence of booleans; got dtype {m.dtype}, "
                        f"shape {m.shape}")
    _check_layers(d, d_bar)
    _check_int("k", k, 1)
    latency, compute = _costs(d, d_bar, k, m.astype(bool))
    return Cost(float(latency), float(compute))


def simulate(d: float, d_bar: float, k: int, p: float, length: int,
             n_runs: int = 10_000, seed: int = 0) -> SimResult:
    """Monte Carlo of the run-length model: each of the ``length - 1`` early predictions
    matches independently with probability ``p``; returns means and standard errors."""
    _check_all(d, d_bar, k, p, length)
    _check_int("n_runs", n_runs, 2)
    rng = np.random.default_rng(seed)
    rows = max(1, 2**20 // length)  # draw in chunks of ~1M matches to bound memory
    parts = [_costs(d, d_bar, k, rng.random((min(rows, n_runs - i), length - 1)) < p)
             for i in range(0, n_runs, rows)]
    latency = np.concatenate([lat for lat, _ in parts])
    compute = np.concatenate([comp for _, comp in parts])

    def se(x: np.ndarray) -> float:
        return float(x.std(ddof=1) / math.sqrt(n_runs))

    return SimResult(float(latency.mean()), se(latency), float(compute.mean()), se(compute),
                     n_runs)


# ---------------------------------------------------------------- CLI
def _parse_args(argv=None):
    from common.checks import ArgumentParser

    ap = ArgumentParser(prog="python -m ppd_pipelined.theory",
                        description="Theorem 4.1 and its limit forms for one setting (time unit: one "
                                    "layer forward; greedy = d per token).")
    ap.add_argument("--d", type=float, required=True, help="layers of the model (e.g. 40)")
    ap.add_argument("--d-bar", type=float, required=True, help="early-exit layer, in [d/2, d)")
    ap.add_argument("--k", type=int, required=True, help="sub-workers (top-k candidates)")
    ap.add_argument("--p", type=float, required=True, help="match rate p_correct, in [0, 1]")
    ap.add_argument("--length", type=int, default=128, help="generated tokens (default 128)")
    ap.add_argument("--simulate", type=int, default=0, metavar="N_RUNS",
                    help="also run the Monte Carlo with this many generations (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    """Print Theorem 4.1's latency and compute, normalised to greedy, and their limits."""
    a = _parse_args(argv)
    d = int(a.d) if float(a.d).is_integer() else a.d
    d_bar = int(a.d_bar) if float(a.d_bar).is_integer() else a.d_bar
    latency = expected_latency(d, d_bar, a.k, a.p, a.length)
    compute = expected_compute(d, d_bar, a.k, a.p, a.length)
    greedy = d * a.length
    rows = [("expected latency (time units)", latency), ("  normalised to greedy", latency / greedy),
            ("expected compute (layer forwards)", compute), ("  normalised to greedy", compute / greedy)]
    frac = d_bar / d
    rows += [("limit l->inf: latency per token / greedy (eq. 3)", per_token_latency(a.p, d_bar_frac=frac)),
             ("limit: compute per time unit (eq. 5)", compute_per_time_unit(a.p, a.k, d_bar_frac=frac)),
             ("limit: compute per token / greedy (eq. 6)", compute_per_token(a.p, a.k, d_bar_frac=frac))]
    if a.simulate:
        sim = simulate(d, d_bar, a.k, a.p, a.length, n_runs=a.simulate, seed=a.seed)
        rows += [(f"Monte Carlo latency ({sim.n_runs} runs, +- s.e.)", f"{sim.latency:.4f} +- {sim.latency_se:.4f}"),
                 ("Monte Carlo compute", f"{sim.compute:.4f} +- {sim.compute_se:.4f}")]
    print(f"d={d}, d_bar={d_bar}, k={a.k}, p={a.p}, length={a.length}")
    for name, value in rows:
        print(f"{name:<52} {value:.4f}" if isinstance(value, float) else f"{name:<52} {value}")


if __name__ == "__main__":
    from common.errors import cli_main

    cli_main(main)
