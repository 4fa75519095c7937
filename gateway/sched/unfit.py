"""Requests that fit nowhere, tried again only where the fleet changed.

Serving a queue tries its first request and, under a `lookahead`, up to that many behind one that fits
nowhere; each try runs the placement pipeline over every eligible endpoint. With a thousand requests
waiting on a full fleet most of those tries fail, event after event, although between two events only a
few endpoints changed (a completion frees one seat, a dispatch takes one). So a queued request found to
fit nowhere remembers the fleet's views it was tried on (`Unfit`); the next time it is served it is tried
on the endpoints whose view changed since in more than its running requests' progress (seats, cap,
health, models, fitted coefficients or KV capacity, gauges, the set of requests running there:
`retry_on`) and on no other. An endpoint gains room only through such a change, so for a profile whose
filters only drop endpoints without room (`default`, the baselines) a request that fit nowhere still
fits nowhere on the others: the same choices as trying it on every endpoint.

By design it differs from trying every endpoint where a prediction moves with the clock or the progress
reports alone (a running request's progress, the request's own time left) and where a filter's answer
for one endpoint depends on the others (the overflow guard's fallback to the endpoints where the request
harms no one, when it meets its deadlines on none; best fit's fallback to the least loaded endpoint
without the θ reserve): the request is judged among the changed endpoints only. Both are bounded: after
`RETRY_ALL_S` (spread over 1-2 times that by arrival order, so a window of requests tried together is not
tried again all at once) it is tried on every endpoint again. The scheduling benchmark compares goodput
with the memo and without it (`docs/scheduling-at-scale.md`).

The requests tried in one serve were mostly found to fit nowhere on one and the same earlier snapshot
(the serve before): the endpoints that changed between two snapshots are listed once for all of them
(`_LastChange`), not once per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot

#: A request found to fit nowhere is tried on every endpoint again after this long (times 1-2).
RETRY_ALL_S: Final = 0.1
_SPREAD: Final = 8


@dataclass(slots=True)
class Unfit:
    """`req` fit nowhere on `views` (the snapshot's endpoints then) under the placement `profile`; last
    tried on all of them at `since`."""

    profile: object
    req: SchedRequest
    views: tuple[EndpointView, ...]
    since: float


class _LastChange:
    """`changed`'s last answer: the endpoints of `new` that moved since `old` (a pure function of two
    immutable tuples of immutable views, asked with the same pair by every request a serve tries)."""

    __slots__ = ("changed", "new", "old")

    def __init__(self) -> None:
        self.old: tuple[EndpointView, ...] | None = None
        self.new: tuple[EndpointView, ...] | None = None
        self.changed: tuple[EndpointView, ...] = ()


_LAST_CHANGE: Final = _LastChange()


def changed(new: tuple[EndpointView, ...], old: tuple[EndpointView, ...]) -> tuple[EndpointView, ...]:
    """The views of `new` whose endpoint moved (`_moved`) since its view in `old` (same endpoints, in
    the same order)."""
    last = _LAST_CHANGE
    if last.new is new and last.old is old:
        return last.changed
    out = tuple([v for v, o in zip(new, old, strict=True) if v is not o and _moved(v, o)])
    last.old, last.new, last.changed = old, new, out
    return out


def retry_on(
    memo: Unfit | None, profile: object, req: SchedRequest, seq: int, snap: FleetSnapshot
) -> list[EndpointView] | None:
    """The endpoints to try `req` (queued with `seq`) on under `profile`: those whose view changed since
    it fit nowhere (empty: none changed, it still fits nowhere); None: every endpoint (no memo for this
    very request and profile, the endpoint set changed, or its time to be tried everywhere again has
    come)."""
    if memo is None or memo.req is not req or memo.profile is not profile:
        return None
    views, old = snap.endpoints, memo.views
    if len(views) != len(old):
        return None
    age = snap.now - memo.since
    if not 0.0 <= age <= RETRY_ALL_S * (1.0 + (seq % _SPREAD) / _SPREAD):
        return None
    if views is old:
        return []
    return list(changed(views, old))


def _moved(view: EndpointView, old: EndpointView) -> bool:
    """Whether an endpoint's view changed in more than its running requests' progress: its seats, cap,
    health, models, fitted coefficients or KV capacity, engine gauges or the set of requests it runs
    (their prompt and predicted output sums; a completion and a dispatch there change them)."""
    return (
        view.id != old.id
        or view.inflight != old.inflight
        or view.cap != old.cap
        or view.health is not old.health
        or view.models != old.models
        or (view.estimates is not old.estimates and _predicts_apart(view, old))
        or view.engine_waiting != old.engine_waiting
        or view.engine_running != old.engine_running
        or view.running_prompt_tokens != old.running_prompt_tokens
        or view.running_output_tokens != old.running_output_tokens
        or view.max_batch != old.max_batch
    )


def _predicts_apart(view: EndpointView, old: EndpointView) -> bool:
    """Whether new estimates change what placement predicts from: the fitted coefficients or the KV
    capacity (the measured EWMAs, refreshed every second, enter no placement plugin)."""
    return view.perf is not old.perf or view.kv_capacity_tokens != old.kv_capacity_tokens


def remember(
    memo: Unfit | None, profile: object, req: SchedRequest, snap: FleetSnapshot, *, everywhere: bool
) -> Unfit:
    """The memo after `req` fit nowhere on `snap` under `profile` (tried on every endpoint when
    `everywhere`, else on the changed ones only: the last time it was tried everywhere stays)."""
    since = snap.now if everywhere or memo is None else memo.since
    if memo is None:
        return Unfit(profile, req, snap.endpoints, since)
    memo.profile, memo.req, memo.views, memo.since = profile, req, snap.endpoints, since
    return memo
