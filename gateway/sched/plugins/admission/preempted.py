"""The seats preemption would free for a request, for SLO admission: under the policy's preemption
rules (`gateway.sched.victims`, the rule the scheduler's preemption follows), a request of a kind that
may preempt is not infeasible while a seat held by a running request it may preempt would let it keep
its SLO. Without it, admission counts those seats as taken and refuses requests that preemption would
have placed in time.

A request taking a preempted seat is predicted as on a free seat of that endpoint now (the scheduler
frees the victim's seat and dispatches the request in the same decision: no delay beyond the iteration
in flight), in a batch with up to the rules' `max_victims` eligible victims gone (the scheduler takes
them one more at a time until the placement accepts the request there). Sans-IO.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.slo import SloPolicy
from gateway.sched.interfaces import PreemptionRules
from gateway.sched.load_batch import Pending
from gateway.sched.loads import LoadCaches
from gateway.sched.predict import EndpointLoad, Prediction, seats_of
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView
from gateway.sched.victims import Victims, may_preempt, preempts_on


class PreemptedSeats:
    """Predictions of a request on the seats preemption would free (`predictions`)."""

    __slots__ = ("_caches", "_finder", "_rules", "_slo")

    def __init__(self, rules: PreemptionRules, slo: SloPolicy, caches: LoadCaches) -> None:
        self._rules = rules
        self._slo = slo
        self._caches = caches
        self._finder = Victims()

    def predictions(
        self,
        req: SchedRequest,
        views: Sequence[EndpointView],
        loads: Sequence[EndpointLoad | Pending],
        now: float,
        skip: int,
        *,
        worst_case: bool = False,
    ) -> list[Prediction]:
        """`req` on a seat preemption frees at `now`, on each endpoint of `views` (their `loads`) where
        one would, once `skip` such seats went to requests ahead of it; none when `req` may not preempt
        or preemption frees no more than `skip` seats. `worst_case`: decode at a full batch. A load the
        cache has not made yet (`Pending`) is made only for an endpoint where a seat would free."""
        rules, slo = self._rules, self._slo
        if not may_preempt(req, rules, slo):
            return []
        found: list[tuple[EndpointLoad | Pending, int]] = []
        freed = 0
        for view, load in zip(views, loads, strict=True):
            if not preempts_on(view, rules):
                continue
            victims = len(self._finder.on(view, now, rules, slo, self._caches))
            # a cut cap leaves an endpoint running more than its seats: those go first
            seats = victims - max(0, load.n - seats_of(load.view))
            if seats > 0:
                freed += seats
                found.append((load, min(victims, rules.max_victims)))
        if freed <= skip:
            return []
        return [
            on_freed_seat(
                load.load() if isinstance(load, Pending) else load, req, gone, worst_case=worst_case
            )
            for load, gone in found
        ]


def on_freed_seat(
    load: EndpointLoad, req: SchedRequest, gone: int, *, worst_case: bool = False
) -> Prediction:
    """`req` placed on `load`'s endpoint now, in the seat of a preempted request, with `gone` (>= 1) of
    its running requests preempted: `EndpointLoad.predict` with that many fewer in the batch it joins
    (`worst_case`: every seat taken)."""
    out = load.output_tokens(req)
    p = float(resume_prompt_tokens(req))
    wait = 0.5 * load.tpot_now  # the iteration in flight
    ttft = wait + load.coef.prefill_s(prefill_tokens(req, load.view.id) + load.pending_prompt)
    n = max(0, load.n - gone)
    b = float(load.seats) if worst_case else float(max(1, min(n + 1, load.seats)))
    avg_ctx = (load.ctx_sum + p + 0.5 * out) / (load.n + 1)
    tpot = load.tpot(b, avg_ctx)
    return Prediction(wait, ttft, ttft + max(0.0, out - 1.0) * tpot, tpot, out)
