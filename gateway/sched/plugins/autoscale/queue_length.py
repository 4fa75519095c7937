"""Queue-length scaling (Ray Serve's autoscaler, the CATO baseline), per model.

desired = ceil((requests running + queued) / `target_per_instance`), at least `min_instances` of the
runner. Above the instances serving it scales out to `desired` at once (after `upscale_delay_s` of
wanting to: Ray's upscale delay); below, it retires one instance per round once `desired` has stayed
below for `downscale_delay_s` (Ray's downscale delay), the idle ones first.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gateway.core.types import InstanceClass, ModelName
from gateway.sched.plugins.autoscale.common import retire_order
from gateway.sched.plugins.autoscale.interface import (
    ModelScaleView,
    ScaleDecision,
    ScaleIn,
    ScaleOut,
    ScaleView,
)
from gateway.sched.registry import PluginKind, PluginSpec


class QueueLengthParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    target_per_instance: Annotated[float, Meta(gt=0.0)] = 2.0  # Ray Serve's target_ongoing_requests
    upscale_delay_s: Annotated[float, Meta(ge=0.0)] = 30.0
    downscale_delay_s: Annotated[float, Meta(ge=0.0)] = 600.0
    instance_class: Literal["interactive", "mixed", "batch"] = "mixed"


class QueueLengthScaler:
    name = "queue-length"

    def __init__(self, params: QueueLengthParams) -> None:
        self.p = params
        self._up_since: dict[ModelName, float] = {}
        self._down_since: dict[ModelName, float] = {}

    def decide(self, view: ScaleView) -> list[ScaleDecision]:
        out: list[ScaleDecision] = []
        for mv in view.models.values():
            out += self._model(mv, view.now)
        return out

    def _model(self, mv: ModelScaleView, now: float) -> list[ScaleDecision]:
        p = self.p
        serving = mv.serving()
        work = sum(i.running for i in serving) + len(mv.queued)
        desired = max(mv.min_instances, math.ceil(work / p.target_per_instance))
        n = len(serving)
        if desired > n:
            self._down_since.pop(mv.model, None)
            since = self._up_since.setdefault(mv.model, now)
            if now - since >= p.upscale_delay_s:
                del self._up_since[mv.model]
                return [
                    ScaleOut(
                        mv.model,
                        InstanceClass(p.instance_class),
                        desired - n,
                        None,
                        f"{work} ongoing over {n} instance(s), target {p.target_per_instance:g} each",
                    )
                ]
            return []
        self._up_since.pop(mv.model, None)
        if desired < n:
            since = self._down_since.setdefault(mv.model, now)
            if now - since >= p.downscale_delay_s:
                order = retire_order(serving)
                if order:
                    return [ScaleIn(order[0].id, f"{work} requests ongoing want {desired} instance(s)")]
            return []
        self._down_since.pop(mv.model, None)
        return []


SPEC = PluginSpec(
    PluginKind.SCALER,
    "queue-length",
    QueueLengthParams,
    lambda p, ctx: QueueLengthScaler(p),
    "Ray Serve-like: ongoing requests per instance toward a target, with up/down-scale delays",
)
