"""Round robin over the eligible endpoints, ignoring scores."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.sched.registry import NoParams, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot


class RoundRobinPicker:
    """Cycles through endpoints in id order; an endpoint that is not eligible now is skipped."""

    name = "round-robin"

    def __init__(self) -> None:
        self._last: dict[str, str] = {}  # model -> id of the endpoint chosen last

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView:
        ordered = sorted((e for e, _ in scored), key=lambda e: e.id)
        last = self._last.get(req.model)
        chosen = ordered[0]
        if last is not None:
            for e in ordered:
                if e.id > last:
                    chosen = e
                    break
        self._last[req.model] = chosen.id
        return chosen


SPEC = PluginSpec(
    PluginKind.PICKER,
    "round-robin",
    NoParams,
    lambda p, ctx: RoundRobinPicker(),
    "rotate through eligible endpoints",
)
