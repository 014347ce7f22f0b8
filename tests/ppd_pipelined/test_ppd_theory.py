"""Pipelined decoding (ppd_pipelined): theory (Section 4): Theorem 4.1 vs. Monte Carlo, the paper's quoted numbers, edges."""
from __future__ import annotations

import math

import pytest

from common.errors import UserError
from ppd_pipelined.theory import (
    compute_per_time_unit, compute_per_token, expected_compute, expected_latency,
    latency_from_matches, per_token_latency, simulate,
)

# Table 2, layer 20 of Vicuna-13B (d = 40, so d_bar = d/2), as quoted in Section 4.3.
P_SQUAD_TRAINED_K5 = 0.7415   # SQUAD, k=5, trained "Y": 74.15%
P_WMT_UNTRAINED_K1 = 0.2163   # WMT, k=1, untrained "N": 21.63%


@pytest.mark.parametrize("d, d_bar, k, p, length", [
    (40, 20, 5, P_SQUAD_TRAINED_K5, 16),
    (40, 20, 1, P_WMT_UNTRAINED_K1, 128),
    (40, 30, 3, 0.5, 7),
    (7, 4, 2, 0.9, 1),
    (24, 23, 1, 0.05, 50),
])
def test_simulator_matches_theorem(d, d_bar, k, p, length):
    sim = simulate(d, d_bar, k, p, length, n_runs=20_000, seed=1)
    lat, comp = expected_latency(d, d_bar, k, p, length), expected_compute(d, d_bar, k, p, length)
    assert abs(sim.latency - lat) <= 4 * sim.latency_se + 1e-9
    assert abs(sim.compute - comp) <= 4 * sim.compute_se + 1e-9
    if length > 1:
        assert sim.latency_se > 0


def test_paper_quoted_numbers():
    # "normalized latency per token ranges from 0.629 (SQUAD+tr, k=5) to 0.892 (WMT, k=1)"
    assert round(per_token_latency(P_SQUAD_TRAINED_K5), 3) == 0.629
    assert round(per_token_latency(P_WMT_UNTRAINED_K1), 3) == 0.892
    # "latency improvements of between 10.8% and 37.1%"
    assert round(1 - per_token_latency(P_WMT_UNTRAINED_K1), 3) == 0.108
    assert round(1 - per_token_latency(P_SQUAD_TRAINED_K5), 3) == 0.371
    # "additional computational resources ... by a factor of 1.561 to nearly 4.973": eq. 5
    assert round(compute_per_time_unit(P_SQUAD_TRAINED_K5, 5), 3) == 4.973
    assert round(compute_per_time_unit(P_WMT_UNTRAINED_K1, 1), 3) == 1.561
    # eq. 6 = eq. 3 x eq. 5 (per token, not what the text quotes)
    for p, k in [(P_SQUAD_TRAINED_K5, 5), (P_WMT_UNTRAINED_K1, 1)]:
        assert compute_per_token(p, k) == pytest.approx(
            per_token_latency(p) * compute_per_time_unit(p, k))
        assert compute_per_token(p, k) == pytest.approx((2 + k - p) / 2)


@pytest.mark.parametrize("frac", [0.5, 0.75])
def test_limit_forms_are_theorem_limits(frac):
    d, k, p, length = 40, 3, 0.6, 10**7
    d_bar = frac * d
    lat, comp = expected_latency(d, d_bar, k, p, length), expected_compute(d, d_bar, k, p, length)
    assert lat / (d * length) == pytest.approx(per_token_latency(p, d_bar_frac=frac), rel=1e-6)
    assert comp / lat == pytest.approx(compute_per_time_unit(p, k, d_bar_frac=frac), rel=1e-6)
    assert comp / (d * length) == pytest.approx(compute_per_token(p, k, d_bar_frac=frac), rel=1e-6)


def test_edge_cases():
    d, d_bar, k, length = 40, 20, 3, 16
    # p = 0: every token decoded from scratch (greedy latency); sub-workers always wasted.
    assert expected_latency(d, d_bar, k, 0.0, length) == d * length
    assert expected_compute(d, d_bar, k, 0.0, length) == d * length + k * (d - d_bar) * length
    # p = 1: one run, T = d + (l - 1) * d_bar.
    assert expected_latency(d, d_bar, k, 1.0, length) == d + (length - 1) * d_bar
    # one token: nothing to predict early, p is irrelevant.
    assert expected_latency(d, d_bar, k, 0.3, 1) == d
    # limits (eqs. 3, 5, 6)
    assert per_token_latency(0.0) == 1 and per_token_latency(1.0) == 0.5
    assert compute_per_time_unit(0.0, k) == (k + 2) / 2
    assert compute_per_time_unit(1.0, k) == k + 1
    assert compute_per_token(0.0, k) == (k + 2) / 2 and compute_per_token(1.0, k) == (k + 1) / 2
    for p in (0.0, 1.0):  # deterministic: zero spread
        sim = simulate(d, d_bar, k, p, length, n_runs=50)
        assert sim.latency == expected_latency(d, d_bar, k, p, length) and sim.latency_se == 0
        assert sim.compute == expected_compute(d, d_bar, k, p, length) and sim.compute_se == 0


def test_latency_from_matches():
    d, d_bar, k = 40, 20, 2
    # runs of length 3, 1, 2 -> 3 runs, 6 tokens
    cost = latency_from_matches(d, d_bar, k, [True, True, False, False, True])
    assert cost.latency == (d + 2 * d_bar) + d + (d + d_bar)
    assert cost.compute == cost.latency + k * (d - d_bar) * 6
    assert latency_from_matches(d, d_bar, k, []).latency == d
    # Figure 2: X = 3, k = 3, p = 1 -> latency d + 2 d_bar, 4 workers for 3 (d - d_bar)
    c = latency_from_matches(40, 25, 3, [True, True])
    assert c.latency == 40 + 2 * 25
    assert c.compute == 4 * 3 * 15 + (c.latency - 3 * 15)


@pytest.mark.parametrize("call, name", [
    (lambda: expected_latency(40, 20, 0, 0.5, 16), "k=0"),
    (lambda: expected_latency(40, 40, 1, 0.5, 16), "d_bar=40"),
    (lambda: expected_latency(40, 0, 1, 0.5, 16), "d_bar=0"),
    (lambda: expected_latency(40, 19, 1, 0.5, 16), "d_bar=19"),
    (lambda: expected_compute(40, 20, 1, 1.5, 16), "p=1.5"),
    (lambda: expected_compute(40, 20, 1, -0.1, 16), "p=-0.1"),
    (lambda: expected_compute(40, 20, 1, math.nan, 16), "p=nan"),
    (lambda: expected_latency(40, 20, 1, 0.5, 0), "length=0"),
    (lambda: simulate(40, 20, 1, 0.5, 0, n_runs=10), "length=0"),
    (lambda: simulate(40, 10, 1, 0.5, 8, n_runs=10), "d_bar=10"),
    (lambda: per_token_latency(2.0), "p=2.0"),
    (lambda: per_token_latency(0.5, d_bar_frac=0.4), "d_bar_frac=0.4"),
    (lambda: compute_per_time_unit(0.5, 0), "k=0"),
    (lambda: compute_per_token(0.5, 1, d_bar_frac=1.0), "d_bar_frac=1.0"),
    (lambda: latency_from_matches(40, 20, 0, [True]), "k=0"),
    (lambda: latency_from_matches(40, 20, 1, [1, 0]), "booleans"),
])
def test_bad_input_raises_user_error(call, name):
    with pytest.raises(UserError, match="valid|booleans") as e:
        call()
    assert name in str(e.value)
