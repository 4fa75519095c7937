"""The online performance models: least-squares fits from synthetic observations drawn from known
coefficients (with noise and outliers), forgetting, the prior while data is missing or useless, and the
non-negativity of every fit."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.telemetry.perfmodel import PARTS, Part, PerfModelFitter
from gateway.telemetry.robust_regression import median, nnls

PRIOR = default_prior()


def coef(**kw: float) -> PerfCoefficients:
    return dataclasses.replace(PRIOR, **kw)  # type: ignore[arg-type]


# true models the fits must recover (the simulator's presets)
TRUTHS = {
    "fleet-7b": coef(k1=2.0e-4, c1=0.020, k2=2.0e-6, c2=1.0e-3, c3=0.025, h=1.0, j=1.0),
    "a100-13b": coef(k1=2.0e-4, c1=0.025, k2=6.0e-7, c2=2.5e-4, c3=0.020, h=1.0, j=8.0),
    "a100-70b": coef(k1=4.5e-4, c1=0.060, k2=1.4e-6, c2=6.0e-4, c3=0.045, h=0.5, j=16.0),
}


def feed(
    f: PerfModelFitter,
    true: PerfCoefficients,
    n: int,
    *,
    rng: random.Random,
    noise: float = 0.03,
    outliers: float = 0.0,
    max_batch: int = 32,
) -> None:
    """`n` observations of every kind from `true`, multiplicative gaussian noise, and a share of gross
    outliers that only ever add time (a stalled loop)."""

    def noisy(v: float) -> float:
        v *= rng.gauss(1.0, noise)
        if rng.random() < outliers:
            v *= rng.uniform(1.5, 4.0)
        return v

    for _ in range(n):
        p = rng.randint(4, 4096)
        f.observe_prefill(p, noisy(true.prefill_s(p)))
        b = rng.uniform(1, max_batch)
        ctx = rng.uniform(20, 3000)
        f.observe_decode(b, ctx, noisy(true.decode_iter_s(b, ctx)))
        c = rng.uniform(10, 4000)
        f.observe_kv(c, true.kv_tokens(c) * rng.gauss(1.0, noise / 3))
        f.observe_throughput(b, true.per_request_tps(b) * rng.gauss(1.0, noise))


def grid_errors(fit: PerfCoefficients, true: PerfCoefficients) -> dict[str, float]:
    prompts = [16, 64, 256, 1024, 4096]
    points = [(b, c) for b in (1, 2, 4, 8, 16, 32) for c in (50, 300, 1000, 3000)]
    contexts = [10, 100, 1000, 4000]

    def mape(pairs: list[tuple[float, float]]) -> float:
        return max(abs(p - t) / t for p, t in pairs)

    return {
        "prefill": mape([(fit.prefill_s(p), true.prefill_s(p)) for p in prompts]),
        "decode": mape([(fit.decode_iter_s(b, c), true.decode_iter_s(b, c)) for b, c in points]),
        "kv": mape([(fit.kv_tokens(c), true.kv_tokens(c)) for c in contexts]),
        "tps": mape([(fit.per_request_tps(n), true.per_request_tps(n)) for n in (1, 4, 16, 32)]),
    }


# ---- the coefficient formulas -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "args", "expected"),
    [
        ("prefill_s", (1000,), 1.0e-4 * 1000 + 0.015),
        ("decode_iter_s", (32, 500), (3.8e-7 * 500 + 1.5e-4) * 32 + 0.011),
        ("decode_iter_s", (1, 0), 1.5e-4 + 0.011),
        ("kv_tokens", (100,), 108.0),
        ("per_request_tps", (0,), 95.1),
        ("per_request_tps", (32,), 95.1 - 25.75 * math.log1p(0.179 * 32)),
    ],
    ids=["prefill", "decode", "decode-alone", "kv", "tps-idle", "tps-32"],
)
def test_formulas(method: str, args: tuple[float, ...], expected: float) -> None:
    assert getattr(PRIOR, method)(*args) == pytest.approx(expected)


def test_default_prior_matches_its_documentation() -> None:
    assert PRIOR.prefill_s(4096) == pytest.approx(0.425, abs=0.01)
    assert PRIOR.decode_iter_s(1, 500) == pytest.approx(0.0113, abs=0.0005)
    assert PRIOR.decode_iter_s(32, 500) == pytest.approx(0.022, abs=0.001)
    assert PRIOR.per_request_tps(1) == pytest.approx(1 / PRIOR.decode_iter_s(1, 500), rel=0.05)
    assert PRIOR.per_request_tps(32) == pytest.approx(1 / PRIOR.decode_iter_s(32, 500), rel=0.02)
    assert PRIOR.prefill_mape is None
    assert PRIOR.n_prefill == 0


def test_throughput_is_never_negative() -> None:
    assert coef(thr1=10.0, alpha=10.0, beta=1.0).per_request_tps(1e6) == 0.0


# ---- fits ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TRUTHS))
def test_fit_recovers_known_coefficients(name: str) -> None:
    true = TRUTHS[name]
    f = PerfModelFitter(PRIOR)
    feed(f, true, 1500, rng=random.Random(name))
    fit = f.refit()
    assert fit is f.current
    errors = grid_errors(fit, true)
    assert errors["prefill"] < 0.02
    assert errors["decode"] < 0.02
    assert errors["kv"] < 0.01
    assert errors["tps"] < 0.03
    for k in ("k1", "c1", "k2", "c2", "c3", "h"):
        assert getattr(fit, k) == pytest.approx(getattr(true, k), rel=0.05), k
    # the reported fit error is the noise level (3 % gaussian: mean absolute 2.4 %)
    for mape in (fit.prefill_mape, fit.decode_mape):
        assert mape is not None
        assert 0.015 < mape < 0.035
    assert (fit.n_prefill, fit.n_decode, fit.n_kv) == (1500, 1500, 1500)


def test_the_parts_fitted_one_at_a_time_equal_one_refit() -> None:
    whole, parts = PerfModelFitter(PRIOR), PerfModelFitter(PRIOR)
    for f in (whole, parts):
        feed(f, TRUTHS["a100-13b"], 300, rng=random.Random(7))
    for part in PARTS:
        parts.refit_part(part)
    assert parts.current == whole.refit()


@pytest.mark.parametrize("part", PARTS)
def test_a_part_fitted_in_steps_equals_its_fit_in_one_and_changes_only_at_the_last_step(part: Part) -> None:
    """`refit_steps` splits a part's fit (with a full window: the setup, one step per reweighting round,
    the throughput curve's β grid a slice at a time): the coefficients stay as they were until the last
    step, and then equal what `refit_part` gives."""
    whole, stepped = PerfModelFitter(PRIOR, window=500), PerfModelFitter(PRIOR, window=500)
    for f in (whole, stepped):
        feed(f, TRUTHS["a100-70b"], 600, rng=random.Random(11), outliers=0.05)
    before = stepped.current
    steps = 0
    for _ in stepped.refit_steps(part):
        steps += 1
        if stepped.current is not before:
            break
    assert steps >= 8  # 1 setup + 7 rounds, or 9 slices of the grid: split, not one turn
    assert stepped.current == whole.refit_part(part) != before
    assert stepped.on_prior == whole.on_prior == frozenset(PARTS) - {part}


def test_a_scale_of_the_prior_between_steps_is_kept_and_an_unfinished_fit_changes_nothing() -> None:
    f = PerfModelFitter(PRIOR)
    feed(f, TRUTHS["fleet-7b"], 200, rng=random.Random(2))
    steps = f.refit_steps("prefill")
    next(steps)
    scaled = f.scale_prior(2.0, 3.0)  # e.g. the calibration of a refresh in between
    for _ in steps:
        pass
    fitted = f.current
    assert (fitted.k2, fitted.c3) == (scaled.k2, scaled.c3) == (PRIOR.k2 * 3.0, PRIOR.c3 * 3.0)
    assert fitted.k1 != scaled.k1
    assert fitted.n_prefill == 200
    # a fit left half-way (the task cancelled at shutdown) neither changes the coefficients nor counts
    # as the window's fit: the next refit fits the part
    left = f.refit_steps("decode")
    next(left)
    next(left)
    del left
    assert f.current is fitted
    assert "decode" in f.on_prior
    assert f.refit_part("decode").n_decode == 200


def test_the_due_prior_parts_fitted_one_at_a_time_equal_refit_prior_parts() -> None:
    whole, parts = (PerfModelFitter(PRIOR, first_fit_min_obs=5) for _ in range(2))
    for f in (whole, parts):
        feed(f, TRUTHS["fleet-7b"], 8, rng=random.Random(5))  # past the first-fit threshold, not min_obs
    due = parts.prior_parts_due()
    assert due == ("prefill", "decode", "kv", "throughput")
    for part in due:
        parts.refit_part(part)
    assert parts.current == whole.refit_prior_parts()
    assert parts.prior_parts_due() == whole.prior_parts_due() == ()


def test_a_part_with_nothing_new_is_not_fitted_again() -> None:
    f = PerfModelFitter(PRIOR, refit_share=0.0)  # anything new: a refit
    feed(f, TRUTHS["fleet-7b"], 100, rng=random.Random(3))
    fitted = f.refit()
    assert f.refit() is fitted  # the same windows: no fit made, nothing replaced
    f.observe_kv(100.0, 101.0)
    again = f.refit()
    assert again is not fitted  # the KV window moved: that part was fitted again
    assert (again.k1, again.k2, again.thr1) == (fitted.k1, fitted.k2, fitted.thr1)
    assert again.n_kv == fitted.n_kv + 1


def test_a_fitted_part_is_fitted_again_once_its_new_observations_carry_the_refit_share() -> None:
    """100 in the window (half-life 500): the 5th new observation brings the new ones' share of the
    forgetting weight past 5 % (4: 4.1 %, 5: 5.1 %); a part on the prior is fitted whatever the share."""
    f = PerfModelFitter(PRIOR, refit_share=0.05)
    feed(f, TRUTHS["fleet-7b"], 100, rng=random.Random(3))
    fitted = f.refit()
    for _ in range(4):
        f.observe_kv(100.0, 101.0)
        assert f.refit() is fitted
    f.observe_kv(100.0, 101.0)
    again = f.refit()
    assert again.n_kv == 105
    assert (again.k1, again.k2, again.thr1) == (fitted.k1, fitted.k2, fitted.thr1)
    fresh = PerfModelFitter(PRIOR, refit_share=1.0, first_fit_min_obs=5)
    feed(fresh, TRUTHS["fleet-7b"], 5, rng=random.Random(3))
    assert fresh.refit().n_kv == 5
    fresh.observe_kv(100.0, 101.0)
    assert fresh.refit().n_kv == 5  # fitted: a share of 1 waits for a whole new window


def test_observations_the_fit_misses_by_far_refit_the_part_at_once() -> None:
    """Below the refit share, new observations that the fit misses by more than 3x its own error (the
    engine changed) are fitted at once; the median decides, so one outlier among them does not."""
    true = TRUTHS["fleet-7b"]
    f = PerfModelFitter(PRIOR, refit_share=0.05)
    feed(f, true, 300, rng=random.Random(4))
    fitted = f.refit()
    f.observe_prefill(1000, 3.0 * true.prefill_s(1000))  # an outlier, with two that agree
    f.observe_prefill(500, true.prefill_s(500))
    f.observe_prefill(200, true.prefill_s(200))
    assert f.refit() is fitted
    for p in (300, 700, 900):  # twice as slow now
        f.observe_prefill(p, 2.0 * true.prefill_s(p))
    again = f.refit()
    assert again.n_prefill == 306
    assert again.n_decode == fitted.n_decode  # the other parts wait for their share


@pytest.mark.parametrize("share", [0.05, 0.15], ids=["5%-outliers", "15%-outliers"])
def test_outliers_that_only_add_time_do_not_drag_the_fit(share: float) -> None:
    true = TRUTHS["fleet-7b"]
    f = PerfModelFitter(PRIOR)
    feed(f, true, 1500, rng=random.Random(7), outliers=share)
    errors = grid_errors(f.refit(), true)
    assert errors["prefill"] < 0.03
    assert errors["decode"] < 0.03


def test_noisy_short_observations_do_not_pull_the_fit_down() -> None:
    """Additive timing noise as large as the shortest prefill: a fit relative to the *observed* value
    would favour the observations that came out short."""
    true = TRUTHS["fleet-7b"]
    rng = random.Random(3)
    f = PerfModelFitter(PRIOR)
    for _ in range(1500):
        p = rng.randint(4, 1000)
        f.observe_prefill(p, max(1e-4, true.prefill_s(p) + rng.gauss(0.0, 0.006)))
    assert grid_errors(f.refit(), true)["prefill"] < 0.05


def test_fit_follows_a_change_of_coefficients() -> None:
    """Exponential forgetting: after the engine changes, the fit moves to the new model even though the
    window still holds old observations."""
    before, after = TRUTHS["fleet-7b"], TRUTHS["a100-70b"]
    rng = random.Random(11)
    forgetful = PerfModelFitter(PRIOR, window=2000, half_life=200)
    stubborn = PerfModelFitter(PRIOR, window=2000, half_life=1e9)
    for f in (forgetful, stubborn):
        feed(f, before, 1000, rng=rng)
        first = f.refit()
        assert grid_errors(first, before)["decode"] < 0.03
        feed(f, after, 1000, rng=rng)
    follows = grid_errors(forgetful.refit(), after)
    assert follows["prefill"] < 0.05
    assert follows["decode"] < 0.05
    # without forgetting the window's half-and-half mix keeps it far from the new model
    assert grid_errors(stubborn.refit(), after)["prefill"] > 0.10


def test_window_is_bounded() -> None:
    f = PerfModelFitter(PRIOR, window=100)
    feed(f, TRUTHS["fleet-7b"], 250, rng=random.Random(1))
    fit = f.refit()
    assert (fit.n_prefill, fit.n_decode, fit.n_kv) == (100, 100, 100)


# ---- the prior while the data cannot say ----------------------------------------------------------------
def test_too_few_observations_keep_the_prior_per_dimension() -> None:
    true = TRUTHS["fleet-7b"]
    f = PerfModelFitter(PRIOR, min_obs=20)
    rng = random.Random(5)
    for _ in range(50):
        p = rng.randint(4, 2000)
        f.observe_prefill(p, true.prefill_s(p))
    for _ in range(19):
        b, c = rng.uniform(1, 16), rng.uniform(10, 2000)
        f.observe_decode(b, c, true.decode_iter_s(b, c))
    fit = f.refit()
    assert fit.k1 == pytest.approx(true.k1, rel=1e-6)
    assert fit.c1 == pytest.approx(true.c1, rel=1e-6)
    assert fit.prefill_mape == pytest.approx(0.0, abs=1e-9)
    assert (fit.k2, fit.c2, fit.c3) == (PRIOR.k2, PRIOR.c2, PRIOR.c3)
    assert (fit.h, fit.j, fit.thr1, fit.alpha, fit.beta) == (
        PRIOR.h,
        PRIOR.j,
        PRIOR.thr1,
        PRIOR.alpha,
        PRIOR.beta,
    )
    assert fit.decode_mape is None
    assert (fit.n_decode, fit.n_prefill) == (0, 50)


def test_nothing_observed_is_the_prior() -> None:
    f = PerfModelFitter(PRIOR)
    assert f.refit() == PRIOR
    assert f.current == PRIOR


@pytest.mark.parametrize(
    "observe",
    [
        pytest.param(lambda f, i: f.observe_prefill(512, 0.1 + 1e-4 * (i % 3)), id="one-prompt-length"),
        pytest.param(lambda f, i: f.observe_decode(16, 100 + i, 0.05 + 1e-5 * i), id="one-batch-size"),
        pytest.param(lambda f, i: f.observe_kv(300, 310 + i % 2), id="one-context"),
        pytest.param(lambda f, i: f.observe_throughput(8, 30 + i % 2), id="one-concurrency"),
    ],
)
def test_ill_conditioned_systems_keep_the_prior(observe: object) -> None:
    f = PerfModelFitter(PRIOR)
    for i in range(200):
        observe(f, i)  # type: ignore[operator]
    assert f.refit() == PRIOR


def test_ill_conditioned_window_keeps_the_last_good_fit() -> None:
    true = TRUTHS["fleet-7b"]
    f = PerfModelFitter(PRIOR, window=100)
    rng = random.Random(2)
    for _ in range(100):
        p = rng.randint(4, 2000)
        f.observe_prefill(p, true.prefill_s(p))
    good = f.refit()
    for _ in range(100):  # the window now holds one prompt length only
        f.observe_prefill(512, 0.5)
    assert f.refit() == good


# ---- the first fit of a part still on the prior ----------------------------------------------------------
def _prefill(f: PerfModelFitter, true: PerfCoefficients, n: int, rng: random.Random) -> None:
    for _ in range(n):
        p = rng.randint(4, 2000)
        f.observe_prefill(p, true.prefill_s(p))


def due(f: PerfModelFitter) -> bool:
    return f.first_fit_due  # a call: mypy would narrow the property across the asserts


def test_a_part_on_the_prior_is_fitted_at_the_first_fit_threshold() -> None:
    true = TRUTHS["fleet-7b"]
    f = PerfModelFitter(PRIOR, min_obs=20, first_fit_min_obs=5)
    rng = random.Random(3)
    _prefill(f, true, 4, rng)
    assert not due(f)
    assert f.refit_prior_parts() == PRIOR
    _prefill(f, true, 1, rng)
    assert due(f)
    fit = f.refit_prior_parts()
    assert fit.k1 == pytest.approx(true.k1, rel=1e-6)
    assert fit.c1 == pytest.approx(true.c1, rel=1e-6)
    assert fit.n_prefill == 5
    assert (fit.k2, fit.c2, fit.c3, fit.h, fit.thr1) == (PRIOR.k2, PRIOR.c2, PRIOR.c3, PRIOR.h, PRIOR.thr1)
    assert f.on_prior == {"decode", "kv", "throughput"}
    assert not due(f)


def test_a_fitted_part_waits_for_min_obs_and_the_full_refit() -> None:
    true = TRUTHS["fleet-7b"]
    f = PerfModelFitter(PRIOR, min_obs=20, first_fit_min_obs=5)
    rng = random.Random(4)
    _prefill(f, true, 5, rng)
    first = f.refit()  # a full refit fits a part on the prior at the first-fit threshold too
    assert first.n_prefill == 5
    slower = coef(k1=2 * true.k1, c1=true.c1)
    _prefill(f, slower, 14, rng)  # 19 in all
    assert not due(f)  # no part on the prior has data: the fast check has nothing to do
    assert f.refit_prior_parts() == first
    assert f.refit() == first  # fitted: the next fit needs min_obs
    _prefill(f, slower, 1, rng)
    assert f.refit_prior_parts() == first  # the fast check never refits a fitted part
    again = f.refit()
    assert again.n_prefill == 20
    assert again.k1 > first.k1


def test_a_refused_first_fit_is_tried_again_only_with_new_observations() -> None:
    f = PerfModelFitter(PRIOR, min_obs=20, first_fit_min_obs=5)
    for i in range(5):  # one prompt length: the slope cannot be told from the intercept
        f.observe_prefill(512, 0.1 + 1e-4 * i)
    assert due(f)
    assert f.refit_prior_parts() == PRIOR
    assert not due(f)
    f.observe_prefill(1024, 0.2)
    assert due(f)
    assert f.refit_prior_parts().n_prefill == 6


def test_invalid_observations_are_dropped() -> None:
    f = PerfModelFitter(PRIOR, min_obs=1)
    f.observe_prefill(math.nan, 0.1)
    f.observe_prefill(100, math.inf)
    f.observe_prefill(100, 0.0)
    f.observe_prefill(-5, 0.1)
    f.observe_decode(0, 100, 0.1)
    f.observe_decode(4, 100, -0.1)
    f.observe_kv(100, 0)
    f.observe_throughput(-1, 10)
    assert f.refit() == PRIOR


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window"),
        ({"half_life": 0}, "half_life"),
        ({"min_obs": 0}, "min_obs"),
        ({"first_fit_min_obs": 0}, "first_fit_min_obs"),
        ({"refit_share": 1.5}, "refit_share"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PerfModelFitter(PRIOR, **kwargs)  # type: ignore[arg-type]


def test_a_zero_intercept_is_clamped_not_negative() -> None:
    """Data from a model without a fixed cost: the noisy unconstrained optimum may go below zero."""
    rng = random.Random(9)
    f = PerfModelFitter(PRIOR)
    for _ in range(500):
        p = rng.randint(100, 4000)
        f.observe_prefill(p, 2e-4 * p * rng.gauss(1.0, 0.05))
    fit = f.refit()
    assert fit.c1 >= 0.0
    assert fit.k1 == pytest.approx(2e-4, rel=0.03)


# ---- invariants ---------------------------------------------------------------------------------------
positive = st.floats(min_value=1e-6, max_value=1e4, allow_nan=False, allow_infinity=False)
size = st.floats(min_value=0.0, max_value=1e5, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    prefill=st.lists(st.tuples(size, positive), min_size=0, max_size=60),
    decode=st.lists(st.tuples(st.floats(min_value=0.5, max_value=512), size, positive), max_size=60),
    kv=st.lists(st.tuples(size, positive), max_size=60),
    tput=st.lists(st.tuples(st.floats(min_value=0.0, max_value=512), positive), max_size=60),
)
def test_every_fit_is_physically_sane(
    prefill: list[tuple[float, float]],
    decode: list[tuple[float, float, float]],
    kv: list[tuple[float, float]],
    tput: list[tuple[float, float]],
) -> None:
    """Whatever the observations: finite, non-negative coefficients, non-negative predictions."""
    f = PerfModelFitter(PRIOR, min_obs=3)
    for p, s in prefill:
        f.observe_prefill(p, s)
    for b, c, s in decode:
        f.observe_decode(b, c, s)
    for c, k in kv:
        f.observe_kv(c, k)
    for n, r in tput:
        f.observe_throughput(n, r)
    fit = f.refit()
    for name in ("k1", "c1", "k2", "c2", "c3", "h", "j", "thr1", "alpha", "beta"):
        value = getattr(fit, name)
        assert math.isfinite(value), name
        assert value >= 0, name
    assert fit.thr1 > 0
    assert fit.beta > 0
    for mape in (fit.prefill_mape, fit.decode_mape, fit.kv_mape):
        assert mape is None or (math.isfinite(mape) and mape >= 0)
    assert min(fit.prefill_s(0), fit.decode_iter_s(1, 0), fit.kv_tokens(0)) >= 0


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=3).flatmap(
        lambda p: st.tuples(
            st.lists(st.floats(-10, 10), min_size=(p + 2) * (p + 1), max_size=(p + 2) * (p + 1)),
            st.just(p),
        )
    )
)
def test_nnls_satisfies_the_kkt_conditions(data: tuple[list[float], int]) -> None:
    """c >= 0; the gradient vanishes where c > 0 and points outward (>= 0) where c = 0."""
    values, p = data
    rows = p + 2
    a = np.array(values[: rows * p]).reshape(rows, p)
    b = np.array(values[rows * p : rows * p + rows])
    gram, rhs = a.T @ a, a.T @ b
    if np.linalg.cond(gram) > 1e8:
        return
    c = nnls(gram, rhs)
    grad = gram @ c - rhs
    scale = 1e-6 * (
        1.0 + float(np.abs(gram).max()) * (1.0 + float(np.abs(c).max())) + float(np.abs(rhs).max())
    )
    assert np.all(c >= 0)
    for ci, gi in zip(c, grad, strict=True):
        if ci > 0:
            assert abs(gi) <= scale
        else:
            assert gi >= -scale


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False, allow_subnormal=False),
        min_size=1,
        max_size=60,
    )
)
def test_the_regression_median_is_numpys(values: list[float]) -> None:
    a = np.asarray(values)
    assert median(a) == float(np.median(a))
