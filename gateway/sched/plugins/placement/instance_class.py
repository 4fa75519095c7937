"""Chiron's instance classes as a filter: each kind of request (its SLO class's `kind`) goes to endpoints
of its own class first and spills to the next classes of its list.

By default an interactive request tries the `interactive` endpoints, then the `mixed` ones; a batch
request the `batch` endpoints, then the `mixed` ones; neither ever reaches the other's own class. The
parameters list, per kind, the endpoint classes it may use in order of preference (e.g.
``batch = ["batch", "mixed", "interactive"]`` lets batch work soak up idle interactive endpoints).

The classes are the filter's preference tiers (`TieredFilter`): the runner passes the first class's
endpoints through the filters after this one (overflow guard, best fit, demand split, ...), and the next
class's only when none of the first survives them or none has a free seat (the candidates a filter gets
already have room). So "spill" means: nothing of its own class can take it now, for either reason. A
request is never held back while an endpoint of a listed class could take it, and never sent to an
unlisted class. Admission judges a request on the listed classes only (`ScopedFilter`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gateway.core.slo import SloKind, SloPolicy
from gateway.core.types import InstanceClass
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot


class InstanceClassParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    # Endpoint classes each kind of request may use, most preferred first.
    interactive: list[InstanceClass] = msgspec.field(
        default_factory=lambda: [InstanceClass.INTERACTIVE, InstanceClass.MIXED]
    )
    batch: list[InstanceClass] = msgspec.field(
        default_factory=lambda: [InstanceClass.BATCH, InstanceClass.MIXED]
    )


class InstanceClassFilter:
    name = "instance-class"

    def __init__(self, params: InstanceClassParams, slo: SloPolicy) -> None:
        for kind, order in ((SloKind.INTERACTIVE, params.interactive), (SloKind.BATCH, params.batch)):
            if not order:
                raise ValueError(f"{kind}: list at least one instance class")
            if len(set(order)) != len(order):
                raise ValueError(f"{kind}: an instance class is listed twice")
        self._order: dict[SloKind, tuple[InstanceClass, ...]] = {
            SloKind.INTERACTIVE: tuple(params.interactive),
            SloKind.BATCH: tuple(params.batch),
        }
        self._slo = slo

    def classes(self, req: SchedRequest) -> tuple[InstanceClass, ...]:
        """The endpoint classes `req` may use, most preferred first."""
        return self._order[self._slo.class_of(req.slo.slo_class).kind]

    def tiers(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[Sequence[EndpointView]]:
        return [[e for e in candidates if e.instance_class == cls] for cls in self.classes(req)]

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        for tier in self.tiers(req, candidates, snap):
            if tier:
                return tier
        return []

    def scope(
        self, req: SchedRequest, serving: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        allowed = self.classes(req)
        return [e for e in serving if e.instance_class in allowed]


SPEC = PluginSpec(
    PluginKind.FILTER,
    "instance-class",
    InstanceClassParams,
    lambda p, ctx: InstanceClassFilter(p, ctx.slo),
    "Chiron: each kind of request to its own endpoint class first, then spills to the listed ones",
)
