"""The robust regression's fast form (`gateway.telemetry.robust_regression`: the p×p system in Python
floats, LAPACK's solve without numpy's wrapper) against its plain form (`robust_regression_reference`):
the same steps and the same numbers, bit for bit, so a fit, and every decision made from it, is unchanged.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.perf import default_prior
from gateway.telemetry import robust_regression as fast
from gateway.telemetry.perfmodel import PerfModelFitter
from tests.unit import robust_regression_reference as plain

T = TypeVar("T")

# Sizes as the performance model's windows hold them: a few (first fits) to a few hundred.
sizes = st.integers(min_value=1, max_value=300)
# Values from a small set as often as not: repeated sizes make ill-conditioned and singular systems.
values = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, 512.0]),
    st.floats(min_value=0.0, max_value=1e5, allow_subnormal=False),
)
noise = st.floats(min_value=-0.9, max_value=9.0)  # relative: outliers up to ten times the model


def run(steps: Generator[None, None, T]) -> tuple[int, T]:
    """A fit's steps to the end, under the fits' error state: how many, and the result."""
    n = 0
    with np.errstate(all="ignore"):
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: T = done.value
                return n, result
            n += 1


@st.composite
def linear_problem(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A prefill/KV (size, 1) or decode (batch·context, batch, 1) design, times from positive (or
    slanted, to push a coefficient to its bound) coefficients with noise, and forgetting weights."""
    n = draw(sizes)
    decode = draw(st.booleans())
    a = np.array(draw(st.lists(values, min_size=n, max_size=n)))
    if decode:
        b = np.array(draw(st.lists(st.sampled_from([1.0, 2.0, 8.0, 64.0]), min_size=n, max_size=n)))
        x = np.column_stack((a * b, b, np.ones(n)))
    else:
        x = np.column_stack((a, np.ones(n)))
    coef = np.array(
        draw(
            st.lists(
                st.floats(min_value=-1e-3, max_value=1e-2),
                min_size=x.shape[1],
                max_size=x.shape[1],
            )
        )
    )
    eps = np.array(draw(st.lists(noise, min_size=n, max_size=n)))
    y = np.abs(x @ coef) * (1.0 + eps) + draw(st.floats(min_value=1e-6, max_value=1.0))
    half_life = draw(st.sampled_from([5.0, 500.0, 1e9]))
    longer = n + draw(st.sampled_from([0, 1, 7, 300]))  # the weights as the tail of a longer window's
    w = np.exp2(-np.arange(longer - 1, -1, -1, dtype=np.float64) / half_life)[longer - n :]
    return x, y, w


@settings(max_examples=400, deadline=None)
@given(linear_problem())
def test_fit_linear_is_the_plain_fit(problem: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    x, y, w = problem
    steps, got = run(fast.fit_linear(x, y, w))
    ref_steps, want = run(plain.fit_linear(x, y, w))
    assert steps == ref_steps
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.coef, got.mape, got.n) == (want.coef, want.mape, want.n)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([1, 4]).flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.integers(min_value=1, max_value=60).flatmap(
                lambda n: st.lists(values, min_size=n * p, max_size=n * p)
            ),
            st.lists(noise, min_size=60, max_size=60),
        )
    )
)
def test_fit_linear_of_other_widths_is_the_plain_fit(data: tuple[int, list[float], list[float]]) -> None:
    """The round's system spelled out for two and three columns (the models' designs) and its general form
    for the others: one column (an intercept alone) or four give the plain fit's numbers too."""
    p, cells, eps = data
    n = len(cells) // p
    x = np.array(cells).reshape(n, p)
    if p == 1:
        x = np.ones((n, 1)) + x / 1e5  # a scale about 1, as an intercept column is
    y = np.abs(x @ np.linspace(1e-3, 1e-2, p)) * (1.0 + np.array(eps[:n])) + 1e-3
    w = np.exp2(-np.arange(n - 1, -1, -1, dtype=np.float64) / 500.0)
    steps, got = run(fast.fit_linear(x, y, w))
    ref_steps, want = run(plain.fit_linear(x, y, w))
    assert steps == ref_steps
    assert (None if got is None else (got.coef, got.mape, got.n)) == (
        None if want is None else (want.coef, want.mape, want.n)
    )


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=3).flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.lists(
                st.one_of(st.sampled_from([0.0, 1.0, -1.0]), st.floats(-10, 10)),
                min_size=(p + 2) * (p + 1),
                max_size=(p + 2) * (p + 1),
            ),
        )
    )
)
def test_nnls_is_the_plain_nnls(data: tuple[int, list[float]]) -> None:
    """Singular systems included (repeated and zero columns): the plain form skips a face whose solve
    raises, the fast one a face that solves to NaN."""
    p, vals = data
    rows = p + 2
    a = np.array(vals[: rows * p]).reshape(rows, p)
    b = np.array(vals[rows * p :])
    gram, rhs = a.T @ a, a.T @ b
    got = fast.nnls(gram, rhs)
    want = plain.nnls(gram, rhs)
    assert got.tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=200).flatmap(
        lambda n: st.tuples(
            st.lists(st.sampled_from([1.0, 2.0, 3.0, 16.0, 100.0]), min_size=n, max_size=n),
            st.lists(st.floats(min_value=0.5, max_value=200.0), min_size=n, max_size=n),
        )
    )
)
def test_fit_decay_is_the_plain_fit(data: tuple[list[float], list[float]]) -> None:
    conc, tps = np.array(data[0]), np.array(data[1])
    w = np.exp2(-np.arange(len(conc) - 1, -1, -1, dtype=np.float64) / 500.0)
    assert run(fast.fit_decay(conc, tps, w)) == run(plain.fit_decay(conc, tps, w))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50))
def test_median_is_the_plain_median(vals: list[float]) -> None:
    a = np.array(vals)
    assert fast.median(a) == plain.median(a) == float(np.median(a))
    assert a.tolist() == vals  # not partitioned in place
    assert fast.median(a.copy(), scratch=True) == plain.median(a)  # a scratch array partitioned in place


@pytest.mark.parametrize("half_life", [1.0, 37.5, 500.0, 1e9])
def test_window_weights_are_the_plain_weights(half_life: float) -> None:
    """A fitter's weights for every window length are the ones computed for that length alone."""
    f = PerfModelFitter(default_prior(), window=2000, half_life=half_life)
    for n in range(1, 2001):
        want = np.exp2(-np.arange(n - 1, -1, -1, dtype=np.float64) / half_life)
        assert f._weights(n).tolist() == want.tolist()


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=50).flatmap(lambda n: st.lists(values, min_size=2 * n, max_size=2 * n))
)
def test_design_is_column_stack(vals: list[float]) -> None:
    n = len(vals) // 2
    a, b = np.array(vals[:n]), np.array(vals[n:])
    for got, want in (
        (fast.design(a), np.column_stack((a, np.ones(n)))),
        (fast.design(a * b, b), np.column_stack((a * b, b, np.ones(n)))),
    ):
        assert got.flags.c_contiguous
        assert want.flags.c_contiguous
        assert got.tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5, -1.0, 1e-3]), min_size=9, max_size=9),
    st.lists(st.floats(min_value=-1e3, max_value=1e3), min_size=3, max_size=3),
)
def test_public_solve_fallback_answers_as_the_kernel(cells: list[float], rhs: list[float]) -> None:
    """Without numpy's private kernel the public wrapper answers the same: the same solution where the
    system is regular, NaN where it is singular (which the kernel gives and `nnls` skips)."""
    a = np.array(cells).reshape(3, 3)
    b = np.array(rhs)
    with np.errstate(all="ignore"):
        kernel = fast._solve(a, b)
    checked = fast._solve_checked(a, b)
    if np.isnan(checked).any():
        assert np.isnan(kernel).all()
    else:
        np.testing.assert_array_equal(kernel, checked)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.lists(
                st.one_of(st.sampled_from([0.0, 1.0, -1.0, 1e-8, 1e8]), st.floats(-1e3, 1e3)),
                min_size=p * (p + 3),
                max_size=p * (p + 3),
            ),
        )
    )
)
def test_the_condition_check_is_the_public_one(data: tuple[int, list[float]]) -> None:
    p, cells = data
    a = np.array(cells).reshape(p + 3, p)
    try:
        want: bool | None = bool(np.linalg.cond(a) <= fast._MAX_COND)
    except np.linalg.LinAlgError:
        want = None
    try:
        got: bool | None = fast._conditioned(a)
    except np.linalg.LinAlgError:
        got = None
    assert got == want
