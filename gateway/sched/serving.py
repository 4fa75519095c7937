"""The ready endpoints serving a model in one tuple of views, listed once for every plugin that asks.

SLO admission (its free seats), the slack ordering (the endpoints with the fewest seats taken, for its
delay) and demand-split (the endpoint ids its blocks are cut from) each start from the same list: the
ready endpoints of the model, in the views' order. With a standing queue each submit sees a new tuple of
views (a completion and a dispatch changed some endpoint's), and admission and serving then ask about
the same tuple: `ready_serving` lists it once per tuple and model, on the snapshot's `ViewsMemo`, which
the scheduler hands to every snapshot of the same views.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.types import EndpointHealth, EndpointId, ModelName
from gateway.sched.snapshot import EndpointView, FleetSnapshot, ViewsMemo


class ReadyServing:
    """The ready endpoints of one tuple of views that serve one model (`endpoints`, in the views'
    order), those with a free seat (`open`), and their free seats in all (`free`: each endpoint's seats,
    `gateway.sched.prediction.seats_of`, less its running requests, when positive). Not to be changed."""

    __slots__ = ("_fewest", "_ids", "endpoints", "free", "open")

    def __init__(self, model: ModelName, views: Sequence[EndpointView]) -> None:
        ready = EndpointHealth.READY
        endpoints: list[EndpointView] = []
        open_: list[EndpointView] = []
        free = 0
        for e in views:
            if model in e.models and e.health is ready:
                endpoints.append(e)
                # seats_of(e), inline (a call per endpoint is a third of this loop)
                mb, seats = e.max_batch, e.cap
                if mb is not None and mb < seats:
                    seats = mb
                spare = (seats if seats > 1 else 1) - len(e.running)
                if spare > 0:
                    free += spare
                    open_.append(e)
        self.endpoints = endpoints
        self.open = open_
        self.free = free
        self._fewest: tuple[int, list[EndpointView]] | None = None
        self._ids: tuple[EndpointId, ...] | None = None

    def fewest_taken(self, n: int) -> list[EndpointView]:
        """The `n` endpoints with the fewest seats taken (in flight less cap), ties in the views' order:
        `heapq.nsmallest(n, endpoints, key=lambda e: e.inflight - e.cap)`; all of them when `n` or
        fewer, in order."""
        kept = self._fewest
        if kept is not None and kept[0] == n:
            return kept[1]
        endpoints = self.endpoints
        if len(endpoints) <= n:
            got = endpoints
        else:
            taken = [e.inflight - e.cap for e in endpoints]
            # a stable sort of the places by seats taken: nsmallest's order (ties by place)
            got = [endpoints[i] for i in sorted(range(len(taken)), key=taken.__getitem__)[:n]]
        self._fewest = (n, got)
        return got

    def ids(self) -> tuple[EndpointId, ...]:
        """The endpoints' ids, in the views' order."""
        got = self._ids
        if got is None:
            got = self._ids = tuple(e.id for e in self.endpoints)
        return got


def ready_serving(snap: FleetSnapshot, model: ModelName) -> ReadyServing:
    """`ReadyServing` of `snap`'s views for `model`: kept on the snapshot's memo when it is that of its
    views (every snapshot the scheduler takes of the same views shares one), else made for this call."""
    memo = snap.memo
    if memo is None or memo.endpoints is not snap.endpoints:
        return ReadyServing(model, snap.endpoints)
    got = memo.ready.get(model)
    if got is None:
        got = memo.ready[model] = ReadyServing(model, snap.endpoints)
    return got


def new_memo(views: tuple[EndpointView, ...], last: ViewsMemo | None) -> ViewsMemo:
    """The memo for snapshots of `views`: `last` when it is that of the same tuple."""
    if last is not None and last.endpoints is views:
        return last
    return ViewsMemo(views)


__all__ = ["ReadyServing", "new_memo", "ready_serving"]
