"""What predictions are asked with and what they answer (`gateway.sched.predict` makes them): the
prediction parameters a plugin configures, a prediction for one request on one endpoint, the harm a
newcomer does a running request, and the seats an endpoint runs at once."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Literal

from gateway.sched.load_terms import RunningState
from gateway.sched.snapshot import seats_of

Tail = Literal["mean", "normal", "cantelli"]


@dataclass(frozen=True, slots=True)
class PredictParams:
    tail: Tail = "mean"
    tau: float = 0.1  # violation probability of a tail bound
    prefill_overhead: float = 0.1  # decode slow-down by prefills of new arrivals (0.1: 10 %)
    # Standard deviations added to a mean: 0, the normal quantile, or Cantelli's factor (from `tail` and
    # `tau`, once: every load reads it).
    gamma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.tau < 1.0:
            raise ValueError("tau must be in (0, 1)")
        if not 0.0 <= self.prefill_overhead <= 10.0:
            raise ValueError("prefill_overhead must be in [0, 10]")
        object.__setattr__(self, "gamma", _gamma(self.tail, self.tau))


@functools.lru_cache(maxsize=64)
def _gamma(tail: Tail, tau: float) -> float:
    if tail == "normal":
        return NormalDist().inv_cdf(1.0 - tau)
    if tail == "cantelli":
        return math.sqrt((1.0 - tau) / tau)
    return 0.0


@dataclass(frozen=True, slots=True)
class Harm:
    """The delay a new request would cause a running one, against the time it has in hand."""

    state: RunningState
    target: Literal["ttft", "e2e", "itl"]
    delay: float  # seconds (per token for "itl")
    saved: float  # seconds in hand (per token for "itl"), >= 0
    left: float  # seconds until its deadline (the target itself for "itl")


@dataclass(frozen=True, slots=True)
class Prediction:
    """Seconds from now, for one request on one endpoint."""

    wait_s: float  # until its prefill starts (a seat, then the iteration in flight)
    ttft_s: float  # until its first token
    e2e_s: float  # until its last token
    tpot_s: float  # per output token after the first
    output_tokens: float  # the output length the prediction assumed (tail-adjusted)

    @property
    def service_s(self) -> float:
        """Its own time on the endpoint once its turn comes (CATO's remaining completion)."""
        return self.e2e_s - self.wait_s


__all__ = ["Harm", "PredictParams", "Prediction", "Tail", "seats_of"]
