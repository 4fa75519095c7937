"""Immutable views of the fleet that plugins decide on, and what several plugins derive from them alone,
listed once per tuple of views (`ReadyServing`, `FleetSnapshot.ready`). (A little over the size rule on
purpose: the views, the snapshot and what is kept per tuple of views are the one contract every plugin
reads, and their carry-over from one tuple to the next is read beside them.)"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.core.frozen import frozen
from gateway.core.types import EndpointHealth, EndpointId, EngineKind, InstanceClass, ModelName
from gateway.sched.perf import PerfCoefficients
from gateway.sched.running import RunningRequest


@dataclass(frozen=True, slots=True)
class EndpointEstimates:
    """What telemetry measured and fitted for one endpoint, as plain numbers (None: not known yet).

    The live daemon hands in a new one every few seconds (`Scheduler.set_estimates`); the offline
    simulator and tests set it the same way.
    """

    perf: PerfCoefficients | None = None  # the fitted performance model (the prior until enough data)
    kv_capacity_tokens: float | None = None  # the engine's KV cache in tokens
    ttft_ewma_s: float | None = None  # dispatch to first token, measured by the gateway
    itl_ewma_s: float | None = None  # per-token time of a stream, measured by the gateway
    tokens_per_s: float | None = None  # output tokens per second the endpoint delivered recently


@frozen
class EndpointView:
    id: EndpointId
    url: str
    engine: EngineKind
    models: frozenset[ModelName]
    instance_class: InstanceClass
    health: EndpointHealth
    cap: int  # the gateway's concurrency cap in force for this endpoint (see `max_cap`)
    inflight: int  # requests the gateway has running there now
    # Engine-reported gauges from the last fresh scrape; None when never scraped or stale.
    engine_running: float | None = None
    engine_waiting: float | None = None
    kv_usage: float | None = None
    dispatched_since_scrape: int = 0
    # Clock time of the last scrape (None: never scraped): `snap.now - scraped_at` is its age. A time
    # rather than an age, so that a view stays true, and is kept, until its endpoint changes.
    scraped_at: float | None = None
    node: str | None = None
    # Requests the gateway saw finish there since the last scrape (see `corrected_running`).
    completed_since_scrape: int = 0
    # The gateway's running-context sums over the requests it runs there (Aladdin's Σ l_in and Σ l_out):
    # prompt tokens (estimated at admission) and predicted output tokens.
    running_prompt_tokens: int = 0
    running_output_tokens: float = 0.0
    estimates: EndpointEstimates | None = None
    # The requests the gateway runs there (gateway.sched.running), oldest dispatch first.
    running: tuple[RunningRequest, ...] = ()
    # The engine runs with priority scheduling (vLLM --scheduling-policy priority): the request's
    # engine priority may be sent (an FCFS vLLM rejects a request that carries one).
    priority_scheduling: bool = False
    # The operator's hard maximum of `cap` (the configured cap): a `ConcurrencyController` moves `cap`
    # below it; 0 means "the same as cap" (views built by hand in tests).
    max_cap: int = 0
    # Token counters from the dispatcher's progress reports (`Scheduler.progress`), cumulative since the
    # endpoint was added: output tokens streamed, and the inter-token time measured over `gap_tokens` of
    # them (the time between two reports of a stream over the tokens between them; the first token's
    # wait is not a gap). A controller differences two readings for the recent per-token time and rate.
    streamed_tokens: int = 0
    gap_s: float = 0.0
    gap_tokens: int = 0
    # When the cap in force was last lowered (-inf: never), and the gaps of `gap_s`/`gap_tokens` that
    # began after it: a stream reports every few tokens, so for a while after a cut its gaps still hold
    # time it spent in the larger batch (a controller that judges the cut must not count those).
    cut_at: float = -math.inf
    gap_after_cut_s: float = 0.0
    gap_after_cut_tokens: int = 0
    # The engine's max batch (vLLM --max-num-seqs, SGLang --max-running-requests; None: unknown) and
    # its instance configuration's name: what the `sub-cluster` filter maps requests by.
    max_batch: int | None = None
    config: str | None = None

    @property
    def hard_cap(self) -> int:
        """The operator's maximum of the cap (`max_cap`, or `cap` when unset)."""
        return self.max_cap or self.cap

    @property
    def perf(self) -> PerfCoefficients | None:
        return None if self.estimates is None else self.estimates.perf

    @property
    def kv_capacity_tokens(self) -> float | None:
        return None if self.estimates is None else self.estimates.kv_capacity_tokens

    @property
    def ttft_ewma_s(self) -> float | None:
        return None if self.estimates is None else self.estimates.ttft_ewma_s

    @property
    def itl_ewma_s(self) -> float | None:
        return None if self.estimates is None else self.estimates.itl_ewma_s

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.estimates is None else self.estimates.tokens_per_s

    @property
    def corrected_running(self) -> float:
        """Requests the engine holds now (running + waiting), best guess: its last fresh report corrected
        by what the gateway dispatched and saw finish there since, so a burst between two scrapes counts
        at once. Without fresh metrics, the gateway's own in-flight count."""
        if self.engine_running is None:
            return float(self.inflight)
        reported = self.engine_running + (self.engine_waiting or 0.0)
        return max(0.0, reported + self.dispatched_since_scrape - self.completed_since_scrape)

    @property
    def has_room(self) -> bool:
        return self.inflight < self.cap

    @property
    def fresh(self) -> bool:
        return self.engine_running is not None

    @property
    def outstanding(self) -> float:
        """Load for least-outstanding: the gateway's in-flight plus what waits inside the engine.

        `inflight` is exact and current (it already counts what was dispatched since the last scrape);
        the engine's waiting count adds traffic that reached the engine by other routes. Without fresh
        metrics the gateway's own count is all there is.
        """
        waiting = self.engine_waiting or 0.0
        return float(self.inflight) + waiting


@dataclass(frozen=True, slots=True, eq=False)
class FleetColumns:
    """Per-endpoint numbers of one tuple of views (`endpoints`), as arrays in its order, for placement
    plugins with a columnar form (`gateway.sched.columns` builds and updates them). Never mutated: an
    update makes new arrays, so a snapshot's columns stay those of its views."""

    endpoints: tuple[EndpointView, ...]
    inflight: npt.NDArray[np.int64]
    cap: npt.NDArray[np.int64]
    ready: npt.NDArray[np.bool_]
    waiting: npt.NDArray[np.float64]  # engine waiting from fresh gauges (`engine_waiting or 0.0`)
    outstanding: npt.NDArray[np.float64]  # inflight + waiting (`EndpointView.outstanding`)
    id_rank: npt.NDArray[np.int64]  # each endpoint's place in the order of the endpoint ids
    members: Mapping[ModelName, npt.NDArray[np.bool_]]  # per model: which endpoints serve it
    # The requests running there (`len(running)`: an endpoint's load has nothing to derive without any)
    # and the seats they run in (`gateway.sched.predict.seats_of`).
    busy: npt.NDArray[np.int64]
    seats: npt.NDArray[np.int64]
    # Per instance class: which endpoints are of it.
    classes: Mapping[InstanceClass, npt.NDArray[np.bool_]]
    # Each endpoint's prefill and decode coefficients (its fitted model, else the prior, as predictions
    # take them), one row per endpoint: k1, c1, k2, c2, c3 (`PerfCoefficients`).
    coef: npt.NDArray[np.float64]
    index: Mapping[EndpointId, int]  # each endpoint's place in `endpoints`

    def eligible(self, model: ModelName) -> npt.NDArray[np.bool_]:
        """`gateway.sched.profile.eligible` as a mask: serves the model, ready, room under its cap."""
        serves = self.members.get(model)
        if serves is None:
            return np.zeros(len(self.endpoints), dtype=np.bool_)
        return serves & self.ready & (self.inflight < self.cap)


class ReadyServing:
    """The ready endpoints of one tuple of views that serve one model (`endpoints`, in the views'
    order), those with a free seat (`open`), their free seats in all (`free`: each endpoint's seats,
    `seats_of`, less its running requests, when positive), and how many have
    room under their cap (`roomy`: in flight below cap). Not to be changed.

    SLO admission (its free seats), the slack ordering (the endpoints with the fewest seats taken, for
    its delay), demand-split (the ids its blocks are cut from) and serving (whether any endpoint has
    room, `FleetSnapshot.has_room`) each start from this list. With a standing queue each submit sees a
    new tuple of views (a completion and a dispatch changed some endpoint's), and admission and serving
    then ask about the same tuple: it is listed once per tuple and model (`FleetSnapshot.ready`), and
    for the next tuple derived from this one where only a few entries were replaced (`after`)."""

    __slots__ = ("_at", "_fewest", "_ids", "_open_at", "_taken", "endpoints", "free", "open", "roomy")

    def __init__(self, model: ModelName, views: Sequence[EndpointView]) -> None:
        ready = EndpointHealth.READY
        endpoints: list[EndpointView] = []
        open_: list[EndpointView] = []
        open_at: list[int] = []  # their places in `endpoints`
        free = 0
        roomy = 0
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
                    open_at.append(len(endpoints) - 1)
                    open_.append(e)
                if e.inflight < e.cap:
                    roomy += 1
        self.endpoints = endpoints
        self.open = open_
        self._open_at = open_at
        self.free = free
        self.roomy = roomy
        self._fewest: tuple[int, list[EndpointView]] | None = None
        # (seats taken, place in `endpoints`) of every endpoint, sorted (made when first asked)
        self._taken: list[tuple[int, int]] | None = None
        self._ids: tuple[EndpointId, ...] | None = None
        # each listed endpoint's place in the views -> its place in `endpoints` (made when first derived)
        self._at: dict[int, int] | None = None

    def after(
        self,
        model: ModelName,
        old: Sequence[EndpointView],
        views: Sequence[EndpointView],
        changed: Iterable[int],
    ) -> ReadyServing | None:
        """The list for `views`, where only the entries at the places `changed` differ from `old` (the
        views this list was made for): made from this one in a step per changed place instead of a walk
        of every view. None when an endpoint joined or left the list (its health or models changed):
        the caller lists them anew."""
        at = self._at
        ready = EndpointHealth.READY
        if at is None:
            members = [i for i, e in enumerate(old) if model in e.models and e.health is ready]
            at = self._at = {i: k for k, i in enumerate(members)}
        endpoints: list[EndpointView] | None = None
        open_: list[EndpointView] | None = None
        open_at: list[int] = self._open_at
        taken = self._taken
        taken_copied = False
        free, roomy = self.free, self.roomy
        for i in changed:
            k = at.get(i)
            v = views[i]
            if (k is not None) != (model in v.models and v.health is ready):
                return None
            if k is None:
                continue
            if endpoints is None:
                endpoints = self.endpoints.copy()
            o = endpoints[k]
            endpoints[k] = v
            # each one's seats (`seats_of`) less its running requests, inline (calls per changed place)
            mb, seats = o.max_batch, o.cap
            if mb is not None and mb < seats:
                seats = mb
            was = (seats if seats > 1 else 1) - len(o.running)
            mb, seats = v.max_batch, v.cap
            if mb is not None and mb < seats:
                seats = mb
            now = (seats if seats > 1 else 1) - len(v.running)
            if was > 0 or now > 0:
                if open_ is None:
                    open_, open_at = self.open.copy(), open_at.copy()
                j = bisect_left(open_at, k)
                if was > 0 and now > 0:
                    open_[j] = v
                elif was > 0:
                    del open_[j], open_at[j]
                else:
                    open_.insert(j, v)
                    open_at.insert(j, k)
            free += (now if now > 0 else 0) - (was if was > 0 else 0)
            roomy += (v.inflight < v.cap) - (o.inflight < o.cap)
            if taken is not None and v.inflight - v.cap != o.inflight - o.cap:
                if not taken_copied:
                    taken, taken_copied = taken.copy(), True
                del taken[bisect_left(taken, (o.inflight - o.cap, k))]
                insort(taken, (v.inflight - v.cap, k))
        got = ReadyServing.__new__(ReadyServing)
        got.endpoints = self.endpoints if endpoints is None else endpoints
        got.open = self.open if open_ is None else open_
        got._open_at = open_at
        got.free = free
        got.roomy = roomy
        got._fewest = None
        got._taken = taken
        got._ids = self._ids  # the same endpoints
        got._at = at
        return got

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
            # the places sorted by seats taken, ties by place: nsmallest's order (carried over by `after`)
            taken = self._taken
            if taken is None:
                taken = self._taken = sorted([(e.inflight - e.cap, k) for k, e in enumerate(endpoints)])
            got = [endpoints[k] for _, k in taken[:n]]
        self._fewest = (n, got)
        return got

    def ids(self) -> tuple[EndpointId, ...]:
        """The endpoints' ids, in the views' order."""
        got = self._ids
        if got is None:
            got = self._ids = tuple(e.id for e in self.endpoints)
        return got


def same_speed(view: EndpointView, old: EndpointView) -> bool:
    """Whether a model's idle bound (`gateway.sched.idle.fleet_bound`) takes the same from both views of
    one place in a tuple (the same endpoint, health, models and coefficients). The coefficients are
    compared as objects: telemetry hands every endpoint new estimates every second, most with new
    measured averages only and the same coefficients object, which nothing keyed on the speeds reads."""
    return (
        view.id == old.id
        and view.health is old.health
        and (view.estimates is old.estimates or view.perf is old.perf)
        and view.models == old.models
    )


def seats_of(view: EndpointView) -> int:
    """The requests the endpoint runs at once: its cap, or its engine's max batch when that is less
    (the engine runs at most its max batch, whatever berth's cap lets in)."""
    mb = view.max_batch
    return max(1, view.cap if mb is None or mb >= view.cap else mb)


#: A test of one view, and the objects its answer depends on besides the view (`ViewsMemo.places`).
_Test = Callable[[EndpointView], bool]
_Places = tuple[tuple[object, ...], _Test, list[int]]
#: Tests whose places a memo keeps at most (a policy change brings new ones: never grow without bound).
_MAX_TESTS: Final = 8


class ViewsMemo:
    """What plugins derive from one tuple of views alone (`endpoints`), kept for every snapshot of that
    tuple: the scheduler hands the same memo to the snapshots it takes while its views stay the same
    objects (`FleetSnapshot.ready`, `FleetSnapshot.places`). A snapshot whose views are another tuple
    (one cut to part of the fleet) does not use it."""

    __slots__ = ("_places", "_speeds", "endpoints", "ready")

    def __init__(self, endpoints: tuple[EndpointView, ...]) -> None:
        self.endpoints = endpoints
        self.ready: dict[ModelName, ReadyServing] = {}  # per model (`FleetSnapshot.ready`)
        self._places: list[_Places] = []  # per test (`places`)
        self._speeds: object | None = None  # (`speeds`; None: not asked yet)

    def speeds(self) -> object:
        """A token shared by the memos whose views have at every place the same speed (`same_speed`) as
        the views it was made for: carried over to the next tuple when every replaced place kept its
        speed (`of`), else a new one. Made when first asked (nothing is carried before)."""
        got = self._speeds
        if got is None:
            got = self._speeds = object()
        return got

    def places(self, key: tuple[object, ...], test: _Test) -> list[int]:
        """The places of the views for which `test` holds, in order; kept under `key` (the objects the
        test's answers depend on besides the view, compared by identity) and carried over to the next
        tuple at the places that changed (`of`). Not to be changed."""
        for k, _, got in self._places:
            if len(k) == len(key) and all(a is b for a, b in zip(k, key, strict=True)):
                return got
        got = [i for i, e in enumerate(self.endpoints) if test(e)]
        if len(self._places) >= _MAX_TESTS:
            del self._places[0]
        self._places.append((key, test, got))
        return got

    @staticmethod
    def of(
        views: tuple[EndpointView, ...], last: ViewsMemo | None, changed: Collection[int] | None = None
    ) -> ViewsMemo:
        """The memo for snapshots of `views`: `last` when it is that of the same tuple. Else a new one;
        `changed` given, the places where `views` differs from `last`'s views (the rest are the same
        objects): what `last` listed is carried over, brought up to date at those places (`after`)."""
        if last is not None and last.endpoints is views:
            return last
        memo = ViewsMemo(views)
        if last is None or changed is None or len(changed) > len(views) // 4:
            return memo
        old = last.endpoints
        if len(old) == len(views):
            speeds = last._speeds
            if speeds is not None:
                for i in changed:
                    # `same_speed`, inline (a call per changed place otherwise)
                    v, o = views[i], old[i]
                    if not (
                        v.id == o.id
                        and v.health is o.health
                        and (v.estimates is o.estimates or v.perf is o.perf)
                        and v.models == o.models
                    ):
                        break
                else:
                    memo._speeds = speeds
            for model, serving in last.ready.items():
                got = serving.after(model, old, views, changed)
                if got is not None:
                    memo.ready[model] = got
            memo._places = [
                (key, test, _carried(places, views, changed, test)) for key, test, places in last._places
            ]
        return memo


def _carried(
    places: list[int], views: Sequence[EndpointView], changed: Iterable[int], test: _Test
) -> list[int]:
    """`places`, the places of a test's views, for `views`: asked again at the `changed` places only."""
    out = places
    for i in changed:
        j = bisect_left(out, i)
        had = j < len(out) and out[j] == i
        if had != test(views[i]):
            if out is places:
                out = places.copy()
            if had:
                del out[j]
            else:
                out.insert(j, i)
    return out


@frozen
class FleetSnapshot:
    now: float
    endpoints: tuple[EndpointView, ...]
    # Queue depth per model at the time of the snapshot (for plugins that weigh the backlog).
    queued: dict[ModelName, int] = field(default_factory=dict)
    # The endpoints' numbers as arrays, when the scheduler's profile places over columns; they belong to
    # `endpoints` only while `columns.endpoints is endpoints` (a snapshot cut to part of the fleet keeps
    # them but is placed the plain way).
    columns: FleetColumns | None = field(default=None, compare=False)
    # What plugins derive from `endpoints` alone, shared by the snapshots of the same views (used only
    # while `memo.endpoints is endpoints`).
    memo: ViewsMemo | None = field(default=None, compare=False)

    def ready(self, model: ModelName) -> ReadyServing:
        """`ReadyServing` of the views for `model`: kept on the memo when it is that of these views
        (every snapshot the scheduler takes of the same views shares one), else made for this call."""
        memo = self.memo
        if memo is None or memo.endpoints is not self.endpoints:
            return ReadyServing(model, self.endpoints)
        got = memo.ready.get(model)
        if got is None:
            got = memo.ready[model] = ReadyServing(model, self.endpoints)
        return got

    def has_room(self, model: ModelName) -> bool:
        """Whether a ready endpoint that serves `model` has room under its cap (in flight below cap):
        counted on the memo's list when it has one for these views (`ReadyServing.roomy`), else a walk
        that stops at the first such endpoint (a list made for this call alone would walk them all)."""
        memo = self.memo
        if memo is not None and memo.endpoints is self.endpoints:
            got = memo.ready.get(model)
            if got is not None:
                return got.roomy > 0
        ready = EndpointHealth.READY
        return any(model in e.models and e.health is ready and e.has_room for e in self.endpoints)

    def places(self, key: tuple[object, ...], test: _Test) -> list[int] | None:
        """The places of the views for which `test` holds (`ViewsMemo.places`: kept under `key`), when
        the memo is that of these views; None: not kept (the caller tests every view)."""
        memo = self.memo
        if memo is None or memo.endpoints is not self.endpoints:
            return None
        return memo.places(key, test)

    def serving(self, model: ModelName) -> tuple[EndpointView, ...]:
        return tuple(e for e in self.endpoints if model in e.models)

    def get(self, endpoint_id: EndpointId) -> EndpointView | None:
        for e in self.endpoints:
            if e.id == endpoint_id:
                return e
        return None
