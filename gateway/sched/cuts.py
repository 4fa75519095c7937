"""The parts of a snapshot a profile's scoped filters cut (`gateway.sched.profile.SchedulerProfile.scope`)."""

from __future__ import annotations

from gateway.core.types import ModelName
from gateway.sched.snapshot import EndpointView, FleetSnapshot


class Cuts:
    """`SchedulerProfile.scope`'s parts of one snapshot (the last asked about), by what they kept, and
    the endpoints serving each model there."""

    __slots__ = ("_by", "_serving", "_snap")

    def __init__(self) -> None:
        self._snap: FleetSnapshot | None = None
        self._by: dict[object, FleetSnapshot] = {}
        self._serving: dict[ModelName, list[EndpointView]] = {}

    def of(self, snap: FleetSnapshot) -> dict[object, FleetSnapshot]:
        if snap is not self._snap:
            self._snap = snap
            self._by = {}
            self._serving = {}
        return self._by

    def serving(self, model: ModelName, snap: FleetSnapshot) -> list[EndpointView]:
        """The endpoints of `snap` (the one `of` was last given) serving `model` (not to be changed)."""
        got = self._serving.get(model)
        if got is None:
            got = self._serving[model] = [e for e in snap.endpoints if model in e.models]
        return got
