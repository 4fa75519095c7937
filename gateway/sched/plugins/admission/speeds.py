"""The ready endpoints serving a model, those with the fastest idle service first, and their fastest bound
(`gateway.sched.idle`): what SLO admission's late recheck asks about a request alone on an endpoint
(`slo_feasibility`). A tick rechecks many requests on one snapshot, and a scope cuts a few parts of it,
so the answer is kept per tuple of views (by identity). The fleet's views change on nearly every event
(a dispatch, a completion, a progress report), but the order rests only on each endpoint's health,
models and estimates: a new tuple of views is compared with the last one of its model and length entry
by entry (most entries are the same objects), and while every changed entry has the same speed
(`gateway.sched.snapshot.same_speed`: the same speed epoch, `KeptBounds.epoch`, which the bounds share) the
kept order of places is taken over instead of sorting the fleet again. The same list
as filtering and sorting the new views (`tests/unit/test_admission_speeds.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.idle import IdleBound, KeptBounds, SpeedEpoch, speeds_of
from gateway.sched.perf import default_prior
from gateway.sched.snapshot import EndpointView, FleetSnapshot

#: Tuples of views whose answer is kept at most; the oldest goes first (one at a time: a tuple dropped
#: frees the views only it held, and dropping many at once made one tick pay for all of them).
KEPT: Final = 16
_PRIOR: Final = default_prior()

#: The views, the ready ones serving the model fastest first, their fastest bound.
Speeds = tuple[tuple[EndpointView, ...], list[EndpointView], IdleBound | None]


class ReadySpeeds:
    """`of(model, snap)`: the ready endpoints of `snap` serving `model`, fastest idle service for a
    typical request first (ties in the views' order), and the fastest bound over them."""

    __slots__ = ("_bounds", "_kept", "_orders")

    def __init__(self, bounds: KeptBounds) -> None:
        """`bounds`: the admitter's kept bounds (the fastest bound is asked of them)."""
        self._bounds = bounds
        self._kept: dict[tuple[int, ModelName], Speeds] = {}
        # the order (places in the views) per speed epoch (`KeptBounds.epoch`)
        self._orders: dict[SpeedEpoch, list[int]] = {}

    def of(self, model: ModelName, snap: FleetSnapshot) -> Speeds:
        views = snap.endpoints
        key = (id(views), model)
        kept = self._kept.get(key)
        if kept is not None and kept[0] is views:
            return kept
        order = self._order(model, views, speeds_of(snap))
        kept_all = self._kept
        if len(kept_all) >= KEPT:
            del kept_all[next(iter(kept_all))]
        kept = kept_all[key] = (
            views,
            [views[i] for i in order],
            self._bounds.bound(snap, model, slowest=False),
        )
        return kept

    def _order(self, model: ModelName, views: tuple[EndpointView, ...], speeds: object | None) -> list[int]:
        """The places of the ready views serving `model`, fastest first: kept per speed epoch of the
        views (`KeptBounds.epoch`; `speeds`: their memo's token), else sorted anew."""
        epoch = self._bounds.epoch(views, model, speeds)
        orders = self._orders
        got = orders.get(epoch)
        if got is not None:
            return got
        ready = EndpointHealth.READY
        order = [i for i, e in enumerate(views) if model in e.models and e.health is ready]
        order.sort(key=lambda i: typical_idle_s(views[i]))  # stable: ties keep the views' order
        if len(orders) >= KEPT:
            del orders[next(iter(orders))]
        orders[epoch] = order
        return order


def fastest_first(model: ModelName, views: Sequence[EndpointView]) -> list[EndpointView]:
    """The plain answer: the ready views serving `model`, sorted by `typical_idle_s`."""
    ready = EndpointHealth.READY
    serving = [e for e in views if model in e.models and e.health is ready]
    serving.sort(key=typical_idle_s)
    return serving


def typical_idle_s(view: EndpointView) -> float:
    """Seconds a 1,000-token prompt with 200 tokens out takes alone on the endpoint (an order only)."""
    c = view.perf or _PRIOR
    return c.prefill_s(1000.0) + 199.0 * c.decode_iter_s(1.0, 1100.0)
