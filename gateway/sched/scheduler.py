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

Preemption (the policy's `Preemptor`; none by default): when the request at the head of a queue can be
placed nowhere, its kind may preempt (interactive) and an endpoint of an allowed class (mixed) runs
resumable work of a kind that may be preempted (batch), the preemptor ranks the eligible victims and the
first ones that make room for the request on one endpoint (the placement pipeline accepts it there once
they are gone; one, or up to the rules' `max_victims`) give up their seats: each victim's seat is freed
(not a completion), the victim is queued again with its arrival time, band and place in arrival order,
and the request is dispatched to that endpoint. The decisions are a `Preempt` per victim followed by
the `Dispatch`; `submit` reports only its own request's decision, so the preemptions
it made wait in an outbox (`take_preemptions`). A victim is eligible only when it is resumable, under the
policy's preemption limit, and its own SLO stays feasible after a resume (`_resume_feasible`).

Concurrency caps: each endpoint's cap in force starts at its configured cap (the operator's maximum);
a policy's `ConcurrencyController` moves it when the endpoint's running set changes (a dispatch, a
completion, a preemption), clamped into [its floor, the configured cap] (`cap_of`).

A policy plugin that raises (ordering, admission, placement, engine priority) fails only the request it
was deciding on: that request is rejected with a 500 (`internal_error`) and the queue goes on being
served; the exception is kept in `faults` for the daemon to log (the core does no I/O). Otherwise one
plugin bug would fail whichever request's completion happened to serve the queue, and leave the queue
unserved.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, ModelName, RequestId
from gateway.sched import ticks
from gateway.sched.admission import AdmissionLedger
from gateway.sched.decisions import Decision, Dispatch, FaultStage, PolicyFault, Preempt, Reject, fault_error
from gateway.sched.fleet import Fleet
from gateway.sched.interfaces import PreemptionRules, Preemptor, Victim
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.profile import Policy
from gateway.sched.queues import ModelQueue, OrderingFault, Queued, Queues
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot
from gateway.sched.types import EndpointSpec, PeerLoad, QueueLimits

#: Faults kept for the daemon to collect (the oldest are dropped beyond this).
MAX_FAULTS: Final = 64
#: Endpoints whose victims' seats a preempting request is tried on (by the preemptor's order), per placement.
MAX_PREEMPT_TRIES: Final = 4
#: Why a request was preempted (the `Preempt.reason` of the one trigger there is).
REASON_WAITING: Final = "interactive_waiting"
#: ... and when an endpoint's cap was cut below its running set for the interactive streams it runs.
REASON_CAP: Final = "cap_lowered"
_PREDICT: Final = PredictParams()
#: Fleets of at least this many endpoints are placed over columns when the profile can be (numpy's
#: fixed cost per call is more than a Python step per endpoint below it: `overhead_micro` fleet_N).
COLUMNS_FROM: Final = 128


def _has_room(snap: FleetSnapshot, model: ModelName) -> bool:
    return any(model in e.models and e.health is EndpointHealth.READY and e.has_room for e in snap.endpoints)


_UNBOUNDED: Final = 1 << 30


def _without(view: EndpointView, victim: RunningRequest) -> EndpointView:
    """`view` with `victim` gone from its running requests (its seat free)."""
    return dataclasses.replace(
        view,
        inflight=view.inflight - 1,
        running=tuple(r for r in view.running if r.id != victim.id),
        running_prompt_tokens=view.running_prompt_tokens - victim.prompt_tokens,
        running_output_tokens=max(0.0, view.running_output_tokens - victim.output_mean),
    )


def _resume_feasible(r: RunningRequest, load: EndpointLoad, rules: PreemptionRules) -> bool:
    """Whether a running request keeps its own SLO when preempted now and resumed after the rules'
    requeue wait, at its endpoint's current pace: its first token (when not out yet), its last token by
    its deadline, and its average inter-token time from its first token within its target (the tokens of
    earlier, preempted runs counted at the target pace: the scheduler keeps no earlier first token)."""
    state = next((s for s in load.running if s.req is r), None)
    if state is None:
        return False
    now = load.now
    margin = rules.margin
    restart = now + rules.requeue_wait_s + load.coef.prefill_s(r.prompt_tokens + state.produced)
    if (
        not state.prefilled
        and r.ttft_deadline is not None
        and restart > now + (r.ttft_deadline - now) * margin
    ):
        return False
    end = restart + state.remaining * load.tpot_now
    if r.e2e_deadline is not None and end - now > (r.e2e_deadline - now) * margin:
        return False
    if r.itl_s is not None:
        produced = r.produced_before + state.produced
        tokens = produced + state.remaining
        if r.produced_before:
            start = r.dispatched_at if r.first_token_at is None else r.first_token_at  # see the docstring
            start = min(start, now) - r.produced_before * r.itl_s
        elif state.prefilled:
            start = r.first_token_at if r.first_token_at is not None else now + state.first_s
        else:
            start = restart
        if tokens > 1 and (end - start) / (tokens - 1) > r.itl_s * margin:
            return False
    return True


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
        # Models the lifecycle can load on demand, and how long a request may wait for such a load.
        self._loadable: frozenset[ModelName] = frozenset()
        self._load_deadline_s = 0.0
        # `known_models` as last made, with the two sets it was made from.
        self._known: tuple[frozenset[ModelName], frozenset[ModelName], frozenset[ModelName]] = (
            frozenset(),
            frozenset(),
            frozenset(),
        )
        self.cold: list[ModelName] = []  # loadable models requested with no ready endpoint (take_cold)
        # Preemptions made during a submit (take_preemptions; a driver may look at it first, as at `faults`
        # and `cold`, to skip the call when it is empty).
        self.outbox: list[Preempt] = []
        # Place in arrival order of each running request (a preempted one keeps it when requeued).
        self._seqs: dict[RequestId, int] = {}

    def _fault(self, req: SchedRequest, stage: FaultStage, error: Exception) -> None:
        self._fault_id(req.id, stage, error)

    def _fault_id(self, req_id: RequestId, stage: FaultStage, error: Exception) -> None:
        self.faults.append(PolicyFault(req_id, stage, error))
        if len(self.faults) > MAX_FAULTS:
            del self.faults[0]

    def take_faults(self) -> list[PolicyFault]:
        """The policy faults since the last call (oldest first)."""
        out, self.faults = self.faults, []
        return out

    def take_cold(self) -> list[ModelName]:
        """The loadable models requested with no ready endpoint since the last call (each once)."""
        out, self.cold = self.cold, []
        return out

    def take_preemptions(self) -> list[Preempt]:
        """The preemptions made during `submit` calls since the last call (drivers drain it right after
        each submit; every other method returns its preemptions in its decision list)."""
        out, self.outbox = self.outbox, []
        return out

    # ----------------------------------------------------------------- configuration
    def set_loadable(self, models: Iterable[ModelName], load_deadline_s: float) -> None:
        """Models a lifecycle manager loads on demand: their requests wait for a load instead of being
        rejected with no_ready_endpoint, for up to max(max_wait_s, `load_deadline_s`)."""
        self._loadable = frozenset(models)
        self._load_deadline_s = load_deadline_s

    @property
    def loadable(self) -> frozenset[ModelName]:
        return self._loadable

    def known_models(self) -> frozenset[ModelName]:
        """The models a request may name: served by an endpoint (in any state) or loadable on demand.
        Kept until either set changes (admission asks on every request)."""
        served, loadable, known = self._known
        every = self._fleet.models(ready_only=False)
        if every is not served or self._loadable is not loadable:
            known = every | self._loadable
            self._known = (every, self._loadable, known)
        return known

    def fail_model(self, model: ModelName, error: errors.BerthError) -> list[Decision]:
        """Reject every queued request of `model` with `error` (its load failed)."""
        queue = self._queues.get(model)
        if not queue:
            return []
        out: list[Decision] = [Reject(item.req, error) for item in queue]
        queue.clear()
        return out

    def lookahead(self, n: int) -> tuple[ModelName, ...]:
        """The models of the first `n` queued requests, in arrival order (every queue)."""
        items = sorted((q.seq, m) for m, queue in self._queues.items() for q in queue)
        return tuple(m for _, m in items[:n])

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def limits(self) -> QueueLimits:
        return self._limits

    def set_policy(self, policy: Policy) -> list[Decision]:
        """Swap the policy in one step; queued requests are re-served under the new one."""
        self._policy = policy
        self._adjust_all()
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
        self._adjust_all()
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

    def own_loads(self) -> dict[EndpointId, PeerLoad]:
        """This gateway's own load per endpoint (in flight, prompt and predicted output tokens), without
        the other replicas': what it publishes to them in cluster mode."""
        return self._fleet.own_loads()

    def observe_peers(self, loads: Mapping[EndpointId, PeerLoad]) -> list[Decision]:
        """The other gateway replicas' last published load per endpoint (cluster mode; {} when none or
        unknown): added to this gateway's own in each endpoint's view. Load that went away serves the
        queues."""
        if self._fleet.observe_peers(loads, self._clock.now()):
            return self._serve_all()
        return []

    def set_estimates(self, eid: EndpointId, estimates: EndpointEstimates | None) -> list[Decision]:
        """What telemetry measured and fitted for the endpoint; plugins see it in the endpoint's view.
        Serves nothing by itself (the next completion or tick does)."""
        self._fleet.set_estimates(eid, estimates)
        return []

    # ----------------------------------------------------------------- request events
    def submit(self, req: SchedRequest, *, exclude: frozenset[EndpointId] = frozenset()) -> Decision | None:
        """A new request (or a retry that must avoid `exclude`). None: it waits in the queue.

        A request for a model with no ready endpoint is rejected (503 no_ready_endpoint), unless the model
        is loadable (`set_loadable`): then it waits in the queue like any other while the lifecycle loads
        the model, and the model is noted in `cold` for the lifecycle to take (`take_cold`).
        """
        cold = req.model not in self._fleet.ready_models()
        if cold and req.model not in self._loadable:
            return Reject(req, errors.no_ready_endpoint(req.model, self._limits.retry_after_s))
        queue = self._queues.of(req.model)
        if len(queue) >= self._limits.max_queue_per_model:
            return Reject(req, errors.queue_full(req.model, self._limits.retry_after_s))
        if cold:
            # Nothing to place it on yet, nor to predict its SLO against: admission looks at it on the
            # ticks after its model is ready (`tick`'s recheck).
            self._queues.push(queue, req, exclude)
            if req.model not in self.cold:
                self.cold.append(req.model)
            return None
        if not exclude:  # a retry was admitted already
            try:
                req, refused = self.admission.admit(
                    self._policy,
                    req,
                    self.snapshot,
                    queue.in_class,
                )
            except Exception as e:
                self._fault(req, "admission", e)
                return Reject(req, fault_error())
            if refused is not None:
                return Reject(req, refused)
        out: list[Decision] = []
        unplaced: FleetSnapshot | None = None
        if not queue and not exclude:
            # Nothing of its model waits, so serving the queue would look at it first: it is placed
            # now when it fits, without a queue entry made and removed (most requests below saturation).
            # The snapshot is the one serving would take, with it counted as queued.
            snap = self.snapshot()
            snap.queued[req.model] = 1
            try:
                chosen = self._policy.profile.place(req, snap)
            except Exception as e:
                self._fault(req, "placement", e)
                return Reject(req, fault_error())
            if chosen is not None:
                self._place(req, self._queues.next_seq(), chosen, out)
                return self._own(out)
            unplaced = snap  # it fits nowhere: it queues, and serving goes on from there
        self._queues.push(queue, req, exclude, queued_at=self._clock.now())
        # submit can report one decision only, so it may place `req` and nothing else: a queued request
        # that became placeable without an event that serves (a cancel, time passing) waits for the next
        # complete/tick instead of being dispatched here and never reported. Preemptions made for it
        # wait in the outbox.
        self._serve(req.model, out, only=req.id, unplaced=unplaced)
        return self._own(out)

    def _own(self, out: list[Decision]) -> Decision | None:
        """A submitted request's own decision among `out`; the preemptions made for it go to the outbox."""
        own: Decision | None = None
        for d in out:
            if isinstance(d, Preempt):
                self.outbox.append(d)
            else:
                own = d
        return own

    def complete(self, req_id: RequestId) -> list[Decision]:
        """A dispatched request finished (any outcome); its slot is free again."""
        self._priorities.pop(req_id, None)
        self._seqs.pop(req_id, None)
        eid = self._fleet.running_on(req_id)
        models = self._fleet.complete(req_id)
        out: list[Decision] = []
        if eid is not None and models:
            self._adjust(eid, req_id, out)
        for m in models:
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
        admitter = self._policy.admitter
        recheck = admitter is not None and admitter.rechecks and self._queues.any_waiting()
        snap = self.snapshot() if recheck else None
        for model, queue in self._queues.items():
            loading = model not in ready and model in self._loadable
            wait_limit = max(max_wait, self._load_deadline_s) if loading else max_wait
            if loading or model not in ready:
                # A loading model's requests wait (the lifecycle fails it, or the deadline); those of a
                # model with no ready endpoint that is not loading are refused.
                retry = self._limits.retry_after_s
                for item in list(queue):
                    if now - item.queued_at > wait_limit:
                        self._expire(queue, item, model, now, out)
                    elif not loading:
                        queue.remove(item)
                        out.append(Reject(item.req, errors.no_ready_endpoint(model, retry)))
                continue
            # Only the requests whose expiry or recheck may have come (gateway.sched.ticks).
            for item in ticks.due(
                queue, model, now, wait_limit, admitter=admitter if recheck else None, snap=snap
            ):
                if now - item.queued_at > wait_limit:
                    self._expire(queue, item, model, now, out)
                    continue
                if snap is not None:
                    req = item.req
                    try:
                        req, refused = self.admission.recheck(self._policy, req, snap)
                    except Exception as e:
                        self._fault(req, "admission", e)
                        refused = fault_error()
                    if refused is not None:
                        queue.remove(item)
                        out.append(Reject(req, refused))
                        continue
                    if req is not item.req:
                        queue.set_req(item, req)  # a demotion moves its class count and key (and its time)
                        continue
                queue.checks.again(item, now)  # its time has come: looked at on every tick from now on
        out.extend(self._serve_all())
        return out

    def _expire(
        self, queue: ModelQueue, item: Queued, model: ModelName, now: float, out: list[Decision]
    ) -> None:
        queue.remove(item)
        waited = now - item.queued_at
        out.append(Reject(item.req, errors.queue_timeout(model, waited, self._limits.retry_after_s)))

    # ----------------------------------------------------------------- views
    def snapshot(self) -> FleetSnapshot:
        now = self._clock.now()
        if self._policy.profile.columnar and self._fleet.size() >= COLUMNS_FROM:
            # placement over columns: the views' arrays come along
            cols = self._fleet.columns(now, self._limits.stale_after_s)
            return FleetSnapshot(now, cols.endpoints, self._queues.waiting(), cols)
        views = self._fleet.views(now, self._limits.stale_after_s)
        return FleetSnapshot(now, views, self._queues.waiting())

    def queue_depth(self, model: ModelName) -> int:
        return self._queues.depth(model)

    def queue_depths(self) -> dict[ModelName, int]:
        return self._queues.depths()

    def progress(self, req_id: RequestId, produced: int, first_token_at: float | None) -> None:
        """A dispatched request has streamed `produced` tokens (its first at `first_token_at`): placement
        plugins see it in the endpoint's running requests. Serves nothing by itself."""
        self._fleet.progress(req_id, produced, first_token_at, self._clock.now())

    def pin(self, req_id: RequestId) -> None:
        """A running request can no longer be resumed faithfully (its stream produced reasoning or a
        tool call, which a continuation from text would lose): it is never chosen as a victim."""
        self._fleet.pin(req_id)

    def engine_priority(self, req_id: RequestId) -> int | None:
        """The priority to send with a dispatched request (lower is more urgent): set only when its
        endpoint runs priority scheduling and the policy's ordering has one."""
        return self._priorities.get(req_id)

    def running_on(self, req_id: RequestId) -> EndpointId | None:
        return self._fleet.running_on(req_id)

    def dispatched(self, req_id: RequestId) -> SchedRequest | None:
        """A running request as it was dispatched (None: not running on an endpoint of the set)."""
        return self._fleet.request(req_id)

    def inflight_on(self, eid: EndpointId) -> int:
        """Requests the gateway runs on `eid` now (0 for an unknown endpoint)."""
        return self._fleet.inflight_on(eid)

    def cap_of(self, eid: EndpointId) -> int | None:
        """The concurrency cap in force on `eid` (None: unknown endpoint); its view shows it as `cap`,
        and the configured maximum as `max_cap`."""
        return self._fleet.cap_of(eid)

    def endpoint_view(self, eid: EndpointId) -> EndpointView | None:
        return self._fleet.view(eid, self._clock.now(), self._limits.stale_after_s)

    def queued(self, model: ModelName) -> list[SchedRequest]:
        """The requests of `model` waiting in the gateway queue, in queue order (the autoscaler's view)."""
        return [item.req for item in self._queues.get(model) or ()]

    def queued_by_class(self) -> dict[ModelName, dict[str, int]]:
        """Queued requests per model and SLO class (for the admin API; counted as they come and go)."""
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

    def _serve(
        self,
        model: ModelName,
        out: list[Decision],
        *,
        only: RequestId | None = None,
        unplaced: FleetSnapshot | None = None,
    ) -> None:
        """Place queued requests of `model` in order; with `only`, stop at the first one that is not it.
        `unplaced`: the snapshot on which `only`, the one request queued, was just found to fit nowhere
        (`submit`): serving starts from that answer instead of asking the profile again."""
        queue = self._queues.get(model)
        if not queue:
            return  # most completions: nothing waits
        policy = self._policy
        skipped: set[int] = set()  # requests that fit nowhere now, passed over (policy.lookahead)
        while queue:
            snap = unplaced if unplaced is not None else self.snapshot()
            if len(queue) == 1 and not skipped:
                item = queue.head()
            else:
                try:
                    found = queue.first(policy.ordering, snap, skipped)
                except OrderingFault as f:
                    bad = f.item
                    self._fault(bad.req, "ordering", f.error)
                    if only is not None and bad.req.id != only:
                        return  # submit reports on its own request only: the next serve rejects it
                    queue.remove(bad)
                    out.append(Reject(bad.req, fault_error()))
                    if only is not None:
                        return
                    continue
                if found is None:
                    return
                item = found
            if only is not None and item.req.id != only:
                return
            view_snap = snap
            if item.exclude:
                others = tuple(e for e in snap.endpoints if e.id not in item.exclude)
                # Avoid endpoints that already failed this request unless nothing else serves it.
                if any(model in e.models and e.health is EndpointHealth.READY for e in others):
                    view_snap = FleetSnapshot(now=snap.now, endpoints=others, queued=snap.queued)
            if unplaced is not None:
                chosen, unplaced = None, None  # the answer `submit` had for it on this very snapshot
            else:
                try:
                    chosen = policy.profile.place(item.req, view_snap)
                except Exception as e:
                    self._fault(item.req, "placement", e)
                    queue.remove(item)
                    out.append(Reject(item.req, fault_error()))
                    if only is not None:
                        return
                    continue
            if chosen is None and policy.preemptor is not None:
                try:
                    taken = self._preemption(policy.preemptor, item.req, view_snap)
                except Exception as e:
                    self._fault(item.req, "preemption", e)
                    taken = None  # the request waits, as without preemption
                if taken is not None:
                    queue.remove(item)
                    for victim in taken[0]:
                        self._preempt(victim, queue, out)
                    self._place(item.req, item.seq, taken[1], out)
                    continue
            if chosen is None:
                # Strict priority, unless the policy lets requests behind one that fits nowhere go first
                # while endpoints still have room (its constraints, not the seats, hold it back).
                if len(skipped) >= policy.lookahead or not _has_room(view_snap, model):
                    return
                skipped.add(item.seq)
                continue
            queue.remove(item)
            self._place(item.req, item.seq, chosen, out)

    def _place(self, req: SchedRequest, seq: int, chosen: EndpointView, out: list[Decision]) -> None:
        """Dispatch `req` (no longer queued) to `chosen`."""
        # The snapshot the engine priority is decided on is the fleet before this dispatch, taken only
        # when it is asked for (most endpoints do not schedule by priority).
        snap = self.snapshot() if chosen.priority_scheduling else None
        self._fleet.dispatch(chosen.id, req, self._clock.now() if snap is None else snap.now)
        self._seqs[req.id] = seq
        if snap is not None:
            try:
                prio = self._policy.engine_priority(req, snap)
            except Exception as e:
                self._fault(req, "engine_priority", e)
                prio = None  # the request still runs, without a priority
            if prio is not None:
                self._priorities[req.id] = prio
        out.append(Dispatch(req, chosen))
        self._adjust(chosen.id, req.id, out)

    # ----------------------------------------------------------------- preemption
    def _preemption(
        self, preemptor: Preemptor, req: SchedRequest, snap: FleetSnapshot
    ) -> tuple[list[Victim], EndpointView] | None:
        """The victims whose seats make room for `req` on one endpoint, and that endpoint's view without
        them; None when no endpoint has enough. Victims are taken in the preemptor's order, endpoint by
        endpoint (in the order of each endpoint's best-ranked victim), one more at a time up to the
        rules' `max_victims`, until the placement pipeline accepts `req` there (e.g. the overflow guard
        once its inter-token time fits)."""
        rules = preemptor.rules
        slo = self._policy.slo
        if slo.class_of(req.slo.slo_class).kind not in rules.by:
            return None
        victims: list[Victim] = []
        ready = EndpointHealth.READY
        for e in snap.endpoints:
            if req.model not in e.models or e.health is not ready or e.instance_class not in rules.classes:
                continue
            victims.extend(self._victims(e, snap.now, rules))
        if not victims:
            return None
        by_endpoint: dict[EndpointId, list[Victim]] = {}
        for v in preemptor.rank(req, victims, snap):
            if not any(v is c for c in victims):
                raise RuntimeError(f"preemptor {preemptor.name!r} returned a request that was not a victim")
            by_endpoint.setdefault(v.endpoint.id, []).append(v)
        groups = list(by_endpoint.values())
        if rules.class_order:  # class by class (a stable sort keeps the preemptor's order inside one)
            rank = {cls: i for i, cls in enumerate(rules.class_order)}
            groups.sort(key=lambda g: rank[g[0].endpoint.instance_class])
        for tried, group in enumerate(groups):
            if tried >= MAX_PREEMPT_TRIES:
                break
            view = group[0].endpoint
            for n, v in enumerate(group[: rules.max_victims], start=1):
                view = _without(view, v.running)
                alone = FleetSnapshot(now=snap.now, endpoints=(view,), queued=snap.queued)
                chosen = self._policy.profile.place(req, alone)
                if chosen is not None:
                    return group[:n], chosen
        return None

    def _victims(self, e: EndpointView, now: float, rules: PreemptionRules) -> list[Victim]:
        """The running requests on `e` that may be preempted now: resumable, of a kind that may be
        preempted, under the preemption limit, and their own SLO still feasible after a resume."""
        slo = self._policy.slo
        load: EndpointLoad | None = None
        out: list[Victim] = []
        for r in e.running:
            if not r.resumable or r.preemptions >= rules.max_preemptions:
                continue
            if slo.class_of(r.slo_class).kind not in rules.victims:
                continue
            load = load or EndpointLoad(e, now, _PREDICT)
            if _resume_feasible(r, load, rules):
                out.append(Victim(r, e))
        return out

    def _preempt(
        self, victim: Victim, queue: ModelQueue, out: list[Decision], reason: str = REASON_WAITING
    ) -> None:
        """Free the victim's seat and queue it again (its arrival, band and place in arrival order)."""
        rid = victim.running.id
        eid = victim.endpoint.id
        old = self._fleet.preempt(rid)
        if old is None:  # the fleet's views and its running set disagree: a bug, not a policy fault
            raise RuntimeError(f"preemption victim {rid!r} is not running")
        self._priorities.pop(rid, None)
        seq = self._seqs.pop(rid, None)
        produced = victim.running.produced or 0
        requeued = dataclasses.replace(
            old, preemptions=old.preemptions + 1, produced_tokens=old.produced_tokens + produced
        )
        self._queues.push(queue, requeued, frozenset(), seq=seq, queued_at=self._clock.now())
        out.append(Preempt(requeued, victim.endpoint, reason))
        self._adjust(eid, rid)

    # ----------------------------------------------------------------- concurrency caps
    def _adjust(self, eid: EndpointId, rid: RequestId, out: list[Decision] | None = None) -> None:
        """Let the policy's concurrency controller set `eid`'s cap (its running set changed); with `out`,
        a lowered cap is enforced at once by preemption where that is allowed (`_shed`)."""
        ctl = self._policy.concurrency
        if ctl is None:
            return
        now = self._clock.now()
        view = self._fleet.view(eid, now, self._limits.stale_after_s)
        if view is None:
            return
        try:
            cap = ctl.cap(view, now)
        except Exception as e:
            self._fault_id(rid, "concurrency", e)
            return
        before = self._fleet.cap_of(eid)
        if self._fleet.set_cap(eid, max(ctl.floor, cap), now) and out is not None:
            after = self._fleet.cap_of(eid)
            if before is not None and after is not None and after < before:
                self._shed(eid, out)

    def _shed(self, eid: EndpointId, out: list[Decision]) -> None:
        """A cut cap on an endpoint where preemption is allowed, running a request of a kind that may
        preempt (an interactive stream whose inter-token time the cut is for): preempt eligible victims
        (the preemptor's order) down to the cap, rather than letting the stream wait until enough of
        them finish. Without a preemptor, or where it is not allowed, a lowered cap only stops new
        requests."""
        preemptor = self._policy.preemptor
        if preemptor is None:
            return
        rules = preemptor.rules
        now = self._clock.now()
        view = self._fleet.view(eid, now, self._limits.stale_after_s)
        own = self._fleet.inflight_on(eid)  # (other replicas' requests are theirs to shed: cluster mode)
        if view is None or view.instance_class not in rules.classes or own <= view.cap:
            return
        slo = self._policy.slo
        urgent = [r for r in view.running if slo.class_of(r.slo_class).kind in rules.by]
        protected = min(urgent, key=lambda r: r.itl_s if r.itl_s is not None else math.inf, default=None)
        req = None if protected is None else self._fleet.request(protected.id)
        if req is None:
            return
        snap = self.snapshot()
        try:
            victims = self._victims(view, now, rules)
            ranked = list(preemptor.rank(req, victims, snap)) if victims else []
        except Exception as e:
            self._fault(req, "preemption", e)
            return
        excess = own - view.cap
        for v in ranked[:excess]:
            if not any(v is c for c in victims):
                self._fault(
                    req, "preemption", RuntimeError(f"preemptor {preemptor.name!r} invented a victim")
                )
                return
            model = self._fleet.request(v.running.id)
            if model is None:
                continue
            self._preempt(v, self._queues.of(model.model), out, REASON_CAP)

    def _adjust_all(self) -> None:
        """Caps after a policy or endpoint change: the controller's, or the configured ones without one."""
        if self._policy.concurrency is None:
            for eid in self._fleet.ids():
                self._fleet.set_cap(eid, _UNBOUNDED)  # clamped to the configured cap
            return
        for eid in self._fleet.ids():
            self._adjust(eid, RequestId(""))
