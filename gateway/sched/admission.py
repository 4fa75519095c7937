"""Admission inside the scheduler: the policy's Admitter runs once per new request, before it is queued,
and again for every queued request on each tick (`recheck`: a request whose SLO became infeasible while
it waited). The admitter sees the fleet through the profile's scope (`SchedulerProfile.scope`): only the
endpoints of the request's model it may ever be placed on, so an endpoint group it never leaves is all it
is judged on. Outcomes are counted per SLO class (`berth_admission_decisions_total{slo_class, outcome}`:
every arrival once, plus a rejection or demotion of a queued request).

The counts live here, in the scheduler, rather than in the admitter plugin, so that a policy reload
(which builds new plugins) does not reset them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.sched.interfaces import ADMIT, AdmitDecision, AdmitOutcome, Waiting
from gateway.sched.profile import Policy
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


class AdmissionLedger:
    """Admission outcomes per (SLO class, outcome) since start."""

    __slots__ = ("_counts", "_waiting")

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        # The last admitter asked about and its `Waiting.waiting` (None: it has none), resolved once per
        # admitter (the protocol's isinstance costs more than the call).
        self._waiting: tuple[object, Callable[[SchedRequest], None] | None] | None = None

    def record(self, slo_class: str, outcome: AdmitOutcome) -> None:
        key = (slo_class, outcome.value)
        self._counts[key] = self._counts.get(key, 0) + 1

    def counts(self) -> dict[tuple[str, str], int]:
        return dict(self._counts)

    def by_class(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (cls, outcome), n in sorted(self._counts.items()):
            out.setdefault(cls, {})[outcome] = n
        return out

    def admit(
        self,
        policy: Policy,
        req: SchedRequest,
        snapshot: Callable[[], FleetSnapshot],
        queued_in_class: Callable[[str], int],
    ) -> tuple[SchedRequest, BerthError | None]:
        """Run the policy's admitter: the request to queue (demoted when best-effort) and None, or the
        request and the 429 to answer with. `snapshot` is called only when the policy has an admitter
        (without one, every request is admitted and only counted)."""
        admitter = policy.admitter
        decision: AdmitDecision = ADMIT
        if admitter is not None:
            decision = admitter.admit(req, policy.profile.scope(req, snapshot()), queued_in_class)
        self.record(req.slo.slo_class, decision.outcome)
        if decision.outcome is AdmitOutcome.REJECT:
            reason = decision.reason or "rejected"
            return req, errors.queue_full(
                req.model,
                decision.retry_after_s if decision.retry_after_s is not None else 1.0,
                code=reason,
                message=decision.message or f"request rejected by admission control ({reason})",
            )
        if decision.outcome is AdmitOutcome.BEST_EFFORT and not req.best_effort:
            return dataclasses.replace(req, best_effort=True), None
        return req, None

    def waiting(self, policy: Policy, req: SchedRequest) -> None:
        """`req`, let in by `admit`, is queued on arrival: the admitter is told when it prepares for the
        requests that wait (`Waiting`)."""
        admitter = policy.admitter
        kept = self._waiting
        if kept is None or kept[0] is not admitter:
            kept = self._waiting = (admitter, admitter.waiting if isinstance(admitter, Waiting) else None)
        if kept[1] is not None:
            kept[1](req)

    def recheck(
        self, policy: Policy, req: SchedRequest, snap: FleetSnapshot
    ) -> tuple[SchedRequest, BerthError | None]:
        """A queued request, again (on a tick): the same results as `admit`; only outcomes that change
        something (reject, a new demotion) are counted."""
        admitter = policy.admitter
        if admitter is None:
            return req, None
        decision = admitter.recheck(req, policy.profile.scope(req, snap))
        if decision.outcome is AdmitOutcome.REJECT:
            self.record(req.slo.slo_class, decision.outcome)
            return req, errors.queue_full(
                req.model,
                decision.retry_after_s if decision.retry_after_s is not None else 1.0,
                code=decision.reason or "rejected",
                message=decision.message or "request rejected by admission control while it waited",
            )
        if decision.outcome is AdmitOutcome.BEST_EFFORT and not req.best_effort:
            self.record(req.slo.slo_class, decision.outcome)
            return dataclasses.replace(req, best_effort=True), None
        return req, None
