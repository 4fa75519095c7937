"""The scheduler: a sans-IO state machine over the fleet and the per-model queues.

Events in (`submit`, `complete`, `cancel`, `tick`, endpoint updates), decisions out (`Dispatch`,
`Reject`). The live daemon turns decisions into awaited futures; the offline simulator and the tests
call the same methods with a fake clock.

Queue discipline: requests wait in one queue per model. Whenever capacity may have appeared (a request
completed, an endpoint changed, a tick) the queue is served: the request with the smallest ordering key
is placed through the policy's profile; when the profile finds nothing eligible for it, serving that
model stops (strict priority: a lower-priority request never overtakes one that is waiting for room).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.errors import BerthError
from gateway.core.types import (
    EndpointHealth,
    EndpointId,
    EngineGauges,
    EngineKind,
    InstanceClass,
    ModelName,
    RequestId,
)
from gateway.sched.profile import Policy
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """An endpoint as configured (or given with --endpoint)."""

    id: EndpointId
    url: str
    engine: EngineKind
    models: frozenset[ModelName]  # empty: discover from the engine's /v1/models
    instance_class: InstanceClass = InstanceClass.MIXED
    cap: int = 64
    node: str | None = None


@dataclass(frozen=True, slots=True)
class QueueLimits:
    max_queue_per_model: int = 1024
    max_wait_s: float = 30.0
    retry_after_s: float = 1.0
    # Engine metrics older than this are stale: the gateway's own counts take over.
    stale_after_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Dispatch:
    req: SchedRequest
    endpoint: EndpointView


@dataclass(frozen=True, slots=True)
class Reject:
    req: SchedRequest
    error: BerthError


Decision = Dispatch | Reject


class _Endpoint:
    __slots__ = ("dispatched_since_scrape", "gauges", "health", "inflight", "models", "scraped_at", "spec")

    def __init__(self, spec: EndpointSpec) -> None:
        self.spec = spec
        self.models: frozenset[ModelName] = spec.models
        self.health = EndpointHealth.STARTING
        self.inflight = 0
        self.gauges: EngineGauges | None = None
        self.scraped_at: float | None = None
        self.dispatched_since_scrape = 0

    def view(self, now: float, stale_after_s: float) -> EndpointView:
        age = None if self.scraped_at is None else now - self.scraped_at
        g = self.gauges if age is not None and age <= stale_after_s else None
        s = self.spec
        return EndpointView(
            id=s.id,
            url=s.url,
            engine=s.engine,
            models=self.models,
            instance_class=s.instance_class,
            health=self.health,
            cap=s.cap,
            inflight=self.inflight,
            engine_running=None if g is None else g.running,
            engine_waiting=None if g is None else g.waiting,
            kv_usage=None if g is None else g.kv_usage,
            dispatched_since_scrape=self.dispatched_since_scrape,
            scrape_age_s=age,
            node=s.node,
        )


@dataclass(slots=True)
class _Queued:
    req: SchedRequest
    seq: int
    exclude: frozenset[EndpointId] = field(default_factory=frozenset)


class Scheduler:
    def __init__(self, policy: Policy, clock: Clock, limits: QueueLimits | None = None) -> None:
        self._policy = policy
        self._clock = clock
        self._limits = limits or QueueLimits()
        self._endpoints: dict[EndpointId, _Endpoint] = {}
        self._queues: dict[ModelName, list[_Queued]] = {}
        self._running: dict[RequestId, EndpointId] = {}
        self._seq = itertools.count()

    # ----------------------------------------------------------------- configuration
    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def limits(self) -> QueueLimits:
        return self._limits

    def set_policy(self, policy: Policy) -> list[Decision]:
        """Swap the policy in one step; queued requests are re-served under the new one."""
        self._policy = policy
        return self._serve_all()

    def set_limits(self, limits: QueueLimits) -> list[Decision]:
        self._limits = limits
        return self._serve_all()

    def sync_endpoints(self, specs: Sequence[EndpointSpec]) -> list[Decision]:
        """Make the endpoint set equal to `specs`, keeping runtime state of endpoints that stay.

        A removed endpoint takes no new requests; requests running there finish normally.
        """
        wanted = {s.id: s for s in specs}
        for eid in list(self._endpoints):
            if eid not in wanted:
                del self._endpoints[eid]
        # Forget what ran on removed endpoints: their complete() is then a no-op, and cannot decrement
        # an endpoint added again later under the same id.
        self._running = {r: e for r, e in self._running.items() if e in wanted}
        for eid, spec in wanted.items():
            ep = self._endpoints.get(eid)
            if ep is None:
                self._endpoints[eid] = _Endpoint(spec)
            elif ep.spec != spec:
                discovered = ep.models if not spec.models else spec.models
                if ep.spec.url != spec.url:  # a different server: start over
                    fresh = _Endpoint(spec)
                    fresh.inflight = ep.inflight
                    self._endpoints[eid] = fresh
                else:
                    ep.spec = spec
                    ep.models = discovered
        return self._serve_all()

    # ----------------------------------------------------------------- endpoint events
    def set_health(self, eid: EndpointId, health: EndpointHealth) -> list[Decision]:
        ep = self._endpoints.get(eid)
        if ep is None or ep.health is health:
            return []
        ep.health = health
        return self._serve_all() if health is EndpointHealth.READY else []

    def set_models(self, eid: EndpointId, models: Iterable[str]) -> list[Decision]:
        """Models an endpoint reported at /v1/models; ignored when its models are configured."""
        ep = self._endpoints.get(eid)
        if ep is None or ep.spec.models:
            return []
        new = frozenset(ModelName(m) for m in models)
        if new == ep.models:
            return []
        ep.models = new
        return self._serve_all()

    def observe_gauges(self, eid: EndpointId, gauges: EngineGauges) -> list[Decision]:
        ep = self._endpoints.get(eid)
        if ep is None:
            return []
        ep.gauges = gauges
        ep.scraped_at = self._clock.now()
        ep.dispatched_since_scrape = 0
        return []

    # ----------------------------------------------------------------- request events
    def submit(self, req: SchedRequest, *, exclude: frozenset[EndpointId] = frozenset()) -> Decision | None:
        """A new request (or a retry that must avoid `exclude`). None: it waits in the queue."""
        if not self._any_ready(req.model):
            return Reject(req, errors.no_ready_endpoint(req.model, self._limits.retry_after_s))
        queue = self._queues.setdefault(req.model, [])
        if len(queue) >= self._limits.max_queue_per_model:
            return Reject(req, errors.queue_full(req.model, self._limits.retry_after_s))
        queue.append(_Queued(req, next(self._seq), exclude))
        # submit can report one decision only, so it may place `req` and nothing else: a queued request
        # that became placeable without an event that serves (a cancel, time passing) waits for the next
        # complete/tick instead of being dispatched here and never reported.
        out: list[Decision] = []
        self._serve(req.model, out, only=req.id)
        return out[0] if out else None

    def complete(self, req_id: RequestId) -> list[Decision]:
        """A dispatched request finished (any outcome); its slot is free again."""
        eid = self._running.pop(req_id, None)
        if eid is None:
            return []
        ep = self._endpoints.get(eid)
        if ep is None:
            return []
        ep.inflight -= 1
        out: list[Decision] = []
        for m in ep.models:
            self._serve(m, out)
        return out

    def cancel(self, req_id: RequestId) -> bool:
        """A queued request was abandoned by its client; True if it was still queued."""
        for queue in self._queues.values():
            for i, item in enumerate(queue):
                if item.req.id == req_id:
                    del queue[i]
                    return True
        return False

    def tick(self) -> list[Decision]:
        """Expire requests that waited too long, then serve every queue."""
        now = self._clock.now()
        out: list[Decision] = []
        max_wait = self._limits.max_wait_s
        for model, queue in self._queues.items():
            keep: list[_Queued] = []
            for item in queue:
                if now - item.req.arrival > max_wait:
                    out.append(
                        Reject(
                            item.req,
                            errors.queue_timeout(model, now - item.req.arrival, self._limits.retry_after_s),
                        )
                    )
                elif not self._any_ready(model):
                    out.append(Reject(item.req, errors.no_ready_endpoint(model, self._limits.retry_after_s)))
                else:
                    keep.append(item)
            queue[:] = keep
        out.extend(self._serve_all())
        return out

    # ----------------------------------------------------------------- views
    def snapshot(self) -> FleetSnapshot:
        now = self._clock.now()
        stale = self._limits.stale_after_s
        return FleetSnapshot(
            now=now,
            endpoints=tuple(ep.view(now, stale) for ep in self._endpoints.values()),
            queued={m: len(q) for m, q in self._queues.items() if q},
        )

    def queue_depth(self, model: ModelName) -> int:
        return len(self._queues.get(model, ()))

    def queue_depths(self) -> dict[ModelName, int]:
        return {m: len(q) for m, q in self._queues.items()}

    def running_on(self, req_id: RequestId) -> EndpointId | None:
        return self._running.get(req_id)

    def models(self, *, ready_only: bool) -> set[ModelName]:
        out: set[ModelName] = set()
        for ep in self._endpoints.values():
            if not ready_only or ep.health is EndpointHealth.READY:
                out |= ep.models
        return out

    def endpoint_ids(self) -> list[EndpointId]:
        return list(self._endpoints)

    # ----------------------------------------------------------------- internals
    def _any_ready(self, model: ModelName) -> bool:
        return any(
            ep.health is EndpointHealth.READY and model in ep.models for ep in self._endpoints.values()
        )

    def _serve_all(self) -> list[Decision]:
        out: list[Decision] = []
        for model in list(self._queues):
            self._serve(model, out)
        return out

    def _serve(self, model: ModelName, out: list[Decision], *, only: RequestId | None = None) -> None:
        """Place queued requests of `model` in order; with `only`, stop at the first one that is not it."""
        queue = self._queues.get(model)
        policy = self._policy
        while queue:
            snap = self.snapshot()
            if len(queue) == 1:
                idx = 0
            else:
                keyed = ((policy.ordering.key(q.req, snap), q.seq, i) for i, q in enumerate(queue))
                idx = min(keyed)[2]
            item = queue[idx]
            if only is not None and item.req.id != only:
                return
            view_snap = snap
            if item.exclude:
                others = tuple(e for e in snap.endpoints if e.id not in item.exclude)
                # Avoid endpoints that already failed this request unless nothing else serves it.
                if any(model in e.models and e.health is EndpointHealth.READY for e in others):
                    view_snap = FleetSnapshot(now=snap.now, endpoints=others, queued=snap.queued)
            chosen = policy.profile.place(item.req, view_snap)
            if chosen is None:
                return
            del queue[idx]
            ep = self._endpoints[chosen.id]
            ep.inflight += 1
            ep.dispatched_since_scrape += 1
            self._running[item.req.id] = chosen.id
            out.append(Dispatch(item.req, chosen))
