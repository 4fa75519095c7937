"""Chiron's instance classes as a filter: each kind of request (its SLO class's `kind`) goes to endpoints
of its own class first and spills to the next classes of its list.

By default an interactive request tries the `interactive` endpoints, then the `mixed` ones; a batch
request the `batch` endpoints, then the `mixed` ones; neither ever reaches the other's own class. The
parameters list, per kind, the endpoint classes it may use in order of preference (e.g.
``batch = ["batch", "mixed", "interactive"]`` lets batch work soak up idle interactive endpoints).

The classes are the filter's preference tiers (`TieredFilter`): the runner passes the first class's
endpoints through the filters after this one (overflow guard, best fit, demand split, ...), and the next
class's only when none of the first survives them or none has a free seat (the candidates a filter gets
already have room). So "spill" means: nothing of its own class can take it now, for either reason. A
request is never held back while an endpoint of a listed class could take it, and never sent to an
unlisted class. Admission judges a request on the listed classes only (`ScopedFilter`).

**Borrowing and the reserve.** A class is a kind's *own* class when it heads that kind's list
(interactive endpoints are the interactive kind's own, batch endpoints the batch kind's; by default
mixed ones are no one's). A request on a class that is another kind's own *borrows* it (batch work on
an idle interactive endpoint, with ``batch = ["batch", "mixed", "interactive"]``). ``reserve = {
interactive = N }`` keeps N seats of every interactive endpoint (of its cap in force) free of borrowed
work: a borrower is placed there only while N seats would stay free after it. The owner's own requests
take those seats on arrival instead of preempting borrowed work for them, and while the owner's own
requests fill the endpoint no borrower is let in (the borrowers already there finish in their time).
Without a reserve a borrowed endpoint fills to its cap, every arrival of its own kind preempts, and
the adaptive cap, now judging against the owner's tighter ITL target, cuts and sheds more borrowed
work (on the classes benchmark at 0.25 interactive req/s, seed 0: 1634 preemptions, about 25 per
interactive arrival, and 2825 batch tok/s; taking borrowed seats back first, the preemptor's
`by_class`, 539 preemptions and 3053 tok/s over 5 seeds; with a reserve of 16 seats as well 83 and
3095 tok/s).
`reserve_window_s` keeps borrowed work off interactive endpoints that their own traffic keeps busy
(at 3 and 6 req/s borrowing then happens only while the backlog's first requests fill the fleet, before
interactive traffic has arrived). The reserve's size trades the two ends: 4 seats let 6 req/s keep only
0.988 of interactive requests within their SLO (the first arrivals find the interactive endpoints full
of borrowed work), 48 cost 7 % of the batch throughput at 0.25 req/s; chat-and-batch ships 16.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import Meta

from gateway.core.slo import SloKind, SloPolicy
from gateway.core.types import InstanceClass
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot


class InstanceClassParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    # Endpoint classes each kind of request may use, most preferred first.
    interactive: list[InstanceClass] = msgspec.field(
        default_factory=lambda: [InstanceClass.INTERACTIVE, InstanceClass.MIXED]
    )
    batch: list[InstanceClass] = msgspec.field(
        default_factory=lambda: [InstanceClass.BATCH, InstanceClass.MIXED]
    )
    # Seats of each endpoint of a class kept free of borrowed work (requests of a kind whose own class,
    # the head of its list, is another): its own kind's arrivals take them (module docstring).
    reserve: dict[InstanceClass, Annotated[int, Meta(ge=0, le=100_000)]] = msgspec.field(default_factory=dict)
    # The reserve grows to the number of the owner's requests dispatched there within this many seconds
    # (still running): seats for as many arrivals as the last window brought (0: the fixed reserve).
    reserve_window_s: Annotated[float, Meta(ge=0.0, le=86_400.0)] = 0.0


class InstanceClassFilter:
    name = "instance-class"

    def __init__(self, params: InstanceClassParams, slo: SloPolicy) -> None:
        for kind, order in ((SloKind.INTERACTIVE, params.interactive), (SloKind.BATCH, params.batch)):
            if not order:
                raise ValueError(f"{kind}: list at least one instance class")
            if len(set(order)) != len(order):
                raise ValueError(f"{kind}: an instance class is listed twice")
        self._order: dict[SloKind, tuple[InstanceClass, ...]] = {
            SloKind.INTERACTIVE: tuple(params.interactive),
            SloKind.BATCH: tuple(params.batch),
        }
        owned = {order[0] for order in self._order.values()}
        for cls in params.reserve:
            if cls not in owned:
                raise ValueError(
                    f"reserve: {cls} endpoints are no kind's own class (the head of a kind's list): "
                    "nothing to reserve them for"
                )
        self._reserve: dict[InstanceClass, int] = {c: n for c, n in params.reserve.items() if n > 0}
        self._window = params.reserve_window_s
        # The kind each reserved class is kept for (the kind whose list it heads).
        self._owner: dict[InstanceClass, SloKind] = {
            order[0]: kind for kind, order in self._order.items() if order[0] in params.reserve
        }
        self._slo = slo

    def classes(self, req: SchedRequest) -> tuple[InstanceClass, ...]:
        """The endpoint classes `req` may use, most preferred first."""
        return self._order[self._slo.class_of(req.slo.slo_class).kind]

    def tiers(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[Sequence[EndpointView]]:
        order = self.classes(req)
        out: list[list[EndpointView]] = []
        for cls in order:
            tier = [e for e in candidates if e.instance_class == cls]
            keep = self._reserve.get(cls, 0) if cls != order[0] else 0
            if keep:  # borrowing another kind's own class: leave its reserve free
                tier = [e for e in tier if e.inflight + 1 + self._kept(e, keep, snap.now) <= e.cap]
            out.append(tier)
        return out

    def tiers_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> Sequence[npt.NDArray[np.bool_]]:
        """`tiers` as masks: a class's endpoints from the columns; a borrowed class's reserve checked on
        its candidates only (a walk of their running requests when the reserve follows recent
        arrivals)."""
        order = self.classes(req)
        out: list[npt.NDArray[np.bool_]] = []
        views = cols.endpoints
        for cls in order:
            of_class = cols.classes.get(cls)
            tier = np.zeros_like(candidates) if of_class is None else candidates & of_class
            keep = self._reserve.get(cls, 0) if cls != order[0] else 0
            if keep and np.count_nonzero(tier):
                for i in tier.nonzero()[0].tolist():
                    e = views[i]
                    if not e.inflight + 1 + self._kept(e, keep, snap.now) <= e.cap:
                        tier[i] = False
            out.append(tier)
        return out

    def _kept(self, e: EndpointView, keep: int, now: float) -> int:
        """Seats of `e` kept free of borrowed work: the reserve, or the owner's recent arrivals there."""
        if self._window <= 0.0:
            return keep
        owner = self._owner[e.instance_class]
        since = now - self._window
        kind = self._slo.class_of
        recent = sum(1 for r in e.running if r.dispatched_at >= since and kind(r.slo_class).kind is owner)
        return max(keep, recent)

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        for tier in self.tiers(req, candidates, snap):
            if tier:
                return tier
        return []

    def scope(
        self, req: SchedRequest, serving: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        allowed = self.classes(req)
        return [e for e in serving if e.instance_class in allowed]

    def scope_columns(
        self, req: SchedRequest, cols: FleetColumns, serving: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]:
        """`scope` as a mask: the serving endpoints of the classes the request may use."""
        allowed = np.zeros_like(serving)
        for cls in self.classes(req):
            of_class = cols.classes.get(cls)
            if of_class is not None:
                allowed |= of_class
        return serving & allowed


SPEC = PluginSpec(
    PluginKind.FILTER,
    "instance-class",
    InstanceClassParams,
    lambda p, ctx: InstanceClassFilter(p, ctx.slo),
    "Chiron: each kind of request to its own endpoint class first, then spills to the listed ones",
)
