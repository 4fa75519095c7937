"""Admission by predicted feasibility: a request whose SLO no endpoint of its model can meet (predicted,
as if it were dispatched now) gets its class's `on_infeasible` outcome:

- `reject`: 429 now, error code `slo_infeasible`, Retry-After = the smallest predicted wait for a seat
  (at least `retry_after_s`);
- `hold`: queued anyway (the ordering decides when it runs);
- `best-effort`: queued, demoted below every band (it runs when nothing with a chance is waiting).

A request is feasible on an endpoint when its predicted first and last token keep its deadlines within
`margin` (1.2: up to 20 % over still counts as feasible, for prediction error) and its per-token time
keeps its ITL target. Requests already waiting in the gateway queue are not counted in the prediction
(the ordering may run this one before them). Every admitter also enforces the class queue bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated

from msgspec import Meta

from gateway.core.slo import Infeasible, SloPolicy
from gateway.core.types import EndpointHealth
from gateway.sched.interfaces import ADMIT, AdmitDecision, AdmitOutcome
from gateway.sched.plugins.admission.common import SLO_INFEASIBLE, class_bound
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.predict import LoadCache, PredictParams, time_left
from gateway.sched.registry import BuildContext, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot

_OUTCOME = {
    Infeasible.REJECT: AdmitOutcome.REJECT,
    Infeasible.HOLD: AdmitOutcome.HOLD,
    Infeasible.BEST_EFFORT: AdmitOutcome.BEST_EFFORT,
}


class SloFeasibilityParams(PredictionParams, frozen=True, kw_only=True):
    margin: Annotated[float, Meta(ge=0.5, le=10.0)] = 1.0
    retry_after_s: Annotated[float, Meta(ge=0.0)] = 1.0


class SloFeasibilityAdmitter:
    name = "slo-feasibility"

    def __init__(self, slo: SloPolicy, params: PredictParams, *, margin: float, retry_after_s: float) -> None:
        self._slo = slo
        self._cache = LoadCache(params)
        self.margin = margin
        self.retry_after_s = retry_after_s

    def admit(
        self, req: SchedRequest, snap: FleetSnapshot, queued_in_class: Callable[[str], int]
    ) -> AdmitDecision:
        bound = class_bound(self._slo, req, queued_in_class, self.retry_after_s)
        if bound is not None:
            return bound
        left = time_left(req, snap.now)
        itl_ms = req.slo.itl_ms
        if left == (None, None) and itl_ms is None:
            return ADMIT
        ttft_left, e2e_left = left
        m = self.margin
        shortest_wait = math.inf
        best_ttft = best_e2e = math.inf
        seen = False
        for e in snap.endpoints:
            if req.model not in e.models or e.health is not EndpointHealth.READY:
                continue
            seen = True
            pred = self._cache.load(e, snap.now).predict(req)
            shortest_wait = min(shortest_wait, pred.wait_s)
            best_ttft = min(best_ttft, pred.ttft_s)
            best_e2e = min(best_e2e, pred.e2e_s)
            ok = (
                (ttft_left is None or pred.ttft_s <= ttft_left * m)
                and (e2e_left is None or pred.e2e_s <= e2e_left * m)
                and (itl_ms is None or pred.tpot_s * 1000.0 <= itl_ms * m)
            )
            if ok:
                return ADMIT
        if not seen:
            return ADMIT  # nothing ready: the scheduler answers for that
        outcome = _OUTCOME[self._slo.class_of(req.slo.slo_class).on_infeasible]
        if outcome is not AdmitOutcome.REJECT:
            return AdmitDecision(outcome, SLO_INFEASIBLE)
        parts = []
        if ttft_left is not None:
            parts.append(
                f"first token predicted in {best_ttft * 1000:.0f} ms, {ttft_left * 1000:.0f} ms left"
            )
        if e2e_left is not None:
            parts.append(f"completion predicted in {best_e2e * 1000:.0f} ms, {e2e_left * 1000:.0f} ms left")
        if itl_ms is not None and not parts:
            parts.append(f"no endpoint keeps the {itl_ms:g} ms inter-token target")
        retry = max(self.retry_after_s, shortest_wait if math.isfinite(shortest_wait) else 0.0)
        return AdmitDecision(
            AdmitOutcome.REJECT,
            SLO_INFEASIBLE,
            f"no endpoint of model '{req.model}' can meet the SLO of class '{req.slo.slo_class}' now: "
            + "; ".join(parts),
            retry,
        )


def _build(p: SloFeasibilityParams, ctx: BuildContext) -> SloFeasibilityAdmitter:
    return SloFeasibilityAdmitter(ctx.slo, p.predict_params(), margin=p.margin, retry_after_s=p.retry_after_s)


SPEC = PluginSpec(
    PluginKind.ADMITTER,
    "slo-feasibility",
    SloFeasibilityParams,
    _build,
    "reject, hold or demote requests whose SLO no endpoint can meet (per class)",
)
