"""Aladdin's worker count (papers/ALGORITHMS.md §2): instances per model `N = ceil(k5 · r + c5)`, fitted
online.

What is fitted: every round adds one point per model, (r, n*): r = the model's arrival rate over the
driver's window (requests/s), n* = the instances that load needed at the SLO = (requests running +
queued) / seats per instance, where the seats are the ready instances' mean concurrency cap (the local
autoscaler keeps a cap at the ITL target, so a cap is what one instance serves within the SLO; `seats`
until one reports). Least squares over the last `window` points gives k5 and c5; while the rates seen
are too alike to separate slope from intercept (their spread under `min_rate_spread`), the line through
the origin (k5 = Σ r·n / Σ r², c5 = 0). Points at r = 0 are not fitted.

The scaler moves the serving count to N (at least the runner's minimum; 0 with no arrivals): all the
missing instances at once, and one retired per round above it (the idle ones first).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gateway.core.types import InstanceClass, ModelName
from gateway.sched.plugins.autoscale.common import ready, retire_order, seats
from gateway.sched.plugins.autoscale.interface import (
    ModelScaleView,
    ScaleDecision,
    ScaleIn,
    ScaleOut,
    ScaleView,
)
from gateway.sched.registry import PluginKind, PluginSpec


class AladdinWorkersParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    window: Annotated[int, Meta(ge=2, le=100_000)] = 240  # points kept per model
    min_rate_spread: Annotated[float, Meta(ge=0.0)] = 0.05  # std of the rates (req/s) to fit an intercept
    seats: Annotated[int, Meta(ge=1, le=100_000)] = 16
    instance_class: Literal["interactive", "mixed", "batch"] = "mixed"


def fit_line(points: list[tuple[float, float]], min_spread: float) -> tuple[float, float]:
    """(k5, c5): least squares of n on r; through the origin when the rates barely differ."""
    n = len(points)
    if n == 0:
        return 0.0, 0.0
    mr = math.fsum(r for r, _ in points) / n
    mn = math.fsum(y for _, y in points) / n
    var = math.fsum((r - mr) ** 2 for r, _ in points) / n
    if n >= 3 and math.sqrt(var) >= min_spread and var > 0:
        k = math.fsum((r - mr) * (y - mn) for r, y in points) / (n * var)
        return k, mn - k * mr
    rr = math.fsum(r * r for r, _ in points)
    return (math.fsum(r * y for r, y in points) / rr if rr > 0 else 0.0), 0.0


class AladdinWorkersScaler:
    name = "aladdin-workers"

    def __init__(self, params: AladdinWorkersParams) -> None:
        self.p = params
        self.points: dict[ModelName, deque[tuple[float, float]]] = {}

    def fit(self, model: ModelName) -> tuple[float, float]:
        return fit_line(list(self.points.get(model, ())), self.p.min_rate_spread)

    def decide(self, view: ScaleView) -> list[ScaleDecision]:
        out: list[ScaleDecision] = []
        for mv in view.models.values():
            out += self._model(mv)
        return out

    def _model(self, mv: ModelScaleView) -> list[ScaleDecision]:
        p = self.p
        serving = mv.serving()
        per = seats(ready(serving), p.seats)
        needed = (sum(i.running for i in serving) + len(mv.queued)) / per
        r = mv.arrival_rate
        if r > 0:
            self.points.setdefault(mv.model, deque(maxlen=p.window)).append((r, needed))
        k5, c5 = self.fit(mv.model)
        target = max(mv.min_instances, math.ceil(k5 * r + c5 - 1e-9) if r > 0 else 0)
        n = len(serving)
        why = f"N = ceil({k5:.3g}·{r:.3g} + {c5:.3g}) = {target}"
        if target > n:
            return [ScaleOut(mv.model, InstanceClass(p.instance_class), target - n, None, why)]
        if target < n:
            order = retire_order(serving)
            if order:
                return [ScaleIn(order[0].id, why)]
        return []


SPEC = PluginSpec(
    PluginKind.SCALER,
    "aladdin-workers",
    AladdinWorkersParams,
    lambda p, ctx: AladdinWorkersScaler(p),
    "Aladdin: instances = ceil(k5·arrival rate + c5), fitted online by least squares",
)
