"""The scheduler: a sans-IO state machine over the fleet and the per-model queues.

Events in (`submit`, `complete`, `cancel`, `tick`, endpoint updates), decisions out (`Dispatch`,
`Reject`). The live daemon turns decisions into awaited futures; the offline simulator and the tests
call the same methods with a fake clock.

Queue discipline: requests wait in one queue per model. Whenever capacity may have appeared (a request
completed, an endpoint changed, a tick) the queue is served: the request with the smallest ordering key
is placed through the policy's profile; when the profile finds nothing eligible for it, serving that
model stops (strict priority: a lower-priority request never overtakes one that is waiting for room),
unless the policy's `lookahead` lets up to that many requests behind it be placed first while endpoints
still have room (its placement constraints, not the seats, hold it back: Aladdin places each request on
the first worker that fits it, and one that fits nowhere waits without holding up the others).

Every placement decides on a fresh FleetSnapshot, but an endpoint's view is rebuilt only when that
endpoint changed (or its engine gauges went stale): a placement on a large fleet does not remake the
views of the endpoints it did not touch. The model sets are likewise kept until an endpoint changes.

A policy plugin that raises (ordering, admission, placement, engine priority) fails only the request it
was deciding on: that request is rejected with a 500 (`internal_error`) and the queue goes on being
served; the exception is kept in `faults` for the daemon to log (the core does no I/O). Without this, one
plugin bug would fail whichever request's completion happened to serve the queue, and leave the queue
unserved.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

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
from gateway.sched.admission import AdmissionLedger
from gateway.sched.interfaces import OrderKey
from gateway.sched.profile import Policy
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest, running_from
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot


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
    priority_scheduling: bool = False  # the engine orders by a request's priority (see EndpointView)


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


@dataclass(frozen=True, slots=True)
class PolicyFault:
    """A policy plugin raised while deciding on a request (see the module doc)."""

    req_id: RequestId
    stage: str  # "admission", "ordering", "placement", "engine_priority"
    error: Exception


#: Faults kept for the daemon to collect (the oldest are dropped beyond this).
MAX_FAULTS: Final = 64


def _fault_error() -> BerthError:
    return errors.internal("the gateway's scheduling policy failed on this request")


class _Views:
    """The tuple of every endpoint's view, kept until an endpoint changes or one's gauges go stale."""

    __slots__ = ("endpoints", "fresh_until")

    def __init__(self) -> None:
        self.endpoints: tuple[EndpointView, ...] | None = None
        self.fresh_until = math.inf  # clock time when the first kept view's gauges go stale


# Rebuild the views this long before a gauge's exact staleness time: the exact test is `now - scraped_at
# > stale_after_s`, and `scraped_at + stale_after_s` may round differently.
_STALE_MARGIN_S: Final = 1e-6


class _Endpoint:
    """The runtime state of one endpoint. Whoever changes a field calls `changed()` (the view is kept)."""

    __slots__ = (
        "_fleet",
        "_view",
        "_view_has_gauges",
        "completed_since_scrape",
        "dispatched_since_scrape",
        "estimates",
        "fresh_until",
        "gauges",
        "health",
        "inflight",
        "models",
        "running",
        "running_output_tokens",
        "running_prompt_tokens",
        "scraped_at",
        "spec",
    )

    def __init__(self, spec: EndpointSpec, fleet: _Views) -> None:
        self._fleet = fleet
        self.spec = spec
        self.models: frozenset[ModelName] = spec.models
        self.health = EndpointHealth.STARTING
        self.inflight = 0
        self.gauges: EngineGauges | None = None
        self.scraped_at: float | None = None
        self.dispatched_since_scrape = 0
        self.completed_since_scrape = 0
        self.running_prompt_tokens = 0
        self.running_output_tokens = 0.0
        self.estimates: EndpointEstimates | None = None
        self.running: dict[RequestId, RunningRequest] = {}  # what the gateway runs here, by dispatch
        self._view: EndpointView | None = None
        self._view_has_gauges = False
        self.fresh_until = math.inf  # when the kept view's gauges go stale (inf: it shows none)

    def changed(self) -> None:
        self._view = None
        self._fleet.endpoints = None

    def view(self, now: float, stale_after_s: float) -> EndpointView:
        """The view as of `now`: the kept one unless the endpoint changed or its gauges went stale."""
        v = self._view
        if v is not None and not (self._view_has_gauges and self._stale(now, stale_after_s)):
            return v
        g = None if self._stale(now, stale_after_s) else self.gauges
        s = self.spec
        v = self._view = EndpointView(
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
            scraped_at=self.scraped_at,
            node=s.node,
            completed_since_scrape=self.completed_since_scrape,
            running_prompt_tokens=self.running_prompt_tokens,
            running_output_tokens=self.running_output_tokens,
            estimates=self.estimates,
            running=tuple(self.running.values()),
            priority_scheduling=s.priority_scheduling,
        )
        self._view_has_gauges = g is not None
        self.fresh_until = (
            math.inf if self.scraped_at is None or g is None else self.scraped_at + stale_after_s
        )
        return v

    def _stale(self, now: float, stale_after_s: float) -> bool:
        return self.scraped_at is None or now - self.scraped_at > stale_after_s


@dataclass(slots=True)
class _Queued:
    req: SchedRequest
    seq: int
    exclude: frozenset[EndpointId] = field(default_factory=frozenset)


class _Faulty(Exception):
    """The ordering plugin raised on the queued request at `index`."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


def _first(policy: Policy, queue: Sequence[_Queued], snap: FleetSnapshot, skipped: set[int]) -> int | None:
    """The index of the queued request to place next: the smallest ordering key (ties: arrival order),
    leaving out `skipped`; None when every one is skipped. Raises _Faulty when a key cannot be made."""
    key = policy.ordering.key
    best: tuple[OrderKey, int, int] | None = None
    for i, q in enumerate(queue):
        if q.seq in skipped:
            continue
        try:
            k = key(q.req, snap)
        except Exception as e:
            raise _Faulty(i, e) from None
        if best is None or (k, q.seq) < (best[0], best[1]):
            best = (k, q.seq, i)
    return None if best is None else best[2]


def _has_room(snap: FleetSnapshot, model: ModelName) -> bool:
    return any(model in e.models and e.health is EndpointHealth.READY and e.has_room for e in snap.endpoints)


_NO_MODELS: Final[frozenset[ModelName]] = frozenset()
_INF: Final = math.inf


class Scheduler:
    def __init__(self, policy: Policy, clock: Clock, limits: QueueLimits | None = None) -> None:
        self._policy = policy
        self._clock = clock
        self._limits = limits or QueueLimits()
        self._endpoints: dict[EndpointId, _Endpoint] = {}
        self._views = _Views()
        self._queues: dict[ModelName, list[_Queued]] = {}
        self._running: dict[RequestId, EndpointId] = {}
        # Prompt and predicted output tokens of each running request (the endpoints' running-context sums).
        self._context: dict[RequestId, tuple[int, float]] = {}
        # Engine priority of requests dispatched to priority-scheduling endpoints (see engine_priority).
        self._priorities: dict[RequestId, int] = {}
        self.admission = AdmissionLedger()
        self._seq = itertools.count()
        # (all models, models of ready endpoints); None after a change of endpoints, health or models.
        self._model_sets: tuple[frozenset[ModelName], frozenset[ModelName]] | None = None
        self.faults: list[PolicyFault] = []  # the daemon takes and logs them (take_faults)

    def _fault(self, req: SchedRequest, stage: str, error: Exception) -> None:
        self.faults.append(PolicyFault(req.id, stage, error))
        if len(self.faults) > MAX_FAULTS:
            del self.faults[0]

    def take_faults(self) -> list[PolicyFault]:
        """The policy faults since the last call (oldest first)."""
        out, self.faults = self.faults, []
        return out

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
        for ep in self._endpoints.values():
            ep.changed()  # the staleness cut-off may have moved
        return self._serve_all()

    def sync_endpoints(self, specs: Sequence[EndpointSpec]) -> list[Decision]:
        """Make the endpoint set equal to `specs`, keeping runtime state of endpoints that stay.

        A removed endpoint takes no new requests; requests running there finish normally.
        """
        wanted = {s.id: s for s in specs}
        self._model_sets = None
        self._views.endpoints = None
        for eid in list(self._endpoints):
            if eid not in wanted:
                del self._endpoints[eid]
        # Forget what ran on removed endpoints: their complete() is then a no-op, and cannot decrement
        # an endpoint added again later under the same id.
        self._running = {r: e for r, e in self._running.items() if e in wanted}
        for eid, spec in wanted.items():
            ep = self._endpoints.get(eid)
            if ep is None:
                self._endpoints[eid] = _Endpoint(spec, self._views)
            elif ep.spec != spec:
                discovered = ep.models if not spec.models else spec.models
                if ep.spec.url != spec.url:  # a different server: start over
                    fresh = _Endpoint(spec, self._views)
                    fresh.inflight = ep.inflight
                    fresh.running_prompt_tokens = ep.running_prompt_tokens
                    fresh.running_output_tokens = ep.running_output_tokens
                    fresh.running = ep.running
                    self._endpoints[eid] = fresh
                else:
                    ep.spec = spec
                    ep.models = discovered
                    ep.changed()
        return self._serve_all()

    # ----------------------------------------------------------------- endpoint events
    def set_health(self, eid: EndpointId, health: EndpointHealth) -> list[Decision]:
        ep = self._endpoints.get(eid)
        if ep is None or ep.health is health:
            return []
        ep.health = health
        ep.changed()
        self._model_sets = None
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
        ep.changed()
        self._model_sets = None
        return self._serve_all()

    def observe_gauges(self, eid: EndpointId, gauges: EngineGauges) -> list[Decision]:
        ep = self._endpoints.get(eid)
        if ep is None:
            return []
        ep.gauges = gauges
        ep.scraped_at = self._clock.now()
        ep.dispatched_since_scrape = 0
        ep.completed_since_scrape = 0
        ep.changed()
        return []

    def set_estimates(self, eid: EndpointId, estimates: EndpointEstimates | None) -> list[Decision]:
        """What telemetry measured and fitted for the endpoint; plugins see it in the endpoint's view.
        Serves nothing by itself (the next completion or tick does)."""
        ep = self._endpoints.get(eid)
        if ep is None or ep.estimates == estimates:
            return []
        ep.estimates = estimates
        ep.changed()
        return []

    # ----------------------------------------------------------------- request events
    def submit(self, req: SchedRequest, *, exclude: frozenset[EndpointId] = frozenset()) -> Decision | None:
        """A new request (or a retry that must avoid `exclude`). None: it waits in the queue."""
        if req.model not in self._ready_models():
            return Reject(req, errors.no_ready_endpoint(req.model, self._limits.retry_after_s))
        queue = self._queues.setdefault(req.model, [])
        if len(queue) >= self._limits.max_queue_per_model:
            return Reject(req, errors.queue_full(req.model, self._limits.retry_after_s))
        if not exclude:  # a retry was admitted already
            try:
                req, refused = self.admission.admit(
                    self._policy,
                    req,
                    self.snapshot(),
                    lambda cls: sum(1 for q in queue if q.req.slo.slo_class == cls),
                )
            except Exception as e:
                self._fault(req, "admission", e)
                return Reject(req, _fault_error())
            if refused is not None:
                return Reject(req, refused)
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
        context = self._context.pop(req_id, None)
        self._priorities.pop(req_id, None)
        if eid is None:
            return []
        ep = self._endpoints.get(eid)
        if ep is None:
            return []
        ep.running.pop(req_id, None)
        ep.inflight -= 1
        ep.completed_since_scrape += 1
        if context is not None:
            ep.running_prompt_tokens -= context[0]
            ep.running_output_tokens -= context[1]
        if ep.inflight == 0:
            ep.running_output_tokens = 0.0  # no float drift left behind
        ep.changed()
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
        """Expire requests that waited too long, let admission look at the queued ones again (a request
        whose SLO became infeasible while it waited), then serve every queue."""
        now = self._clock.now()
        out: list[Decision] = []
        max_wait = self._limits.max_wait_s
        ready = self._ready_models()
        recheck = self._policy.admitter is not None and any(self._queues.values())
        snap = self.snapshot() if recheck else None
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
                elif model not in ready:
                    out.append(Reject(item.req, errors.no_ready_endpoint(model, self._limits.retry_after_s)))
                elif snap is not None:
                    try:
                        item.req, refused = self.admission.recheck(self._policy, item.req, snap)
                    except Exception as e:
                        self._fault(item.req, "admission", e)
                        refused = _fault_error()
                    if refused is not None:
                        out.append(Reject(item.req, refused))
                    else:
                        keep.append(item)
                else:
                    keep.append(item)
            queue[:] = keep
        out.extend(self._serve_all())
        return out

    # ----------------------------------------------------------------- views
    def snapshot(self) -> FleetSnapshot:
        now = self._clock.now()
        kept = self._views
        views = kept.endpoints
        if views is None or now >= kept.fresh_until - _STALE_MARGIN_S:
            stale = self._limits.stale_after_s
            eps = self._endpoints.values()
            views = kept.endpoints = tuple(ep.view(now, stale) for ep in eps)
            kept.fresh_until = min((ep.fresh_until for ep in eps), default=_INF)
        return FleetSnapshot(
            now=now, endpoints=views, queued={m: len(q) for m, q in self._queues.items() if q}
        )

    def queue_depth(self, model: ModelName) -> int:
        return len(self._queues.get(model, ()))

    def queue_depths(self) -> dict[ModelName, int]:
        return {m: len(q) for m, q in self._queues.items()}

    def progress(self, req_id: RequestId, produced: int, first_token_at: float | None) -> None:
        """A dispatched request has streamed `produced` tokens (its first at `first_token_at`): placement
        plugins see it in the endpoint's running requests. Serves nothing by itself."""
        eid = self._running.get(req_id)
        ep = None if eid is None else self._endpoints.get(eid)
        if ep is None:
            return
        r = ep.running.get(req_id)
        if r is None:
            return
        ep.running[req_id] = dataclasses.replace(
            r, produced=produced, first_token_at=first_token_at, reported_at=self._clock.now()
        )
        ep.changed()

    def engine_priority(self, req_id: RequestId) -> int | None:
        """The priority to send with a dispatched request (lower is more urgent): set only when its
        endpoint runs priority scheduling and the policy's ordering has one."""
        return self._priorities.get(req_id)

    def running_on(self, req_id: RequestId) -> EndpointId | None:
        return self._running.get(req_id)

    def inflight_on(self, eid: EndpointId) -> int:
        """Requests the gateway runs on `eid` now (0 for an unknown endpoint)."""
        ep = self._endpoints.get(eid)
        return 0 if ep is None else ep.inflight

    def endpoint_view(self, eid: EndpointId) -> EndpointView | None:
        ep = self._endpoints.get(eid)
        return None if ep is None else ep.view(self._clock.now(), self._limits.stale_after_s)

    def queued_by_class(self) -> dict[ModelName, dict[str, int]]:
        """Queued requests per model and SLO class (for the admin API; walks every queue)."""
        out: dict[ModelName, dict[str, int]] = {}
        for model, queue in self._queues.items():
            if queue:
                counts = out[model] = {}
                for item in queue:
                    cls = item.req.slo.slo_class
                    counts[cls] = counts.get(cls, 0) + 1
        return out

    def models(self, *, ready_only: bool) -> frozenset[ModelName]:
        """Models served by any endpoint (in any state), or only by ready ones."""
        sets = self._model_sets or self._remake_model_sets()
        return sets[1] if ready_only else sets[0]

    def endpoint_ids(self) -> list[EndpointId]:
        return list(self._endpoints)

    # ----------------------------------------------------------------- internals
    def _ready_models(self) -> frozenset[ModelName]:
        return (self._model_sets or self._remake_model_sets())[1]

    def _remake_model_sets(self) -> tuple[frozenset[ModelName], frozenset[ModelName]]:
        eps = self._endpoints.values()
        every = _NO_MODELS.union(*(ep.models for ep in eps))
        ready = _NO_MODELS.union(*(ep.models for ep in eps if ep.health is EndpointHealth.READY))
        self._model_sets = (every, ready)
        return self._model_sets

    def _serve_all(self) -> list[Decision]:
        out: list[Decision] = []
        for model in list(self._queues):
            self._serve(model, out)
        return out

    def _serve(self, model: ModelName, out: list[Decision], *, only: RequestId | None = None) -> None:
        """Place queued requests of `model` in order; with `only`, stop at the first one that is not it."""
        queue = self._queues.get(model)
        policy = self._policy
        skipped: set[int] = set()  # requests that fit nowhere now, passed over (policy.lookahead)
        while queue:
            snap = self.snapshot()
            if len(queue) == 1 and not skipped:
                idx = 0
            else:
                try:
                    found = _first(policy, queue, snap, skipped)
                except _Faulty as f:
                    bad = queue[f.index]
                    self._fault(bad.req, "ordering", f.error)
                    if only is not None and bad.req.id != only:
                        return  # submit reports on its own request only: the next serve rejects it
                    del queue[f.index]
                    out.append(Reject(bad.req, _fault_error()))
                    if only is not None:
                        return
                    continue
                if found is None:
                    return
                idx = found
            item = queue[idx]
            if only is not None and item.req.id != only:
                return
            view_snap = snap
            if item.exclude:
                others = tuple(e for e in snap.endpoints if e.id not in item.exclude)
                # Avoid endpoints that already failed this request unless nothing else serves it.
                if any(model in e.models and e.health is EndpointHealth.READY for e in others):
                    view_snap = FleetSnapshot(now=snap.now, endpoints=others, queued=snap.queued)
            try:
                chosen = policy.profile.place(item.req, view_snap)
            except Exception as e:
                self._fault(item.req, "placement", e)
                del queue[idx]
                out.append(Reject(item.req, _fault_error()))
                if only is not None:
                    return
                continue
            if chosen is None:
                # Strict priority, unless the policy lets requests behind one that fits nowhere go first
                # while endpoints still have room (its constraints, not the seats, hold it back).
                if len(skipped) >= policy.lookahead or not _has_room(view_snap, model):
                    return
                skipped.add(item.seq)
                continue
            del queue[idx]
            ep = self._endpoints[chosen.id]
            ep.inflight += 1
            ep.dispatched_since_scrape += 1
            req = item.req
            predicted = req.predicted_output_tokens or 0.0
            ep.running_prompt_tokens += req.prompt_tokens
            ep.running_output_tokens += predicted
            self._context[req.id] = (req.prompt_tokens, predicted)
            ep.running[req.id] = running_from(req, snap.now)
            if chosen.priority_scheduling:
                try:
                    prio = policy.engine_priority(req, snap)
                except Exception as e:
                    self._fault(req, "engine_priority", e)
                    prio = None  # the request still runs, without a priority
                if prio is not None:
                    self._priorities[req.id] = prio
            ep.changed()
            self._running[item.req.id] = chosen.id
            out.append(Dispatch(item.req, chosen))
