"""Static caps: every endpoint's cap is its configured one (what a policy without a controller does)."""

from __future__ import annotations

from gateway.sched.registry import NoParams, PluginKind, PluginSpec
from gateway.sched.snapshot import EndpointView


class StaticCap:
    name = "static"
    floor = 1

    def cap(self, view: EndpointView, now: float) -> int:
        return view.hard_cap


SPEC = PluginSpec(
    PluginKind.CONCURRENCY,
    "static",
    NoParams,
    lambda p, ctx: StaticCap(),
    "each endpoint's configured cap",
)
