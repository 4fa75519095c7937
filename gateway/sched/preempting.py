"""Who gives up a seat: the scheduler's preemption and concurrency caps (`Preempting`, the base
`gateway.sched.scheduler.Scheduler` extends, on its bookkeeping `SchedulerBooks`). How victims are
chosen and caps move is told in `gateway.sched.scheduler`'s module docstring (Preemption, Concurrency
caps). Sans-IO."""

from __future__ import annotations

import dataclasses
import math
from typing import Final

from gateway.core.types import EndpointHealth, EndpointId, RequestId
from gateway.sched.bookkeeping import SchedulerBooks
from gateway.sched.decisions import Decision, Preempt
from gateway.sched.interfaces import PreemptionRules, Preemptor, Victim
from gateway.sched.queues import ModelQueue
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.victims import may_preempt, preempts_on

#: Endpoints whose victims' seats a preempting request is tried on (by the preemptor's order), per placement.
MAX_PREEMPT_TRIES: Final = 4
#: Why a request was preempted (the `Preempt.reason` of the one trigger there is).
REASON_WAITING: Final = "interactive_waiting"
#: ... and when an endpoint's cap was cut below its running set for the interactive streams it runs.
REASON_CAP: Final = "cap_lowered"

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


class Preempting(SchedulerBooks):
    """Preemption and concurrency caps over the scheduler's bookkeeping."""

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
        if not may_preempt(req, rules, slo):
            return None
        victims: list[Victim] = []
        ready = EndpointHealth.READY
        endpoints = snap.endpoints
        # only the endpoints that run a candidate victim at all (kept per tuple of views, carried over
        # where endpoints changed: `FleetSnapshot.places`); the others have none to give
        finder = self._victim_finder
        places = snap.places((finder, rules, slo), lambda e: finder.any_on(e, rules, slo))
        for e in endpoints if places is None else [endpoints[i] for i in places]:
            if req.model not in e.models or e.health is not ready or not preempts_on(e, rules):
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
        """The running requests on `e` that may be preempted now (`gateway.sched.victims.Victims.on`)."""
        return self._victim_finder.on(e, now, rules, self._policy.slo, self._policy.loads)

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
        if view is None or not preempts_on(view, rules) or own <= view.cap:
            return
        slo = self._policy.slo
        urgent = [r for r in view.running if slo.class_of(r.slo_class).kind in rules.by]  # (may_preempt)
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
