"""Utilization-band scaling (Llumnix-like: the Chiron baseline), per model.

Utilization = requests running over the seats (concurrency caps) of the ready instances, the mean over
them. Queued work scales out at once: `ceil(queued / seats per instance)` more instances (Llumnix starts
instances as soon as requests wait). Otherwise utilization above `high` adds one instance, below `low`
retires one (the idle ones first); inside the band nothing changes.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gateway.core.types import InstanceClass
from gateway.sched.plugins.autoscale.common import ready, retire_order, seats
from gateway.sched.plugins.autoscale.interface import (
    ModelScaleView,
    ScaleDecision,
    ScaleIn,
    ScaleOut,
    ScaleView,
)
from gateway.sched.registry import PluginKind, PluginSpec


class UtilizationBandParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    low: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.4
    high: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.8
    seats: Annotated[int, Meta(ge=1, le=100_000)] = 16  # per instance until one reports its cap
    instance_class: Literal["interactive", "mixed", "batch"] = "mixed"

    def __post_init__(self) -> None:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")


class UtilizationBandScaler:
    name = "utilization-band"

    def __init__(self, params: UtilizationBandParams) -> None:
        self.p = params

    def decide(self, view: ScaleView) -> list[ScaleDecision]:
        out: list[ScaleDecision] = []
        for mv in view.models.values():
            out += self._model(mv)
        return out

    def _model(self, mv: ModelScaleView) -> list[ScaleDecision]:
        p = self.p
        serving = mv.serving()
        rdy = ready(serving)
        cls = InstanceClass(p.instance_class)
        per = seats(rdy, p.seats)
        starting = len(serving) - len(rdy)
        if mv.queued:
            # instances already starting count toward the queued work
            add = math.ceil(len(mv.queued) / per) - starting
            if add > 0:
                return [ScaleOut(mv.model, cls, add, None, f"{len(mv.queued)} requests queued")]
            return []
        capacity = sum(i.cap if i.cap is not None else p.seats for i in rdy)
        if not capacity:
            return []
        util = sum(i.running for i in rdy) / capacity
        if util > p.high and not starting:
            return [ScaleOut(mv.model, cls, 1, None, f"utilization {util:.2f} above {p.high:g}")]
        if util < p.low:
            order = retire_order(rdy)
            if order and len(serving) > 1:
                return [ScaleIn(order[0].id, f"utilization {util:.2f} below {p.low:g}")]
        return []


SPEC = PluginSpec(
    PluginKind.SCALER,
    "utilization-band",
    UtilizationBandParams,
    lambda p, ctx: UtilizationBandScaler(p),
    "Llumnix-like: mean utilization inside a band; queued work scales out at once",
)
