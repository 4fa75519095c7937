"""First come, first served."""

from __future__ import annotations

from gateway.sched.interfaces import OrderKey
from gateway.sched.registry import NoParams, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


class FcfsOrdering:
    name = "fcfs"
    stable_keys = True  # the arrival time

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        return (req.arrival,)


SPEC = PluginSpec(
    PluginKind.ORDERING, "fcfs", NoParams, lambda p, ctx: FcfsOrdering(), "serve in arrival order"
)
