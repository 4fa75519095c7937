"""CATO's slack ordering, recomputed every time the queue is served.

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
"""

from __future__ import annotations

import math
from typing import Annotated, Final, Literal

from msgspec import Meta

from gateway.core.types import EndpointHealth
from gateway.sched.interfaces import OrderKey
from gateway.sched.loads import LoadCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.predict import PredictParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens
from gateway.sched.snapshot import FleetSnapshot
from gateway.sched.targets import itl_ok, time_left

#: Slack of a request without targets (finite, as ordering keys must be).
UNLIMITED: Final = 1e15

LATE, AT_RISK, CAN_WAIT, BEST_EFFORT = 0, 1, 2, 3


class SlackParams(PredictionParams, frozen=True, kw_only=True):
    late: Literal["first", "last"] = "first"  # CATO serves requests already late first
    at_risk: Literal["first", "last"] = "first"  # CATO serves those no endpoint can meet now next
    # A request's key is reused this long (seconds) while the queue is served.
    key_ttl_s: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.02


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
        late_first = params.late == "first"
        order = [LATE] if late_first else []
        order += [AT_RISK, CAN_WAIT] if params.at_risk == "first" else [CAN_WAIT, AT_RISK]
        order += [] if late_first else [LATE]
        order.append(BEST_EFFORT)
        self._rank_of = {cls: rank for rank, cls in enumerate(order)}

    def _rank(self, cls: int) -> int:
        """The position of a CATO class in this ordering (0 first): CATO's own order is 0, 1, 2, 3."""
        return self._rank_of[cls]

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        cls, slack = self._keys.assess(req, snap)
        return (float(self._rank(cls)), slack)

    def engine_priority(self, req: SchedRequest, snap: FleetSnapshot) -> int | None:
        cls, _ = self._keys.assess(req, snap)
        return self._rank(cls)


SPEC = PluginSpec(
    PluginKind.ORDERING,
    "slack",
    SlackParams,
    lambda p, ctx: SlackOrdering(p, ctx.loads.get(p.predict_params())),
    "CATO: late, at risk, can wait; least slack first",
)
