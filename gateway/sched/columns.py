"""The fleet's per-endpoint numbers as arrays (`FleetColumns`), built from a tuple of views and updated
where endpoints changed, for placement over columns (`gateway.sched.profile`).

An update copies the arrays and rewrites the changed entries (a few microseconds over a thousand
endpoints; the coefficients only when some changed, else the same array): a snapshot's columns are never
mutated afterwards. Membership per model is rebuilt only when an endpoint's models change.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.core.types import EndpointHealth, InstanceClass, ModelName
from gateway.sched.perf import default_prior
from gateway.sched.predict import seats_of
from gateway.sched.snapshot import EndpointView, FleetColumns


def _members(views: tuple[EndpointView, ...]) -> dict[ModelName, npt.NDArray[np.bool_]]:
    out: dict[ModelName, npt.NDArray[np.bool_]] = {}
    n = len(views)
    for i, v in enumerate(views):
        for m in v.models:
            arr = out.get(m)
            if arr is None:
                arr = out[m] = np.zeros(n, dtype=np.bool_)
            arr[i] = True
    return out


_PRIOR: Final = default_prior()


def _classes(views: tuple[EndpointView, ...]) -> dict[InstanceClass, npt.NDArray[np.bool_]]:
    out: dict[InstanceClass, npt.NDArray[np.bool_]] = {}
    n = len(views)
    for i, v in enumerate(views):
        arr = out.get(v.instance_class)
        if arr is None:
            arr = out[v.instance_class] = np.zeros(n, dtype=np.bool_)
        arr[i] = True
    return out


def _coef_row(view: EndpointView) -> tuple[float, float, float, float, float]:
    c = view.perf or _PRIOR
    return (c.k1, c.c1, c.k2, c.c2, c.c3)


def columns_of(views: tuple[EndpointView, ...]) -> FleetColumns:
    """The columns of `views`, built whole."""
    ready = EndpointHealth.READY
    ids = [v.id for v in views]
    inflight = np.fromiter((v.inflight for v in views), dtype=np.int64, count=len(views))
    waiting = np.fromiter((v.engine_waiting or 0.0 for v in views), dtype=np.float64, count=len(views))
    rank = np.empty(len(views), dtype=np.int64)
    rank[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids), dtype=np.int64)
    return FleetColumns(
        endpoints=views,
        inflight=inflight,
        cap=np.fromiter((v.cap for v in views), dtype=np.int64, count=len(views)),
        ready=np.fromiter((v.health is ready for v in views), dtype=np.bool_, count=len(views)),
        waiting=waiting,
        outstanding=inflight + waiting,
        id_rank=rank,
        members=_members(views),
        busy=np.fromiter((len(v.running) for v in views), dtype=np.int64, count=len(views)),
        seats=np.fromiter((seats_of(v) for v in views), dtype=np.int64, count=len(views)),
        classes=_classes(views),
        coef=np.array([_coef_row(v) for v in views], dtype=np.float64).reshape(len(views), 5),
        index={v.id: i for i, v in enumerate(views)},
    )


def updated(prev: FleetColumns, views: tuple[EndpointView, ...], changed: Iterable[int]) -> FleetColumns:
    """The columns of `views`, which differ from `prev.endpoints` at the indexes `changed` only (same
    endpoints in the same places)."""
    inflight, cap, ready = prev.inflight.copy(), prev.cap.copy(), prev.ready.copy()
    waiting, outstanding = prev.waiting.copy(), prev.outstanding.copy()
    busy, seats = prev.busy.copy(), prev.seats.copy()
    coef = prev.coef  # copied only when an endpoint's coefficients changed (kept: one array while fixed)
    members = prev.members
    is_ready = EndpointHealth.READY
    old = prev.endpoints
    remade = reclassed = False
    for i in changed:
        v = views[i]
        inflight[i] = v.inflight
        cap[i] = v.cap
        ready[i] = v.health is is_ready
        w = waiting[i] = v.engine_waiting or 0.0
        outstanding[i] = v.inflight + w
        busy[i] = len(v.running)
        seats[i] = seats_of(v)
        if v.estimates is not old[i].estimates:
            if coef is prev.coef:
                coef = coef.copy()
            coef[i] = _coef_row(v)
        if not remade and v.models != old[i].models:
            remade = True
        if not reclassed and v.instance_class != old[i].instance_class:
            reclassed = True
    return FleetColumns(
        endpoints=views,
        inflight=inflight,
        cap=cap,
        ready=ready,
        waiting=waiting,
        outstanding=outstanding,
        id_rank=prev.id_rank,
        members=_members(views) if remade else members,
        busy=busy,
        seats=seats,
        classes=_classes(views) if reclassed else prev.classes,
        coef=coef,
        index=prev.index,
    )
