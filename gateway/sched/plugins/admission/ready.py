"""The ready endpoints serving a model in one snapshot's views and their free seats, for SLO admission
(`gateway.sched.plugins.admission.slo_feasibility`): from the snapshot's columns when it carries them
(a large fleet: no Python step per endpoint)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.predict import seats_of
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot


class ReadySeats:
    """The ready endpoints serving a model in one snapshot's views, and their free seats in all (each
    endpoint's seats less its running requests, when positive)."""

    __slots__ = ("_views", "any", "cols", "endpoints", "free", "model")

    def __init__(self, model: ModelName, snap: FleetSnapshot) -> None:
        self.model = model
        self.endpoints = views = snap.endpoints
        cols = snap.columns
        self._views: list[EndpointView] | None = None
        self.cols: tuple[FleetColumns, npt.NDArray[np.bool_]] | None = None
        if cols is not None and cols.endpoints is views:
            serves = cols.members.get(model)
            mask = np.zeros(len(views), dtype=np.bool_) if serves is None else serves & cols.ready
            self.cols = (cols, mask)
            self.free = int(np.maximum(cols.seats - cols.busy, 0)[mask].sum())
            self.any = bool(mask.any())
            return
        ready = EndpointHealth.READY
        self._views = [e for e in views if model in e.models and e.health is ready]
        free = 0
        for e in self._views:
            seats = seats_of(e) - len(e.running)
            if seats > 0:
                free += seats
        self.free = free
        self.any = bool(self._views)

    def views(self) -> list[EndpointView]:
        """The ready endpoints, in the snapshot's order."""
        got = self._views
        if got is None:
            assert self.cols is not None  # (one or the other is set on construction)
            mask = self.cols[1]
            views = self.endpoints
            got = self._views = [views[i] for i in np.flatnonzero(mask).tolist()]
        return got

    def open(self) -> Iterator[EndpointView]:
        """The ready endpoints with a free seat, in the snapshot's order."""
        if self.cols is None:
            return (e for e in self.views() if len(e.running) < seats_of(e))
        cols, mask = self.cols
        views = self.endpoints
        return (views[i] for i in np.flatnonzero(mask & (cols.busy < cols.seats)).tolist())
