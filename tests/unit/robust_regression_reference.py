"""The robust regression as it was written plainly (numpy's wrappers, one array operation per step), kept as
the reference the fast module (`gateway.telemetry.robust_regression`) is pinned to, number for number
(`test_robust_regression_fast.py`)."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np

from gateway.telemetry.robust_regression import (
    _BETA_SLICE,
    _BETAS,
    _HUBER_K,
    _HUBER_ROUNDS,
    _MAX_COND,
    _MIN_SCALE,
    _TUKEY_C,
    _TUKEY_ROUNDS,
    Array,
    LinearFit,
    Steps,
)


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
    norms = np.linalg.norm(a, axis=0)
    if not (norms > 0).all() or not np.linalg.cond(a / norms) <= _MAX_COND:  # also catches NaN and inf
        return None
    row = sw / median(y)
    robust = np.ones_like(y)
    beta = np.zeros(x.shape[1])
    for i in range(_HUBER_ROUNDS + _TUKEY_ROUNDS + 1):
        yield
        if np.count_nonzero(robust) <= x.shape[1]:
            break  # too few observations kept to say anything: keep the last answer
        # The normal equations of the rows scaled by row·√robust, with the columns scaled to unit norm,
        # formed from x weighted by the squared scale (the column norms are the Gram matrix's diagonal):
        # a quarter of a round's work less than scaling x itself, then its columns, then multiplying.
        xs = x * (row * row * robust)[:, None]
        gram = xs.T @ x
        sq = gram.diagonal()
        if not (sq > 0).all():
            break
        norms = np.sqrt(sq)
        # (`np.outer(norms, norms)` is this product, through a wrapper that costs more than the product)
        beta = nnls(gram / (norms[:, None] * norms), (xs.T @ y) / norms) / norms
        fitted = x @ beta
        if not (fitted > 0).all():
            break  # a zero prediction cannot be a relative scale; keep this round's answer
        u = np.abs(fitted - y) / fitted
        u = u / max(1.4826 * median(u), _MIN_SCALE)  # in robust standard deviations
        if i < _HUBER_ROUNDS:
            robust = np.minimum(1.0, _HUBER_K / np.maximum(u, 1e-300))
        else:
            robust = np.where(u < _TUKEY_C, (1.0 - (u / _TUKEY_C) ** 2) ** 2, 0.0)
        row = sw / fitted
    if not (beta > 0).any() or not np.isfinite(beta).all():
        return None
    err = np.abs(x @ beta - y) / y
    mape = float(np.sum(w * err) / np.sum(w))
    if not math.isfinite(mape):
        return None
    return LinearFit(tuple(float(v) for v in beta), mape, len(y))


def median(a: Array) -> float:
    """`np.median` of a non-empty 1-D array of finite values, the same number without its wrapper's cost
    (a fit takes seven): the middle of a partition, or the mean of the two middles."""
    n = len(a)
    k = n // 2
    if n % 2:
        return float(np.partition(a, k)[k])
    part = np.partition(a, (k - 1, k))
    return float((part[k - 1] + part[k]) / 2.0)


def nnls(gram: Array, rhs: Array) -> Array:
    """argmin ||A·c − b||² subject to c >= 0, given ``AᵀA`` and ``Aᵀb``, exactly, for a few columns: the
    optimum is the unconstrained solution on one face of the orthant (a subset of free columns) that is
    feasible; try every face and keep the feasible one with the least residual. At a face's unconstrained
    optimum the residual is ``bᵀb − cᵀ·Aᵀb``, so comparing ``cᵀ·Aᵀb`` suffices."""
    p = len(rhs)
    try:
        full: Array = np.asarray(np.linalg.solve(gram, rhs), dtype=np.float64)
    except np.linalg.LinAlgError:
        pass
    else:
        if (full >= 0).all():  # the unconstrained optimum is feasible: it is the answer
            return full
    best = np.zeros(p)
    best_gain = 0.0
    for size in range(p - 1, 0, -1):
        for cols in combinations(range(p), size):
            idx = list(cols)
            try:
                sol = np.linalg.solve(gram[np.ix_(idx, idx)], rhs[idx])
            except np.linalg.LinAlgError:
                continue
            if (sol < 0).any():
                continue
            gain = float(sol @ rhs[idx])
            if gain > best_gain:
                best = np.zeros(p)
                best[idx] = sol
                best_gain = gain
    return best


def fit_decay(n: Array, tps: Array, w: Array) -> Steps[tuple[float, float, float] | None]:
    """MaaSO's ``tps = thr1 − α·ln(1 + β·n)``: for every β of a log grid, the (thr1, α >= 0) that minimise
    the weighted squared relative error in closed form; the best β wins. In steps: the grid's sums a
    slice of `_BETA_SLICE` columns at a time."""
    if np.ptp(n) <= 0:  # one concurrency level: the decay cannot be seen
        return None
    wr = w / (tps * tps)  # relative errors: weight each squared residual by 1/tps^2
    wry = wr * tps
    sw = float(np.sum(wr))
    sy = float(np.sum(wry))
    sums: list[tuple[Array, Array, Array]] = []
    for at in range(0, len(_BETAS), _BETA_SLICE):
        if at:
            yield
        g = -np.log1p(np.outer(n, _BETAS[at : at + _BETA_SLICE]))  # column k is the α-feature for β_k
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
    sse = float(np.sum(wr * tps * tps)) - 2 * (thr1 * sy + alpha * sgy)
    sse = sse + thr1 * thr1 * sw + 2 * thr1 * alpha * sg + alpha * alpha * sgg
    k = int(np.argmin(sse))
    if not thr1[k] > 0 or not math.isfinite(float(sse[k])) or not math.isfinite(float(alpha[k] + thr1[k])):
        return None
    return float(thr1[k]), float(alpha[k]), float(_BETAS[k])
