"""What every admitter enforces: the per-class queue bounds of the policy's SLO classes."""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.slo import SloPolicy
from gateway.sched.interfaces import AdmitDecision, AdmitOutcome
from gateway.sched.request import SchedRequest

CLASS_QUEUE_FULL = "class_queue_full"
SLO_INFEASIBLE = "slo_infeasible"


def class_bound(
    slo: SloPolicy, req: SchedRequest, queued_in_class: Callable[[str], int], retry_after_s: float
) -> AdmitDecision | None:
    """A rejection when the request's class already has `max_queue` requests waiting, else None."""
    cls = slo.get(req.slo.slo_class)
    if cls is None or cls.max_queue <= 0:
        return None
    if queued_in_class(cls.name) < cls.max_queue:
        return None
    return AdmitDecision(
        AdmitOutcome.REJECT,
        CLASS_QUEUE_FULL,
        f"{cls.max_queue} requests of SLO class '{cls.name}' are already waiting for model '{req.model}'",
        retry_after_s,
    )
