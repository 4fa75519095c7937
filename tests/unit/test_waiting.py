"""Waiting-time estimates: the formulas against hand-computed values, and simulations of queues whose
actual waits the estimates must explain (R²) and bound (coverage)."""

from __future__ import annotations

import heapq
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.lengths import LengthPrediction
from gateway.telemetry.waiting import WaitEstimate, cantelli_factor, wait_cato, wait_for_position, wait_normal

Z90, Z99 = 1.2815515655446004, 2.3263478740408408


def pred(mean: float, std: float) -> LengthPrediction:
    return LengthPrediction(mean=mean, std=std, p50=mean, p90=mean, p99=mean, n=10)


@pytest.mark.parametrize(
    ("mean", "var", "tps", "quantile", "tail", "expected"),
    [
        (1000, 10_000, 100, 0.9, "normal", WaitEstimate(10.0, 10.0 + Z90)),
        (1000, 10_000, 100, 0.99, "normal", WaitEstimate(10.0, 10.0 + Z99)),
        (1000, 10_000, 100, 0.5, "normal", WaitEstimate(10.0, 10.0)),
        (1000, 10_000, 100, 0.9, "cantelli", WaitEstimate(10.0, 13.0)),  # sqrt(0.9 / 0.1) = 3
        (1000, 0, 50, 0.9, "normal", WaitEstimate(20.0, 20.0)),
        (0, 0, 100, 0.9, "normal", WaitEstimate(0.0, 0.0)),
        (0, 0, 0, 0.9, "normal", WaitEstimate(0.0, 0.0)),  # nothing ahead: no wait, even with no rate
        (500, 100, 0, 0.9, "normal", WaitEstimate(math.inf, math.inf)),
        (100, 1_000_000, 100, 0.1, "normal", WaitEstimate(1.0, 0.0)),  # a low quantile never goes negative
        (-5, -1, 100, 0.9, "normal", WaitEstimate(0.0, 0.0)),
    ],
    ids=[
        "p90",
        "p99",
        "median",
        "cantelli",
        "no-variance",
        "nothing-ahead",
        "nothing-ahead-no-rate",
        "no-rate",
        "low-quantile",
        "negative-input",
    ],
)
def test_wait_normal(  # noqa: PLR0917 (one argument per column of the table)
    mean: float, var: float, tps: float, quantile: float, tail: str, expected: WaitEstimate
) -> None:
    got = wait_normal(mean, var, tps, quantile=quantile, tail=tail)  # type: ignore[arg-type]
    assert got.mean_s == pytest.approx(expected.mean_s)
    assert got.bound_s == pytest.approx(expected.bound_s)


@pytest.mark.parametrize("quantile", [0.0, 1.0, -0.5, 2.0])
def test_quantile_must_be_a_probability(quantile: float) -> None:
    with pytest.raises(ValueError, match="quantile"):
        wait_normal(10, 1, 1, quantile=quantile)


@pytest.mark.parametrize(
    ("tau", "factor"), [(0.1, 3.0), (0.5, 1.0), (1.0, 0.0), (0.01, math.sqrt(99)), (0.2, 2.0)]
)
def test_cantelli_factor(tau: float, factor: float) -> None:
    assert cantelli_factor(tau) == pytest.approx(factor)


@pytest.mark.parametrize("tau", [0.0, -0.1, 1.5])
def test_cantelli_needs_a_probability(tau: float) -> None:
    with pytest.raises(ValueError, match="tau"):
        cantelli_factor(tau)


def test_wait_for_position_sums_means_and_variances() -> None:
    ahead = [pred(100, 30), pred(200, 40), pred(300, 0)]
    got = wait_for_position(ahead, 60.0, quantile=0.9)
    assert got.mean_s == pytest.approx(10.0)
    assert got.bound_s == pytest.approx((600 + Z90 * 50) / 60)  # sqrt(30² + 40²) = 50
    assert wait_for_position([], 60.0) == WaitEstimate(0.0, 0.0)


def test_wait_cato_sums_expected_completions() -> None:
    assert wait_cato([1.5, 2.0, 0.25]) == pytest.approx(3.75)
    assert wait_cato([]) == 0.0
    assert wait_cato([1.0, -3.0]) == 1.0  # an overdue request adds nothing, it does not give time back


@settings(max_examples=100, deadline=None)
@given(
    ahead=st.lists(st.tuples(st.floats(0, 5000), st.floats(0, 3000)), max_size=40),
    tps=st.floats(0.1, 1e4),
    q=st.floats(0.5, 0.999),
)
def test_bounds_are_ordered(ahead: list[tuple[float, float]], tps: float, q: float) -> None:
    preds = [pred(m, s) for m, s in ahead]
    normal = wait_for_position(preds, tps, quantile=q)
    cantelli = wait_for_position(preds, tps, quantile=q, tail="cantelli")
    assert 0 <= normal.mean_s <= normal.bound_s <= cantelli.bound_s + 1e-9
    assert cantelli.mean_s == normal.mean_s


# ---- simulations --------------------------------------------------------------------------------------
def lognormal_lengths(rng: random.Random, n: int, mean: float, sigma: float) -> list[float]:
    mu = math.log(mean) - sigma * sigma / 2
    return [rng.lognormvariate(mu, sigma) for _ in range(n)]


def r_squared(pred_s: list[float], actual: list[float]) -> float:
    p, a = np.array(pred_s), np.array(actual)
    return 1.0 - float(np.sum((a - p) ** 2) / np.sum((a - a.mean()) ** 2))


MEAN, SIGMA = 338.0, 0.9
STD = MEAN * math.sqrt(math.expm1(SIGMA * SIGMA))


@pytest.mark.parametrize("queued", [200, 2000])
def test_chiron_estimate_explains_the_actual_sums(queued: int) -> None:
    """One server at a fixed token rate: the actual wait of position k is the actual tokens ahead / rate;
    the estimate from predicted means explains it (Chiron reports R² 0.99 at 2 000 queued)."""
    rng = random.Random(queued)
    tps = 500.0
    lengths = lognormal_lengths(rng, queued, MEAN, SIGMA)
    preds = [pred(MEAN, STD)] * queued
    actual = list(np.cumsum([0.0, *lengths[:-1]]) / tps)
    predicted = [wait_for_position(preds[:k], tps).mean_s for k in range(queued)]
    assert r_squared(predicted, actual) >= (0.9 if queued < 1000 else 0.98)


def test_normal_bound_covers_its_quantile_once_enough_are_ahead() -> None:
    """Central limit theorem: with 200 ahead the sum is close to normal and the p90 bound holds for
    about 90 % of queues."""
    rng = random.Random(4)
    tps, ahead, trials = 500.0, 200, 2000
    bound = wait_for_position([pred(MEAN, STD)] * ahead, tps, quantile=0.9).bound_s
    cantelli = wait_for_position([pred(MEAN, STD)] * ahead, tps, quantile=0.9, tail="cantelli").bound_s
    waits = [sum(lognormal_lengths(rng, ahead, MEAN, SIGMA)) / tps for _ in range(trials)]
    covered = sum(w <= bound for w in waits) / trials
    assert 0.86 <= covered <= 0.94
    assert sum(w <= cantelli for w in waits) / trials >= 0.9  # distribution-free: holds, loosely


def test_slots_wait_for_all_but_the_last_slots_minus_one_ahead() -> None:
    """B slots serving FCFS, each at `rate` tokens/s: position k starts when k - B + 1 of those before it
    have finished; the estimate over those requests at B x rate explains the start times."""
    rng = random.Random(8)
    slots, rate, queued = 8, 40.0, 400
    lengths = lognormal_lengths(rng, queued, MEAN, SIGMA)
    free = [0.0] * slots  # when each slot frees up
    starts: list[float] = []
    for n in lengths:
        t = heapq.heappop(free)
        starts.append(t)
        heapq.heappush(free, t + n / rate)
    preds = [pred(MEAN, STD)] * queued
    predicted = [
        wait_for_position(preds[: max(0, k - slots + 1)], slots * rate).mean_s for k in range(queued)
    ]
    assert r_squared(predicted, starts) >= 0.95
    # with the lengths known exactly, what is left is the choice of "ahead": all but the last B - 1 is
    # nearly exact, everyone before it overestimates by the running requests' remaining work
    exact = [pred(n, 0.0) for n in lengths]
    some = [wait_for_position(exact[: max(0, k - slots + 1)], slots * rate).mean_s for k in range(queued)]
    everyone = [wait_for_position(exact[:k], slots * rate).mean_s for k in range(queued)]
    assert r_squared(some, starts) >= 0.99
    assert r_squared(some, starts) > r_squared(everyone, starts)
