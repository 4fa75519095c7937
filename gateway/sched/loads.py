"""Endpoint loads kept between the queries of nearby decisions: `LoadCache` reuses an endpoint's
`EndpointLoad` while its view object is the same and the clock moved less than its reuse time, and
`LoadCaches` shares one cache among the plugins of a policy that predict with the same parameters.

A load is remade when its endpoint changed (a dispatch, a completion, a cancel, new gauges, estimates, cap
or health: a new view) and otherwise after 100-200 ms: its running requests' progress is estimated from
the clock, so an old load is a few tokens behind (at tens of ms per token), and it judges as of the time
it was made (a request's time left and the waits it predicts are both counted from that time). A view
apart from the load's only in its running requests' progress reports (`progress_only`; a stream reports
every 16 tokens, so on a busy fleet every endpoint's view changes every few milliseconds) is such a later
time too: the load stands for it until its reuse time is up, its running requests' progress estimated from
the clock and the load's view as it would be with no report since. Remaking the loads aged past their
reuse time is much of the scheduler's work on a busy fleet; the scheduling benchmark's goodput with loads
reused this long is that of loads remade every 20-40 ms, within its intervals
(docs/scheduling-at-scale.md, "How long a load is reused"). Each endpoint's reuse time is spread over that
range by a hash of its id (`reuse_s`), so a fleet's loads, made together on a busy fleet, are not all
remade by the same decision (with a hundred endpoints that would be a few milliseconds for the one
decision that happens to come 100 ms later), and a load's age does not depend on which other loads were
made before it: placement over columns makes no load for an idle endpoint, the plain path does, and both
see the same loads. A load remade for its age alone takes over from the old one what does not depend on
the clock (`EndpointLoad`'s `like`). A load with nothing running does not move with the clock (its numbers
are its coefficients' alone): it is renewed rather than remade (on a large fleet at light load most
endpoints are idle, and remaking their loads every 100-200 ms would be most of the work). Its `now` then
stays the time it was made at: nothing reads it without running requests."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from operator import is_
from typing import Final

from gateway.core.types import EndpointId
from gateway.sched.load_batch import Pending, carry_rows
from gateway.sched.load_terms import pace_for, progress_only, same_requests
from gateway.sched.perf import default_prior
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.snapshot import EndpointView

#: Loads whose view is unchanged are reused for at least this many seconds after they were made ...
REUSE_S: Final = 0.1
#: ... and at most twice that, in this many steps by a hash of the endpoint's id (`reuse_s`).
_SPREAD: Final = 8
_PRIOR: Final = default_prior()


def reuse_s(eid: str) -> float:
    """How long a load of endpoint `eid` is reused (`REUSE_S` to twice that): by a hash of its id that is
    the same in every process (`hash` of a str is not)."""
    return REUSE_S * (1.0 + (zlib.crc32(eid.encode()) % _SPREAD) / _SPREAD)


class LoadCache:
    """`EndpointLoad`s by endpoint, reused while the view is the same (or apart only in progress
    reports: `progress_only`) and the clock moved less than the load's reuse time (`REUSE_S` to twice
    that)."""

    __slots__ = ("_asked", "_kept", "_kept_refs", "_loads", "_reuse", "_writes", "fleet", "params", "touched")

    def __init__(self, params: PredictParams) -> None:
        self.params = params
        # (load, reuse time, made at, the last view it was found to stand for: `progress_only` is
        # asked once per view, not on every query while the view is the same)
        self._loads: dict[str, tuple[EndpointLoad | Pending, float, float, EndpointView]] = {}
        self._reuse: dict[str, float] = {}  # `reuse_s` by endpoint
        # The loads as arrays for placement over columns (`gateway.sched.fleet_loads.fleet_loads`).
        self.fleet: object | None = None
        # The endpoints whose entry was written since the set was last emptied (None: nobody asks). The
        # arrays keep what each entry was when they last asked (`entry`) and skip asking again about an
        # endpoint whose entry is untouched, for the same view and within its reuse time: `_ref` would
        # hand out the same load then, and do nothing else.
        self.touched: set[EndpointId] | None = None
        # The last `loads` answer: (views, their loads, asked at, until when every one is reusable).
        self._kept: tuple[Sequence[EndpointView], list[EndpointLoad], float, float] | None = None
        # The same for `refs`.
        self._kept_refs: tuple[Sequence[EndpointView], list[EndpointLoad | Pending], float, float] | None = (
            None
        )
        # Entries written so far (by `_ref`), and the last `loads` answer not kept: (its views, their
        # loads, asked at, entries written by then). The filters of one placement ask in turn about the
        # same views at the same time (the overflow guard, then best fit about those it kept: often
        # all of them): the same loads, while no entry was written since.
        self._writes = 0
        self._asked: tuple[tuple[EndpointView, ...], list[EndpointLoad], float, int] | None = None

    def loads(self, views: Sequence[EndpointView], now: float, *, keep: bool = True) -> list[EndpointLoad]:
        """`load` of each of `views`, in order. `keep`: the same list again while asked for the same
        sequence object until the first of its loads reaches its reuse time (the submits queued between
        two changes of the fleet ask about the same views: no query per endpoint each); without it, the
        answer is not kept (a placement's candidates, a new list each time)."""
        kept = self._kept
        if keep and kept is not None and kept[0] is views and kept[2] <= now <= kept[3]:
            return kept[1]
        asked = self._asked
        if (
            not keep
            and asked is not None
            and asked[2] == now
            and asked[3] == self._writes
            and len(asked[0]) == len(views)
            and all(map(is_, asked[0], views))
        ):
            return list(asked[1])
        # `load`'s fast path inline (asked for every candidate of a placement: no call per endpoint
        # while its entry stands for the same view within its reuse time)
        entries = self._loads
        ref = self._ref
        out: list[EndpointLoad] = []
        add = out.append
        for v in views:
            got = entries.get(v.id)
            if got is not None and got[3] is v and abs(got[2] - now) <= got[1]:
                load = got[0]
            else:
                load = ref(v, now, lazy=False)
                entries = self._loads  # (`_ref` empties a full table into a new one)
            add(load if type(load) is EndpointLoad else load.load())  # type: ignore[union-attr]
        if keep:
            self._kept = (views, out, now, self._until(views))
        else:
            self._asked = (tuple(views), list(out), now, self._writes)
        return out

    def _until(self, views: Sequence[EndpointView]) -> float:
        """Until when the loads kept for every one of `views` are reusable."""
        entries = self._loads
        until = math.inf
        for v in views:
            got = entries.get(v.id)
            if got is None:  # (the table was cleared meanwhile: not kept)
                return -math.inf
            until = min(until, got[2] + got[1])
        return until

    def each(self, views: Iterable[EndpointView], now: float) -> Iterator[EndpointLoad]:
        """`load` of each of `views` in turn, asked as the caller takes them (one that stops early asks
        about no further view), with `load`'s fast path inline (no call per endpoint while its entry
        stands for the same view within its reuse time)."""
        ref = self._ref
        for v in views:
            # (the table read again for each view: `_ref`, here or in what the caller asks between two
            # views, empties a full table into a new one)
            got = self._loads.get(v.id)
            if got is not None and got[3] is v and abs(got[2] - now) <= got[1]:
                load = got[0]
            else:
                load = ref(v, now, lazy=False)
            yield load if type(load) is EndpointLoad else load.load()  # type: ignore[union-attr]

    def load(self, view: EndpointView, now: float) -> EndpointLoad:
        got = self._loads.get(view.id)
        if got is not None:  # the fast path of `_ref`: the same view within its reuse time
            ref, reuse, at, seen = got
            if seen is view and abs(at - now) <= reuse:
                return ref if type(ref) is EndpointLoad else ref.load()  # type: ignore[union-attr]
        ref = self._ref(view, now, lazy=False)
        return ref if type(ref) is EndpointLoad else ref.load()  # type: ignore[union-attr]

    def refs(
        self, views: Sequence[EndpointView], now: float, *, keep: bool = False
    ) -> list[EndpointLoad | Pending]:
        """What `load` of each of `views` stands on, in order, under the same rules: the load kept, or
        for one to be made now, a `Pending` (made when `load` is asked for it), so that many loads can
        be derived at once (`gateway.sched.load_batch`). `keep`: like `loads`, the answer is kept and given
        again while asked for the same sequence object until the first of them reaches its reuse time."""
        kept = self._kept_refs
        if keep and kept is not None and kept[0] is views and kept[2] <= now <= kept[3]:
            return kept[1]
        ref = self._ref
        out = [ref(v, now, lazy=True) for v in views]
        if keep:
            self._kept_refs = (views, out, now, self._until(views))
        return out

    def _ref(self, view: EndpointView, now: float, *, lazy: bool) -> EndpointLoad | Pending:
        got = self._loads.get(view.id)
        like = None
        seen = None
        if got is not None:
            load, reuse, at, seen = got
            if abs(at - now) <= reuse:
                if seen is view:
                    return load
                if progress_only(view, load.view):
                    self._writes += 1
                    self._loads[view.id] = (load, reuse, at, view)
                    if self.touched is not None:
                        self.touched.add(view.id)
                    return load
            # the same view later, or a view apart only in what no load reads (gauges, EWMAs, progress):
            # what does not depend on the clock is taken over (`EndpointLoad`'s `like`)
            like = load
        # A load with nothing running is the same at any time: it is renewed, not remade.
        fresh: EndpointLoad | Pending
        if like is not None and not like.n and like.view is view:
            fresh = like
        else:
            params = self.params
            if like is not None and like.params is params and _same_inputs_known(view, seen, like.view):
                pace = like.pace
            else:
                pace = pace_for(view, view.perf or _PRIOR, params, like)
                if (
                    like is not None
                    and pace is not like.pace
                    and same_requests(view.running, like.view.running)
                ):
                    # new coefficients (a refit), KV capacity or cap, the same running requests: their
                    # rows are the old pace's (`load_batch.carry_rows`)
                    carry_rows(like.pace, view, pace)
            fresh = Pending(view, now, params, pace) if lazy else EndpointLoad(view, now, params, pace=pace)
        self._writes += 1
        touched = self.touched
        if len(self._loads) >= 4096:  # endpoints come and go: never grow without bound
            if touched is not None:
                touched.update(map(EndpointId, self._loads))
            self._loads = {}
            self._reuse = {}
            got = None
        if got is not None:
            until = got[1]
        else:
            known = self._reuse.get(view.id)
            if known is None:
                known = self._reuse[view.id] = reuse_s(view.id)
            until = known
        self._loads[view.id] = (fresh, until, now, view)
        if touched is not None:
            touched.add(view.id)
        return fresh

    def entry(self, eid: str) -> tuple[EndpointLoad | Pending, float, float, EndpointView] | None:
        """What the cache keeps for endpoint `eid`: (its load, reuse time, made at, the last view it was
        found to stand for), or None."""
        return self._loads.get(eid)


def _same_inputs_known(view: EndpointView, seen: EndpointView | None, old: EndpointView) -> bool:
    """Whether `same_inputs(old, view)` is known without comparing their running requests: `view` is
    `old`, or it is the view last found to stand for `old`'s load (`progress_only(seen, old)`: the same
    endpoint, cap, max batch and running requests) with `old`'s very estimates (the same coefficients
    object and KV capacity)."""
    return view is old or (view is seen and view.estimates is old.estimates)


class LoadCaches:
    """One `LoadCache` per set of prediction parameters, shared by the plugins of one policy: the
    filters of one placement (and admission and ordering, when their parameters agree) then derive each
    endpoint's load once between them."""

    __slots__ = ("_caches",)

    def __init__(self) -> None:
        self._caches: dict[PredictParams, LoadCache] = {}

    def get(self, params: PredictParams) -> LoadCache:
        cache = self._caches.get(params)
        if cache is None:
            cache = self._caches[params] = LoadCache(params)
        return cache
