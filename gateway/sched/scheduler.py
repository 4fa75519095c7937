"""The scheduler: a sans-IO state machine over the fleet (`gateway.sched.fleet`) and the per-model queues
(`gateway.sched.queues`).

Events in (`submit`, `complete`, `cancel`, `tick`, endpoint updates), decisions out
(`gateway.sched.decisions`). The live daemon turns decisions into awaited futures; the offline simulator
and the tests call the same methods with a fake clock.

Queue discipline: requests wait in one queue per model. Whenever capacity may have appeared (a request
completed, an endpoint changed, a tick) the queue is served: the request with the smallest ordering key
is placed through the policy's profile; when the profile finds nothing eligible for it, serving that
model stops (strict priority: a lower-priority request never overtakes one that is waiting for room),
unless the policy's `lookahead` lets up to that many requests behind it be placed first while endpoints
still have room (its placement constraints, not the seats, hold it back: Aladdin places each request on
the first worker that fits it, and one that fits nowhere waits without holding up the others).

A policy plugin that raises (ordering, admission, placement, engine priority) fails only the request it
was deciding on: that request is rejected with a 500 (`internal_error`) and the queue goes on being
served; the exception is kept in `faults` for the daemon to log (the core does no I/O). Otherwise one
plugin bug would fail whichever request's completion happened to serve the queue, and leave the queue
unserved.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, ModelName, RequestId
from gateway.sched.admission import AdmissionLedger
from gateway.sched.decisions import (
    Decision,
    Dispatch,
    FaultStage,
    PolicyFault,
    Preempt,
    Reject,
    fault_error,
)
from gateway.sched.fleet import Fleet
from gateway.sched.profile import Policy
from gateway.sched.queues import OrderingFault, Queued, Queues, first
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits

#: Faults kept for the daemon to collect (the oldest are dropped beyond this).
MAX_FAULTS: Final = 64


def _has_room(snap: FleetSnapshot, model: ModelName) -> bool:
    return any(model in e.models and e.health is EndpointHealth.READY and e.has_room for e in snap.endpoints)


class Scheduler:
    def __init__(self, policy: Policy, clock: Clock, limits: QueueLimits | None = None) -> None:
        self._policy = policy
        self._clock = clock
        self._limits = limits or QueueLimits()
        self._fleet = Fleet()
        self._queues = Queues()
        # Engine priority of requests dispatched to priority-scheduling endpoints (see engine_priority).
        self._priorities: dict[RequestId, int] = {}
        self.admission = AdmissionLedger()
        self.faults: list[PolicyFault] = []  # the daemon takes and logs them (take_faults)
        self.preemptions: list[Preempt] = []  # made during a submit (take_preemptions)

    def _fault(self, req: SchedRequest, stage: FaultStage, error: Exception) -> None:
        self.faults.append(PolicyFault(req.id, stage, error))
        if len(self.faults) > MAX_FAULTS:
            del self.faults[0]

    def take_faults(self) -> list[PolicyFault]:
        """The policy faults since the last call (oldest first)."""
        out, self.faults = self.faults, []
        return out

    def take_preemptions(self) -> list[Preempt]:
        """The preemptions made during the last submit (which reports its own request's decision only)."""
        out, self.preemptions = self.preemptions, []
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
        self._fleet.restale()  # the staleness cut-off may have moved
        return self._serve_all()

    def sync_endpoints(self, specs: Sequence[EndpointSpec]) -> list[Decision]:
        """Make the endpoint set equal to `specs`, keeping runtime state of endpoints that stay.

        A removed endpoint takes no new requests; requests running there finish normally.
        """
        self._fleet.sync(specs)
        return self._serve_all()

    # ----------------------------------------------------------------- endpoint events
    def set_health(self, eid: EndpointId, health: EndpointHealth) -> list[Decision]:
        if not self._fleet.set_health(eid, health):
            return []
        return self._serve_all() if health is EndpointHealth.READY else []

    def set_models(self, eid: EndpointId, models: Iterable[str]) -> list[Decision]:
        """Models an endpoint reported at /v1/models; ignored when its models are configured."""
        if not self._fleet.set_models(eid, models):
            return []
        return self._serve_all()

    def observe_gauges(self, eid: EndpointId, gauges: EngineGauges) -> list[Decision]:
        self._fleet.observe_gauges(eid, gauges, self._clock.now())
        return []

    def set_estimates(self, eid: EndpointId, estimates: EndpointEstimates | None) -> list[Decision]:
        """What telemetry measured and fitted for the endpoint; plugins see it in the endpoint's view.
        Serves nothing by itself (the next completion or tick does)."""
        self._fleet.set_estimates(eid, estimates)
        return []

    # ----------------------------------------------------------------- request events
    def submit(self, req: SchedRequest, *, exclude: frozenset[EndpointId] = frozenset()) -> Decision | None:
        """A new request (or a retry that must avoid `exclude`). None: it waits in the queue."""
        if req.model not in self._fleet.ready_models():
            return Reject(req, errors.no_ready_endpoint(req.model, self._limits.retry_after_s))
        queue = self._queues.of(req.model)
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
                return Reject(req, fault_error())
            if refused is not None:
                return Reject(req, refused)
        self._queues.push(queue, req, exclude)
        # submit can report one decision only, so it may place `req` and nothing else: a queued request
        # that became placeable without an event that serves (a cancel, time passing) waits for the next
        # complete/tick instead of being dispatched here and never reported.
        out: list[Decision] = []
        self._serve(req.model, out, only=req.id)
        return out[0] if out else None

    def complete(self, req_id: RequestId) -> list[Decision]:
        """A dispatched request finished (any outcome); its slot is free again."""
        self._priorities.pop(req_id, None)
        out: list[Decision] = []
        for m in self._fleet.complete(req_id):
            self._serve(m, out)
        return out

    def cancel(self, req_id: RequestId) -> bool:
        """A queued request was abandoned by its client; True if it was still queued."""
        return self._queues.cancel(req_id)

    def tick(self) -> list[Decision]:
        """Expire requests that waited too long, let admission look at the queued ones again (a request
        whose SLO became infeasible while it waited), then serve every queue."""
        now = self._clock.now()
        out: list[Decision] = []
        max_wait = self._limits.max_wait_s
        ready = self._fleet.ready_models()
        recheck = self._policy.admitter is not None and self._queues.any_waiting()
        snap = self.snapshot() if recheck else None
        for model, queue in self._queues.items():
            keep: list[Queued] = []
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
                        refused = fault_error()
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
        views = self._fleet.views(now, self._limits.stale_after_s)
        return FleetSnapshot(now=now, endpoints=views, queued=self._queues.waiting())

    def queue_depth(self, model: ModelName) -> int:
        return self._queues.depth(model)

    def queue_depths(self) -> dict[ModelName, int]:
        return self._queues.depths()

    def progress(self, req_id: RequestId, produced: int, first_token_at: float | None) -> None:
        """A dispatched request has streamed `produced` tokens (its first at `first_token_at`): placement
        plugins see it in the endpoint's running requests. Serves nothing by itself."""
        self._fleet.progress(req_id, produced, first_token_at, self._clock.now())

    def engine_priority(self, req_id: RequestId) -> int | None:
        """The priority to send with a dispatched request (lower is more urgent): set only when its
        endpoint runs priority scheduling and the policy's ordering has one."""
        return self._priorities.get(req_id)

    def running_on(self, req_id: RequestId) -> EndpointId | None:
        return self._fleet.running_on(req_id)

    def inflight_on(self, eid: EndpointId) -> int:
        """Requests the gateway runs on `eid` now (0 for an unknown endpoint)."""
        return self._fleet.inflight_on(eid)

    def endpoint_view(self, eid: EndpointId) -> EndpointView | None:
        return self._fleet.view(eid, self._clock.now(), self._limits.stale_after_s)

    def queued_by_class(self) -> dict[ModelName, dict[str, int]]:
        """Queued requests per model and SLO class (for the admin API; walks every queue)."""
        return self._queues.by_class()

    def models(self, *, ready_only: bool) -> frozenset[ModelName]:
        """Models served by any endpoint (in any state), or only by ready ones."""
        return self._fleet.models(ready_only=ready_only)

    def endpoint_ids(self) -> list[EndpointId]:
        return self._fleet.ids()

    # ----------------------------------------------------------------- serving the queues
    def _serve_all(self) -> list[Decision]:
        out: list[Decision] = []
        for model in self._queues.models():
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
                    found = first(policy.ordering, queue, snap, skipped)
                except OrderingFault as f:
                    bad = queue[f.index]
                    self._fault(bad.req, "ordering", f.error)
                    if only is not None and bad.req.id != only:
                        return  # submit reports on its own request only: the next serve rejects it
                    del queue[f.index]
                    out.append(Reject(bad.req, fault_error()))
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
                out.append(Reject(item.req, fault_error()))
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
            req = item.req
            self._fleet.dispatch(chosen.id, req, snap.now)
            if chosen.priority_scheduling:
                try:
                    prio = policy.engine_priority(req, snap)
                except Exception as e:
                    self._fault(req, "engine_priority", e)
                    prio = None  # the request still runs, without a priority
                if prio is not None:
                    self._priorities[req.id] = prio
            out.append(Dispatch(req, chosen))
