"""Arrival processes: offsets in [0, duration) for a mean rate (requests or tasks per second).

- ``poisson``: exponential gaps (coefficient of variation 1);
- ``gamma``: gamma-distributed gaps with the given coefficient of variation ``cv`` (MaaSO's burstiness
  knob): shape ``k = 1/cv²``, scale ``1/(rate·k)``; cv > 1 is burstier than Poisson, cv < 1 smoother.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

ArrivalKind = Literal["poisson", "gamma"]


def arrival_times(
    kind: ArrivalKind, rate: float, duration_s: float, rng: random.Random, *, cv: float = 1.0
) -> list[float]:
    if rate <= 0 or duration_s <= 0:
        return []
    if kind == "poisson":
        shape, scale = 1.0, 1.0 / rate
    elif kind == "gamma":
        if cv <= 0:
            raise ValueError("cv must be > 0")
        shape = 1.0 / (cv * cv)
        scale = 1.0 / (rate * shape)
    else:
        raise ValueError(f"unknown arrival process {kind!r} (poisson | gamma)")
    out: list[float] = []
    t = rng.gammavariate(shape, scale)
    while t < duration_s:
        out.append(t)
        t += rng.gammavariate(shape, scale)
    return out


def arrival_fn(
    kind: ArrivalKind, rng: random.Random, *, cv: float = 1.0
) -> Callable[[float, float], list[float]]:
    """Bind a process to an RNG; workloads call ``fn(rate, duration_s)`` (possibly once per class)."""

    def fn(rate: float, duration_s: float) -> list[float]:
        return arrival_times(kind, rate, duration_s, rng, cv=cv)

    return fn
