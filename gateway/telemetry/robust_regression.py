"""The robust regression steps behind the performance models (`gateway.telemetry.perfmodel`): weighted
least squares on relative errors with non-negative coefficients, iteratively reweighted (Huber, then
Tukey's biweight), and the throughput curve's fit over a grid of β, each in steps of bounded work.

Sans-IO and stateless: arrays in, coefficients (or None when the fit is refused) out.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from itertools import combinations
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

# Column-scaled condition number above which a fit is refused (about 4 of 16 digits lost).
_MAX_COND: Final = 1e4
_HUBER_K: Final = 1.345  # Huber's constant (95 % efficiency under normal noise), in robust std devs
_HUBER_ROUNDS: Final = 2
_TUKEY_C: Final = 4.685  # Tukey's biweight constant (95 % efficiency): beyond it a residual weighs 0
_TUKEY_ROUNDS: Final = 4
_MIN_SCALE: Final = 1e-3  # floor of the robust residual scale (relative error)
_BETAS: Final = np.geomspace(1e-3, 1e2, 81)
_BETA_SLICE: Final = 9  # the β grid's columns per step of the throughput fit (9 steps)

# `np.sum`'s and `ndarray.all`'s reductions without their dispatch
_sum: Final = np.add.reduce
_all: Final = np.logical_and.reduce
_min: Final = np.minimum.reduce
_abs: Final = np.absolute
_maximum: Final = np.maximum
_minimum: Final = np.minimum
_divide: Final = np.divide
_subtract: Final = np.subtract
_fmin: Final = np.fmin
_sqrt: Final = math.sqrt

T = TypeVar("T")
#: A fit in steps of bounded work (see `PerfModelFitter.refit_steps`): each `next` runs one, the value
#: comes with the last.
Steps = Generator[None, None, T]


@dataclass(frozen=True, slots=True)
class LinearFit:
    """A linear fit's coefficients, its weighted mean absolute relative error and its observations."""

    coef: tuple[float, ...]
    mape: float
    n: int


def fit_linear(x: Array, y: Array, w: Array) -> Steps[LinearFit | None]:
    """Non-negative weighted least squares on relative errors, robustly reweighted; None when the
    system is ill-conditioned or the only sane answer is all zeros. In steps: the condition check, then
    one per round.

    Iteratively reweighted: a plain weighted least-squares start, then rounds whose residuals are
    relative to the *fitted* value (dividing by a noisy observation would give the observations that
    came out short the largest weights), first with Huber weights, then with Tukey's biweight, which
    gives gross outliers no weight at all: timing noise on a busy host is skewed (a late timer or a GC
    pause only ever adds time) and would otherwise pull the fit."""
    sw = np.sqrt(w)
    a = x * sw[:, None]
    norms = np.sqrt(_sum(a * a, axis=0))  # `np.linalg.norm(a, axis=0)`'s own expression, unwrapped
    if not _all(norms > 0) or not _conditioned(a / norms):  # also catches NaN and inf
        return None
    row = sw / median(y)
    robust = np.ones_like(y)
    beta = np.zeros(x.shape[1])
    p = x.shape[1]
    for i in range(_HUBER_ROUNDS + _TUKEY_ROUNDS + 1):
        yield
        if np.count_nonzero(robust) <= p:
            break  # too few observations kept to say anything: keep the last answer
        # The normal equations of the rows scaled by row·√robust, with the columns scaled to unit norm,
        # formed from x weighted by the squared scale (the column norms are the Gram matrix's diagonal):
        # a quarter of a round's work less than scaling x itself, then its columns, then multiplying.
        # The products over the rows are numpy's; the few numbers of the p×p system are Python floats
        # (the same IEEE operations as numpy's elementwise ones, without a call per operation).
        scale = row * row
        scale *= robust
        xst = (x * scale[:, None]).T
        solved = _scaled_solve((xst @ x).tolist(), (xst @ y).tolist())
        if solved is None:
            break
        beta = np.array(solved)
        fitted = x @ beta
        if not _min(fitted) > 0:  # every one positive (NaN is not): `(fitted > 0).all()`
            break  # a zero prediction cannot be a relative scale; keep this round's answer
        # The residuals and their weights in place, one scratch array: the same elementwise operations
        # in the same order as ``u = |fitted - y| / fitted; u = u / scale`` and the weights' expressions
        # (``v ** 2`` is ``v * v`` in numpy), without a new array per operation.
        u = fitted - y
        _abs(u, out=u)
        u /= fitted
        u /= max(1.4826 * median(u), _MIN_SCALE)  # in robust standard deviations
        if i < _HUBER_ROUNDS:
            robust = _maximum(u, 1e-300)
            _divide(_HUBER_K, robust, out=robust)
            _minimum(robust, 1.0, out=robust)  # `np.minimum(1.0, ·)`: the same (NaN either way)
        else:
            # ``np.where(u < c, (1 - (u / c)²)², 0)`` for u >= 0 or NaN: u at or past c (or NaN) taken
            # as c gives (1 - 1)² = 0 exactly, the rest the same operations on the same numbers
            robust = _fmin(u, _TUKEY_C)
            robust /= _TUKEY_C
            robust *= robust
            _subtract(1.0, robust, out=robust)
            robust *= robust
        row = sw / fitted
    if not (beta > 0).any() or not np.isfinite(beta).all():
        return None
    err = np.abs(x @ beta - y) / y
    mape = float(_sum(w * err) / _sum(w))
    if not math.isfinite(mape):
        return None
    return LinearFit(tuple(float(v) for v in beta), mape, len(y))


def _scaled_solve(gram: list[list[float]], rhs: list[float]) -> list[float] | None:
    """A round's coefficients from its Gram matrix and right-hand side (Python floats): the system with
    its columns scaled to unit norm, solved non-negatively (`_nnls`), scaled back; None when a column's
    norm is not positive. Spelled out for two and three columns (the models' designs): the same
    operations as the general form, without a list made per step."""
    p = len(rhs)
    if p == 2:
        (g00, g01), (g10, g11) = gram
        if not (g00 > 0 and g11 > 0):
            return None
        n0, n1 = _sqrt(g00), _sqrt(g11)
        scaled = [[g00 / (n0 * n0), g01 / (n0 * n1)], [g10 / (n1 * n0), g11 / (n1 * n1)]]
        c = _nnls(scaled, [rhs[0] / n0, rhs[1] / n1])
        return [c[0] / n0, c[1] / n1]
    if p == 3:
        (g00, g01, g02), (g10, g11, g12), (g20, g21, g22) = gram
        if not (g00 > 0 and g11 > 0 and g22 > 0):
            return None
        n0, n1, n2 = _sqrt(g00), _sqrt(g11), _sqrt(g22)
        scaled = [
            [g00 / (n0 * n0), g01 / (n0 * n1), g02 / (n0 * n2)],
            [g10 / (n1 * n0), g11 / (n1 * n1), g12 / (n1 * n2)],
            [g20 / (n2 * n0), g21 / (n2 * n1), g22 / (n2 * n2)],
        ]
        c = _nnls(scaled, [rhs[0] / n0, rhs[1] / n1, rhs[2] / n2])
        return [c[0] / n0, c[1] / n1, c[2] / n2]
    cols = range(p)
    sq = [gram[k][k] for k in cols]
    if not all(s > 0 for s in sq):
        return None
    norms = [_sqrt(s) for s in sq]
    scaled = [[gram[a][b] / (norms[a] * norms[b]) for b in cols] for a in cols]
    c = _nnls(scaled, [v / n for v, n in zip(rhs, norms, strict=True)])
    return [v / n for v, n in zip(c, norms, strict=True)]


def median(a: Array, *, scratch: bool = False) -> float:
    """`np.median` of a non-empty 1-D array of finite values, the same number without its wrapper's cost
    (a fit takes seven): the middle of a partition, or the mean of the two middles. `scratch`: `a` is
    the caller's to lose, partitioned in place instead of a copy of it."""
    n = len(a)
    k = n // 2
    part = a if scratch else a.copy()  # what `np.partition` does, without its wrapper
    if n % 2:
        part.partition(k)
        return float(part[k])
    part.partition((k - 1, k))
    return float((part[k - 1] + part[k]) / 2.0)


def nnls(gram: Array, rhs: Array) -> Array:
    """argmin ||A·c − b||² subject to c >= 0, given ``AᵀA`` and ``Aᵀb``, exactly, for a few columns: the
    optimum is the unconstrained solution on one face of the orthant (a subset of free columns) that is
    feasible; try every face and keep the feasible one with the least residual. At a face's unconstrained
    optimum the residual is ``bᵀb − cᵀ·Aᵀb``, so comparing ``cᵀ·Aᵀb`` suffices."""
    with np.errstate(all="ignore"):  # a singular system solves to NaN (`_solve`), and is then skipped
        return np.array(_nnls(gram.tolist(), rhs.tolist()))


def _nnls(gram: list[list[float]], rhs: list[float]) -> list[float]:
    """`nnls` of a Gram matrix and right-hand side given as Python floats; its answer likewise. Under an
    error state that ignores invalid values (the fits' own)."""
    p = len(rhs)
    full: list[float] = _solve(np.array(gram), np.array(rhs)).tolist()
    if all(v >= 0 for v in full):  # the unconstrained optimum is feasible: it is the answer (NaN is not)
        return full
    best = [0.0] * p
    best_gain = 0.0
    for size in range(p - 1, 0, -1):
        for cols in combinations(range(p), size):
            sub = np.array([rhs[i] for i in cols])
            sol = _solve(np.array([[gram[i][j] for j in cols] for i in cols]), sub)
            if not (sol >= 0).all():
                continue  # infeasible, or singular (NaN)
            gain = float(sol @ sub)
            if gain > best_gain:
                best = [0.0] * p
                for i, v in zip(cols, sol.tolist(), strict=True):
                    best[i] = v
                best_gain = gain
    return best


def _conditioned_checked(a: Array) -> bool:
    """`_conditioned` through numpy's public wrapper: for a numpy whose private kernel is not where it was."""
    return bool(np.linalg.cond(a) <= _MAX_COND)


def _conditioned_kernel() -> Callable[[Array], bool]:
    """`np.linalg.cond(a) <= _MAX_COND` (the largest singular value over the smallest) with the singular
    values from `np.linalg.svd`'s LAPACK kernel, called without the wrappers (their checks and error
    states cost more than the 2- or 3-column decomposition): the same singular values, the same
    quotient; a zero smallest one refuses, as the wrapper's infinite or NaN quotient does, and a
    decomposition that does not converge (NaN) raises `LinAlgError` as the wrapper does. Without the
    kernel (`numpy.linalg._umath_linalg.svd`, numpy 1.26 to 2.x), the public wrapper."""
    try:
        from numpy.linalg import _umath_linalg

        svd = _umath_linalg.svd
    except (ImportError, AttributeError):  # pragma: no cover - numpy moved its kernel
        return _conditioned_checked

    def conditioned(a: Array) -> bool:
        with np.errstate(invalid="ignore"):  # a decomposition that does not converge gives NaN
            s: list[float] = svd(a, signature="d->d").tolist()
        if not all(map(math.isfinite, s)):
            raise np.linalg.LinAlgError("SVD did not converge")
        return s[-1] > 0 and s[0] / s[-1] <= _MAX_COND

    return conditioned


#: Whether `a`'s condition number is at most `_MAX_COND` (see `_conditioned_kernel`).
_conditioned: Final = _conditioned_kernel()


def _solve_checked(a: Array, b: Array) -> Array:
    """`_solve` through numpy's public wrapper: for a numpy whose private kernel is not where it was."""
    try:
        solved: Array = np.linalg.solve(a, b).astype(np.float64, copy=False)
    except np.linalg.LinAlgError:
        return np.full(len(b), np.nan)
    return solved


def _kernel() -> Callable[[Array, Array], Array]:
    """`np.linalg.solve`'s LAPACK kernel for a vector right-hand side, called without the wrapper (its
    checks and error state cost more than a 3×3 solve), so a singular `a` gives NaN (and the
    floating-point invalid flag) instead of raising `LinAlgError`. The kernel is numpy's private
    `numpy.linalg._umath_linalg.solve1` (numpy 1.26 to 2.x); without it, the public wrapper."""
    try:
        from numpy.linalg import _umath_linalg

        solve1 = _umath_linalg.solve1
    except (ImportError, AttributeError):  # pragma: no cover - numpy moved its kernel
        return _solve_checked

    def solve(a: Array, b: Array) -> Array:
        result: Array = solve1(a, b, signature="dd->d")
        return result

    return solve


#: `np.linalg.solve(a, b)` for a square `a` and a vector `b`, a singular `a` giving NaN (see `_kernel`).
_solve: Final = _kernel()


def fit_decay(n: Array, tps: Array, w: Array) -> Steps[tuple[float, float, float] | None]:
    """MaaSO's ``tps = thr1 − α·ln(1 + β·n)``: for every β of a log grid, the (thr1, α >= 0) that minimise
    the weighted squared relative error in closed form; the best β wins. In steps: the grid's sums a
    slice of `_BETA_SLICE` columns at a time."""
    if np.ptp(n) <= 0:  # one concurrency level: the decay cannot be seen
        return None
    wr = w / (tps * tps)  # relative errors: weight each squared residual by 1/tps^2
    wry = wr * tps
    sw = float(_sum(wr))
    sy = float(_sum(wry))
    sums: list[tuple[Array, Array, Array]] = []
    column = n[:, None]
    for at in range(0, len(_BETAS), _BETA_SLICE):
        if at:
            yield
        # column k is the α-feature for β_k (`np.outer`'s product, without its wrapper)
        g = -np.log1p(column * _BETAS[None, at : at + _BETA_SLICE])
        sums.append((wr @ g, wr @ (g * g), wry @ g))
    sg, sgg, sgy = (np.concatenate(col) for col in zip(*sums, strict=True))
    det = sw * sgg - sg * sg
    ok = det > 1e-12 * sw * sgg
    safe = np.where(ok, det, 1.0)
    alpha = np.where(ok, (sw * sgy - sg * sy) / safe, 0.0)
    thr1 = np.where(ok, (sy - alpha * sg) / sw, sy / sw)
    # α < 0 would be throughput growing with load: the constrained optimum is then α = 0, thr1 = mean
    neg = alpha < 0
    alpha = np.where(neg, 0.0, alpha)
    thr1 = np.where(neg, sy / sw, thr1)
    sse = float(_sum(wr * tps * tps)) - 2 * (thr1 * sy + alpha * sgy)
    sse = sse + thr1 * thr1 * sw + 2 * thr1 * alpha * sg + alpha * alpha * sgg
    k = int(np.argmin(sse))
    if not thr1[k] > 0 or not math.isfinite(float(sse[k])) or not math.isfinite(float(alpha[k] + thr1[k])):
        return None
    return float(thr1[k]), float(alpha[k]), float(_BETAS[k])


def design(*columns: Array) -> Array:
    """The design matrix of `columns` and an intercept column of ones (`np.column_stack`'s C-ordered
    array, without its wrapper)."""
    x = np.ones((len(columns[0]), len(columns) + 1))
    for k, column in enumerate(columns):
        x[:, k] = column
    return x


@functools.cache
def window_weights(size: int, half_life: float) -> Array:
    """``2^(-age / half_life)`` for the ages ``size - 1`` down to 0, read-only (shared by every fitter)."""
    age = np.arange(size - 1, -1, -1, dtype=np.float64)  # the newest observation is the last
    weights = np.exp2(-age / half_life)
    weights.flags.writeable = False
    return weights
