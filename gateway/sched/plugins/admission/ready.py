"""The ready endpoints serving a model in one snapshot's views and their free seats, for SLO admission
(`gateway.sched.plugins.admission.slo_feasibility`): the list the snapshot's views share with the other
plugins that ask (`FleetSnapshot.ready`) when the snapshot has the memo of its views (the scheduler's
snapshots do: the list is carried over from the last views at the places the fleet replaced, a step
per changed endpoint), else from the snapshot's columns when it carries them (a large fleet: no Python
step per endpoint), else that list made for the call. The three give the same answers."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from gateway.core.types import ModelName
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot


class ReadySeats:
    """The ready endpoints serving a model in one snapshot's views, and their free seats in all (each
    endpoint's seats less its running requests, when positive)."""

    __slots__ = ("_open", "_views", "any", "cols", "endpoints", "free", "model")

    def __init__(self, model: ModelName, snap: FleetSnapshot) -> None:
        self.model = model
        self.endpoints = views = snap.endpoints
        cols = snap.columns
        self._views: list[EndpointView] | None = None
        self._open: list[EndpointView] = []
        self.cols: tuple[FleetColumns, npt.NDArray[np.bool_]] | None = None
        memo = snap.memo
        if cols is not None and cols.endpoints is views and (memo is None or memo.endpoints is not views):
            serves = cols.members.get(model)
            mask = np.zeros(len(views), dtype=np.bool_) if serves is None else serves & cols.ready
            self.cols = (cols, mask)
            self.free = int(np.maximum(cols.seats - cols.busy, 0)[mask].sum())
            self.any = bool(mask.any())
            return
        serving = snap.ready(model)
        self._views = serving.endpoints
        self._open = serving.open
        self.free = serving.free
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
            return iter(self._open)
        cols, mask = self.cols
        views = self.endpoints
        return (views[i] for i in np.flatnonzero(mask & (cols.busy < cols.seats)).tolist())
