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

One call tries at most `serve_slice` requests (`gateway.sched.slices`): a serve it cuts short is owed
(`owed`), and `serve` goes on with it from where it stopped, one slice a call; carried on at once, the
slices decide as one uncut serve.

Preemption (the policy's `Preemptor`; none by default): when the request at the head of a queue can be
placed nowhere, its kind may preempt (interactive) and an endpoint of an allowed class (mixed) runs
resumable work of a kind that may be preempted (batch), the preemptor ranks the eligible victims and the
first ones that make room for the request on one endpoint (the placement pipeline accepts it there once
they are gone; one, or up to the rules' `max_victims`) give up their seats: each victim's seat is freed
(not a completion), the victim is queued again with its arrival time, band and place in arrival order,
and the request is dispatched to that endpoint. The decisions are a `Preempt` per victim followed by
the `Dispatch`; `submit` reports only its own request's decision, so the preemptions
it made wait in an outbox (`take_preemptions`). A victim is eligible only when it is resumable, under the
policy's preemption limit, and its own SLO stays feasible after a resume (`gateway.sched.victims`).

Concurrency caps: each endpoint's cap in force starts at its configured cap (the operator's maximum);
a policy's `ConcurrencyController` moves it when the endpoint's running set changes (a dispatch, a
completion, a preemption), clamped into [its floor, the configured cap] (`cap_of`).

A policy plugin that raises (ordering, admission, placement, engine priority) fails only the request it
was deciding on: that request is rejected with a 500 (`internal_error`) and the queue goes on being
served; the exception is kept in `faults` for the daemon to log (the core does no I/O). Otherwise one
plugin bug would fail whichever request's completion happened to serve the queue, and leave the queue
unserved.

The scheduler is built in layers, one module each: its bookkeeping (`gateway.sched.bookkeeping`: the
state it holds, the outboxes, the read-only views), preemption and concurrency caps
(`gateway.sched.preempting`), and here the events that decide: configuration and endpoint changes,
submit, serving the queues, complete, cancel and tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gateway.core import errors
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, ModelName, RequestId
from gateway.sched import ticks
from gateway.sched.decisions import Decision, Dispatch, Preempt, Reject, fault_error
from gateway.sched.preempting import Preempting
from gateway.sched.profile import Policy
from gateway.sched.queues import ModelQueue, OrderingFault, Queued
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot
from gateway.sched.types import EndpointSpec, PeerLoad, QueueLimits
from gateway.sched.unfit import remember, retry_on


class Scheduler(Preempting):
    # ----------------------------------------------------------------- configuration
    def set_loadable(self, models: Iterable[ModelName], load_deadline_s: float) -> None:
        """Models a lifecycle manager loads on demand: their requests wait for a load instead of being
        rejected with no_ready_endpoint, for up to max(max_wait_s, `load_deadline_s`)."""
        self._loadable = frozenset(models)
        self._load_deadline_s = load_deadline_s

    def fail_model(self, model: ModelName, error: errors.BerthError) -> list[Decision]:
        """Reject every queued request of `model` with `error` (its load failed)."""
        queue = self._queues.get(model)
        if not queue:
            return []
        out: list[Decision] = [Reject(item.req, error) for item in queue]
        queue.clear()
        return out

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
                self._place(req, self._queues.next_seq(), chosen, out, snap)
                return self._own(out)
            unplaced = snap  # it fits nowhere: it queues, and serving goes on from there
        if not exclude:
            self.admission.waiting(self._policy, req)  # it waits: the admitter may prepare for that
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
        self._slices.start(self.serve_slice)
        for m in models:
            self._serve(m, out)
        return out

    def serve(self) -> list[Decision]:
        """Go on serving where the last call stopped (`owed`), for at most one more slice
        (`gateway.sched.slices`); a driver calls it while `owed` is true."""
        slices = self._slices
        slices.start(self.serve_slice)
        out: list[Decision] = []
        while (owed := slices.take()) is not None:
            self._serve(owed[0], out, skipped=owed[1])
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
            looked, after = ticks.due(
                queue, model, now, wait_limit, admitter=admitter if recheck else None, snap=snap
            )
            for item in looked:
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
                # kept: looked at again once the admitter's next promise or its expiry comes (a time
                # already past: on every tick from now on)
                queue.checks.again(item, after(item))
        out.extend(self._serve_all())
        return out

    def _expire(
        self, queue: ModelQueue, item: Queued, model: ModelName, now: float, out: list[Decision]
    ) -> None:
        queue.remove(item)
        waited = now - item.queued_at
        out.append(Reject(item.req, errors.queue_timeout(model, waited, self._limits.retry_after_s)))

    # ----------------------------------------------------------------- serving the queues
    def _serve_all(self) -> list[Decision]:
        out: list[Decision] = []
        self._slices.start(self.serve_slice)
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
        skipped: set[int] | None = None,
    ) -> None:
        """Place queued requests of `model` in order; with `only`, stop at the first one that is not it.
        `unplaced`: the snapshot on which `only`, the one request queued, was just found to fit nowhere
        (`submit`): serving starts from that answer instead of asking the profile again. Without `only`,
        the call's slice bounds the requests tried (`gateway.sched.slices`): `skipped` given, an owed
        serve goes on; else a fresh one begins."""
        queue = self._queues.get(model)
        sliced = only is None
        if not queue:
            if sliced:
                self._slices.owed.pop(model, None)
            return  # most completions: nothing waits
        if sliced and skipped is None:
            runs, skipped = self._slices.begin(model)  # an owed serve of `model` goes on
            if not runs:
                return  # this call's tries are spent: it is owed
        policy = self._policy
        slices = self._slices
        if skipped is None:
            skipped = set()  # requests that fit nowhere now, passed over (policy.lookahead)
        while queue:
            if sliced:
                if slices.tries <= 0:
                    slices.cut(model, skipped)  # the next slice goes on from here
                    return
                slices.tries -= 1
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
                item.unfit = remember(item.unfit, policy.profile, item.req, snap, everywhere=True)
            else:
                # A request that fit nowhere is tried on the endpoints that changed since (unfit.py).
                among = (
                    None if item.exclude else retry_on(item.unfit, policy.profile, item.req, item.seq, snap)
                )
                try:
                    chosen = None if among == [] else policy.profile.place(item.req, view_snap, among)
                    if chosen is None and not item.exclude:
                        item.unfit = remember(
                            item.unfit, policy.profile, item.req, snap, everywhere=among is None
                        )
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
                if len(skipped) >= policy.lookahead or not view_snap.has_room(model):
                    return
                skipped.add(item.seq)
                continue
            queue.remove(item)
            self._place(item.req, item.seq, chosen, out, snap)

    def _place(
        self,
        req: SchedRequest,
        seq: int,
        chosen: EndpointView,
        out: list[Decision],
        placed_on: FleetSnapshot | None = None,
    ) -> None:
        """Dispatch `req` (no longer queued) to `chosen`. `placed_on`: the snapshot it was placed on, the
        fleet unchanged since."""
        # The snapshot the engine priority is decided on is the fleet before this dispatch, taken only
        # when it is asked for (most endpoints do not schedule by priority). At the clock of the snapshot
        # it was placed on (a simulator's event), the fleet's views, columns and memo are that one's.
        snap: FleetSnapshot | None = None
        if chosen.priority_scheduling:
            if placed_on is not None and placed_on.now == self._clock.now():
                p = placed_on
                snap = FleetSnapshot(p.now, p.endpoints, self._queues.waiting(), p.columns, p.memo)
            else:
                snap = self.snapshot()
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
