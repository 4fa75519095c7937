"""Waiting-time bounds from queued output tokens (Chiron's queue estimate), the pure math shared by
telemetry (`gateway.telemetry.waiting`, which explains the model) and the sans-IO autoscalers: the wait
for ``Σ tokens ahead`` at ``tokens_per_s``, with the sum's mean and variance, and a bound at a quantile
of a normal (central limit) or Cantelli's distribution-free bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

Tail = Literal["normal", "cantelli"]

_STANDARD_NORMAL = NormalDist()


@dataclass(frozen=True, slots=True)
class WaitEstimate:
    """Seconds: the expected wait and a bound the wait stays under with the requested probability."""

    mean_s: float
    bound_s: float


def cantelli_factor(tau: float) -> float:
    """``sqrt((1 − τ) / τ)``: P(X ≥ μ + factor · σ) ≤ τ for any distribution (one-sided Chebyshev)."""
    if not 0 < tau <= 1:
        raise ValueError("tau (a violation probability) must be in (0, 1]")
    return math.sqrt((1.0 - tau) / tau)


def wait_normal(
    tokens_ahead_mean: float,
    tokens_ahead_var: float,
    tokens_per_s: float,
    *,
    quantile: float = 0.9,
    tail: Tail = "normal",
) -> WaitEstimate:
    """The wait for `tokens_ahead_mean` (± sqrt(var)) tokens at `tokens_per_s`; the bound is the
    `quantile` of a normal (or the Cantelli bound for that probability). Infinite when tokens are ahead
    and nothing is being served; never negative."""
    if not 0 < quantile < 1:
        raise ValueError("quantile must be in (0, 1)")
    mean_tokens = max(0.0, tokens_ahead_mean)
    std_tokens = math.sqrt(max(0.0, tokens_ahead_var))
    if mean_tokens == 0 and std_tokens == 0:
        return WaitEstimate(0.0, 0.0)
    if not tokens_per_s > 0:
        return WaitEstimate(math.inf, math.inf)
    factor = cantelli_factor(1.0 - quantile) if tail == "cantelli" else _STANDARD_NORMAL.inv_cdf(quantile)
    mean_s = mean_tokens / tokens_per_s
    bound_s = max(0.0, (mean_tokens + factor * std_tokens) / tokens_per_s)
    return WaitEstimate(mean_s, bound_s)
