"""CATO's SLA-aware scaling (papers/ALGORITHMS.md §1), per model.

A finished call is a slack violation when it took longer than its allotted time by at least
`max_exceeded_proportion` (`took > allotted · (1 + p)`; the allotted time is the call's E2E target, else
its TTFT target: its share of the task SLA; `took` is measured the same way: E2E, or time to first
token). Violations are counted per model; once the count exceeds
`max_exceeded_times` and exceeds the number of idle instances (ready, running nothing), the scaler adds
`min(max − existing, violations − idle)` instances and resets the count. With idle instances at least as
many as the violations it does nothing (the router should use them). Instances idle for `idle_timeout_s`
are removed (down to the runner's minimum).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gateway.core.types import InstanceClass, ModelName
from gateway.sched.plugins.autoscale.common import idle_for, ready, retire_order
from gateway.sched.plugins.autoscale.interface import (
    ModelScaleView,
    ScaleDecision,
    ScaleIn,
    ScaleOut,
    ScaleView,
)
from gateway.sched.registry import PluginKind, PluginSpec


class CatoSlaParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    max_exceeded_proportion: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.2
    max_exceeded_times: Annotated[int, Meta(ge=0, le=1_000_000)] = 3
    idle_timeout_s: Annotated[float, Meta(gt=0.0)] = 60.0
    instance_class: Literal["interactive", "mixed", "batch"] = "mixed"


class CatoSlaScaler:
    name = "cato-sla"

    def __init__(self, params: CatoSlaParams) -> None:
        self.p = params
        self.violations: dict[ModelName, int] = {}

    def decide(self, view: ScaleView) -> list[ScaleDecision]:
        out: list[ScaleDecision] = []
        for mv in view.models.values():
            out += self._model(mv, view.now)
        return out

    def _model(self, mv: ModelScaleView, now: float) -> list[ScaleDecision]:
        p = self.p
        count = self.violations.get(mv.model, 0)
        for c in mv.finished:
            if (
                c.allotted_s is not None
                and c.took_s is not None
                and c.took_s > c.allotted_s * (1.0 + p.max_exceeded_proportion)
            ):
                count += 1
        self.violations[mv.model] = count
        serving = mv.serving()
        idle = [i for i in ready(serving) if i.running == 0]
        if count > p.max_exceeded_times and count > len(idle):
            add = min(mv.max_instances - len(serving), count - len(idle))
            self.violations[mv.model] = 0
            if add > 0:
                return [
                    ScaleOut(
                        mv.model,
                        InstanceClass(p.instance_class),
                        add,
                        None,
                        f"{count} slack violations, {len(idle)} idle instance(s)",
                    )
                ]
            return []
        out: list[ScaleDecision] = []
        for inst in retire_order(idle):
            if idle_for(inst, now) >= p.idle_timeout_s:
                out.append(ScaleIn(inst.id, f"idle for {idle_for(inst, now):.0f} s"))
        return out


SPEC = PluginSpec(
    PluginKind.SCALER,
    "cato-sla",
    CatoSlaParams,
    lambda p, ctx: CatoSlaScaler(p),
    "CATO: add instances on slack violations beyond the idle ones; remove idle instances after a timeout",
)
