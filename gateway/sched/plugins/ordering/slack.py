"""CATO's slack ordering: the queue kept ranked by each request's latest start (the default), or every
key recomputed each time the queue is served (`queue = "scan"`).

Each queued request gets a priority class, then its slack orders it within the class:

| class | when                                                                  |
| ----- | --------------------------------------------------------------------- |
| 0     | its slack is already gone: even alone on the best endpoint it is late |
| 1     | no endpoint can meet it at its current load (predicted)               |
| 2     | some endpoint can (it can afford to wait)                             |
| 3     | best-effort (demoted by admission)                                    |

Slack = time left before the request's deadline minus its predicted time to that deadline's token on
the best endpoint serving its model at that endpoint's current load (first-token deadline: wait and
prefill; last-token deadline: wait, prefill and decode in the batch it joins); the slack is "already
gone" (class 0) when even alone on the best endpoint it would be late. Time passes and predictions
change as endpoints fill and empty, so the key of a waiting request moves. A request without any
target is class 2 with unlimited slack: it runs after every request that has one, in arrival order.

`late = "last"` puts class 0 after class 2, and `at_risk = "last"` class 1 after class 2 (goodput over
CATO's order: a request that will probably miss stops delaying those that can still make it). A
request's position in the resulting order of classes is also the engine priority sent to endpoints
with priority scheduling (0 most urgent).

**The ranked queue** (`queue = "ranked"`). Asking every key each time the queue is served costs a
prediction per queued request and endpoint, which with a thousand requests waiting on a hundred
endpoints is tens of milliseconds per completion. The ranked queue splits a request's slack into what
is its own and what is common to every request of the model: slack ≈ L − now − D, where L, its latest
start, is its deadlines less its idle service at the model's fastest coefficients (`gateway.sched.idle`:
the per-coefficient minimum over the ready endpoints; L moves only when a refit moves that bound by more
than 2 %, and then every queued request is ranked again), and D, the fleet's current delay, is the least
wait for a seat plus the pending prefills ahead over the ready endpoints with the most free seats (asked
once per serve). Then:

| class    | ranked rule        | the scan's rule                                          |
| -------- | ------------------ | -------------------------------------------------------- |
| late     | L < now            | even alone on the best endpoint it is late (same test at |
|          |                    | the fastest coefficients: the same class on a fleet of   |
|          |                    | one kind of hardware)                                    |
| at risk  | now <= L < now + D | no endpoint meets it at its current load                 |
| can wait | L >= now + D       | some endpoint does                                       |

and within a class requests go by L (by L − now − D, the same order). The next request is the first of
the first class in the configured order that has one: three binary searches over the ranks
(`gateway.sched.ranked.RankIndex`), whatever the queue's length. By design it differs from the scan
where the load delays requests differently: D leaves out the slower decoding of the batch a request
joins (its last-token deadline) and per-endpoint differences in prefill speed, and an inter-token target
alone does not make a request at risk. `approximate_key` is the ranked rule as a key (the queue's picks
equal a scan of it); the scheduling benchmark compares goodput under both settings.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from collections.abc import Set as AbstractSet
from typing import Annotated, Final, Literal

from msgspec import Meta

from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.idle import IdleBound, KeptBounds, latest_start, output_bound, speeds_of
from gateway.sched.interfaces import OrderKey, Rank, RankedQueue
from gateway.sched.loads import LoadCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.predict import PredictParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.targets import itl_ok, time_left

#: Slack of a request without targets (finite, as ordering keys must be).
UNLIMITED: Final = 1e15

LATE, AT_RISK, CAN_WAIT, BEST_EFFORT = 0, 1, 2, 3
#: Rank groups of the ranked queue: requests with a deadline (by latest start), requests without one
#: (and those whose model has no ready endpoint: the scan's unlimited slack), demoted requests.
TIMED, UNTIMED, DEMOTED = 0, 1, 2
_FIRST: Final = -math.inf
#: Endpoints the delay D is taken over (those with the most free seats).
DELAY_SAMPLE: Final = 4


class SlackParams(PredictionParams, frozen=True, kw_only=True):
    late: Literal["first", "last"] = "first"  # CATO serves requests already late first
    at_risk: Literal["first", "last"] = "first"  # CATO serves those no endpoint can meet now next
    # A request's key is reused this long (seconds) while the queue is served (queue = "scan").
    key_ttl_s: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.02
    # ranked: the queue kept ranked by latest start (the module docstring); scan: every key asked each
    # time the queue is served.
    queue: Literal["ranked", "scan"] = "ranked"


def assess(req: SchedRequest, snap: FleetSnapshot, cache: LoadCache) -> tuple[int, float]:
    """(CATO class, slack in seconds) of `req` at `snap.now`; best-effort requests are class 3."""
    now = snap.now
    ttft_left, e2e_left = time_left(req, now)
    itl = req.slo.itl_ms
    if req.best_effort:
        return BEST_EFFORT, UNLIMITED
    if ttft_left is None and e2e_left is None and itl is None:
        return CAN_WAIT, UNLIMITED
    p = float(req.prompt_tokens)
    cached = bool(req.cached)
    best_idle = best = -math.inf
    feasible = False
    seen = False
    out: float | None = None
    for e in snap.endpoints:
        if req.model not in e.models or e.health is not EndpointHealth.READY:
            continue
        load = cache.load(e, now)
        if out is None:
            out = load.output_tokens(req)
        seen = True
        idle_ttft, idle_e2e, ttft, e2e = load.times(p, out, prefill_tokens(req, e.id) if cached else None)
        s_idle = s = math.inf
        if ttft_left is not None:
            s_idle, s = ttft_left - idle_ttft, ttft_left - ttft
        if e2e_left is not None:
            s_idle, s = min(s_idle, e2e_left - idle_e2e), min(s, e2e_left - e2e)
        best_idle = max(best_idle, s_idle)
        best = max(best, s)
        if s >= 0 and not feasible:
            feasible = itl is None or itl_ok(req, load.predict(req))
    if not seen:
        return CAN_WAIT, UNLIMITED
    slack = max(-UNLIMITED, min(UNLIMITED, best))
    if best_idle < 0:
        return LATE, slack
    return (CAN_WAIT if feasible else AT_RISK), slack


class KeyCache:
    """Assessments by request, reused for `ttl_s`: serving a queue places one request at a time and
    asks for every key again in between; within a few milliseconds the answers barely move."""

    __slots__ = ("_cache", "_keys", "ttl_s")

    def __init__(self, params: PredictParams, ttl_s: float, loads: LoadCache | None = None) -> None:
        self._cache = loads or LoadCache(params)
        self._keys: dict[str, tuple[float, tuple[int, float]]] = {}
        self.ttl_s = ttl_s

    def assess(self, req: SchedRequest, snap: FleetSnapshot) -> tuple[int, float]:
        now = snap.now
        got = self._keys.get(req.id)
        if got is not None and 0.0 <= now - got[0] <= self.ttl_s:
            return got[1]
        value = assess(req, snap, self._cache)
        keys = self._keys
        if len(keys) >= 8192:  # forget requests that left the queue (their keys are old)
            self._keys = keys = {k: v for k, v in keys.items() if 0.0 <= now - v[0] <= self.ttl_s}
        keys[req.id] = (now, value)
        return value


class SlackOrdering:
    name = "slack"

    def __init__(self, params: SlackParams, loads: LoadCache | None = None) -> None:
        self.params = params
        self._keys = KeyCache(params.predict_params(), params.key_ttl_s, loads)
        predict = params.predict_params()
        self._loads = loads or LoadCache(predict)
        self._gamma = predict.gamma
        self._alone = 1.0 + params.prefill_overhead
        self.ranks = params.queue == "ranked"  # the queue reads this (gateway.sched.queues.ranked)
        self._bounds: dict[ModelName, IdleBound | None] = {}  # per model: the bound ranks were given at
        self._fleet_bounds = KeptBounds()
        # Per model, the last epoch: (the snapshot's views, their speed token, the answer).
        self._epochs: dict[ModelName, tuple[tuple[EndpointView, ...], object | None, IdleBound | None]] = {}
        # The last delay: (model, the snapshot's views, its clock, the answer).
        self._delay: tuple[ModelName, tuple[EndpointView, ...], float, float] | None = None
        late_first = params.late == "first"
        order = [LATE] if late_first else []
        order += [AT_RISK, CAN_WAIT] if params.at_risk == "first" else [CAN_WAIT, AT_RISK]
        order += [] if late_first else [LATE]
        order.append(BEST_EFFORT)
        self._order = tuple(order)
        self._rank_of = {cls: rank for rank, cls in enumerate(order)}

    def rank_of(self, cls: int) -> int:
        """The position of a CATO class in this ordering (0 first): CATO's own order is 0, 1, 2, 3."""
        return self._rank_of[cls]

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        cls, slack = self._keys.assess(req, snap)
        return (float(self.rank_of(cls)), slack)

    def engine_priority(self, req: SchedRequest, snap: FleetSnapshot) -> int | None:
        """The request's class position: by the ranked rule when the queue is ranked (what it was
        picked by, without a prediction per endpoint), else by its exact assessment."""
        if self.ranks:
            self.rank_epoch(req.model, snap)
            return self._rank_of[self._ranked(req, snap)[0]]
        cls, _ = self._keys.assess(req, snap)
        return self.rank_of(cls)

    # ----------------------------------------------------------------- the ranked queue
    def rank_epoch(self, model: ModelName, snap: FleetSnapshot) -> Hashable:
        """The fastest idle bound of `model`'s ready endpoints, kept while a refit moves it less than
        the tolerance (`IdleBound.close_to`)."""
        views = snap.endpoints
        speeds = speeds_of(snap)
        last = self._epochs.get(model)
        if last is not None and (last[0] is views or (speeds is not None and last[1] is speeds)):
            # The same views (the serves of one event ask again), or views whose speed token is the last
            # ones' (`ViewsMemo.speeds`: the same speed at every place): `KeptBounds.epoch` is the last
            # one then, so is the bound, and so the answer.
            return last[2]
        bound = self._bound_for(model, snap)
        self._epochs[model] = (views, speeds, bound)
        return bound

    def _bound_for(self, model: ModelName, snap: FleetSnapshot) -> IdleBound | None:
        bound = self._fleet_bounds.bound(snap, model, slowest=False)
        kept = self._bounds.get(model)
        if kept is not None and bound is not None and (kept is bound or kept.close_to(bound)):
            return kept
        self._bounds[model] = bound
        return bound

    def rank(self, req: SchedRequest, snap: FleetSnapshot) -> Rank:
        if req.best_effort:
            return DEMOTED, 0.0
        bound = self._bounds.get(req.model)
        if bound is None:
            return UNTIMED, 0.0
        at = latest_start(req, bound, float(req.prompt_tokens), output_bound(req, self._gamma), self._alone)
        return (UNTIMED, 0.0) if at is None else (TIMED, at)

    def delay(self, model: ModelName, snap: FleetSnapshot) -> float:
        """D: the least wait for a seat plus the prefills pending ahead, over the `DELAY_SAMPLE` ready
        endpoints of `model` with the most free seats (the others have longer waits), at their current
        load; 0 with none. Kept for the snapshot's views and clock (the serves of one event ask again)."""
        endpoints = snap.endpoints
        now = snap.now
        kept = self._delay
        if kept is not None and kept[0] == model and kept[1] is endpoints and kept[2] == now:
            return kept[3]
        # the ready endpoints listed once for the snapshot's views (`FleetSnapshot.ready`)
        serving = snap.ready(model).fewest_taken(DELAY_SAMPLE)
        best = math.inf
        for load in self._loads.each(serving, now):
            best = min(best, load.wait_s + load.coef.k1 * load.pending_prompt)
        d = 0.0 if best == math.inf else max(0.0, best)
        self._delay = (model, endpoints, now, d)
        return d

    def pick(
        self, queue: RankedQueue, model: ModelName, snap: FleetSnapshot, skipped: AbstractSet[int]
    ) -> int | None:
        """The first request of the first class (in the configured order) that has one."""
        now = snap.now
        d: float | None = None
        for cls in self._order:
            if cls == LATE:
                got = queue.first_from(TIMED, _FIRST, skipped)
                if got is not None and got[0] < now:
                    return got[1]
            elif cls == AT_RISK:
                got = queue.first_from(TIMED, now, skipped)
                if got is not None:
                    if d is None:
                        d = self.delay(model, snap)
                    if got[0] < now + d:
                        return got[1]
            elif cls == CAN_WAIT:
                if d is None:
                    d = self.delay(model, snap)
                got = queue.first_from(TIMED, now + d, skipped) or queue.first_from(UNTIMED, _FIRST, skipped)
                if got is not None:
                    return got[1]
            else:
                got = queue.first_from(DEMOTED, _FIRST, skipped)
                if got is not None:
                    return got[1]
        return None

    def approximate_key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        """The ranked rule as a key (after `rank_epoch` for the request's model on `snap`): a scan of
        these keys picks what the ranked queue picks."""
        cls, slack = self._ranked(req, snap)
        return float(self.rank_of(cls)), slack

    def _ranked(self, req: SchedRequest, snap: FleetSnapshot) -> tuple[int, float]:
        """The ranked rule's CATO class for `req` and its slack (`UNLIMITED` without a deadline): the
        class `engine_priority` gives, and `approximate_key`'s key."""
        group, at = self.rank(req, snap)
        if group == DEMOTED:
            return BEST_EFFORT, UNLIMITED
        if group == UNTIMED:
            return CAN_WAIT, UNLIMITED
        now = snap.now
        d = self.delay(req.model, snap)
        return (LATE if at < now else AT_RISK if at < now + d else CAN_WAIT), at - now - d


SPEC = PluginSpec(
    PluginKind.ORDERING,
    "slack",
    SlackParams,
    lambda p, ctx: SlackOrdering(p, ctx.loads.get(p.predict_params())),
    "CATO: late, at risk, can wait; least slack first",
)
