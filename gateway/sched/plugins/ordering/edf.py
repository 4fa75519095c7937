"""Earliest deadline first: the request whose first-token or last-token deadline comes first runs first."""

from __future__ import annotations

from typing import Final

from gateway.sched.interfaces import OrderKey
from gateway.sched.registry import NoParams, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.running import deadlines
from gateway.sched.snapshot import FleetSnapshot

#: The key of "no deadline" (finite, as ordering keys must be): after every real deadline.
NO_DEADLINE: Final = 1e15


class EdfOrdering:
    """Key (best-effort?, earliest deadline, arrival): requests without targets keep their arrival order
    behind every request with one; a demoted (best-effort) request goes after all of them."""

    name = "edf"
    stable_keys = True  # deadlines and demotion are the request's own

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        ttft, e2e = deadlines(req)
        due = min((d for d in (ttft, e2e) if d is not None), default=NO_DEADLINE)
        return (1.0 if req.best_effort else 0.0, due, req.arrival)

    def engine_priority(self, req: SchedRequest, snap: FleetSnapshot) -> int | None:
        return 1 if req.best_effort else 0


SPEC = PluginSpec(
    PluginKind.ORDERING, "edf", NoParams, lambda p, ctx: EdfOrdering(), "earliest deadline first"
)
