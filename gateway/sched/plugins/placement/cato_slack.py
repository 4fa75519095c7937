"""CATO's replica choice: the endpoint with the smallest predicted wait among those that still meet the
request's deadlines; when none does (or it has no deadline), the smallest wait.

The wait is the time until the request's prefill could start there (a seat, then the iteration in
flight: `gateway.sched.predict`); "meets" compares the predicted first and last token with the time left.
Ties go to the smaller predicted completion, then the endpoint id. Scores are not used. A request
with part of its prompt cached somewhere (`SchedRequest.cached`) compares the predicted first token
(the wait, then the prefill of the tokens not cached there) instead of the wait: the endpoint holding
its prefix wins exactly when waiting there costs less than the prefill it saves.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.sched.loads import LoadCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.targets import itl_ok, meets, time_left


class CatoSlackParams(PredictionParams, frozen=True, kw_only=True):
    pass


class CatoSlackPicker:
    name = "cato-slack"

    def __init__(self, params: CatoSlackParams, loads: LoadCache | None = None) -> None:
        self.params = params
        self._cache = loads or LoadCache(params.predict_params())

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView:
        now = snap.now
        left = time_left(req, now)
        best_any: tuple[float, float, str] | None = None
        best_meet: tuple[float, float, str] | None = None
        by_id: dict[str, EndpointView] = {}
        cached = bool(req.cached)
        for e, _ in scored:
            by_id[e.id] = e
            pred = self._cache.load(e, now).predict(req)
            # With a cached prefix somewhere, the predicted first token (the wait, then the prefill of
            # the tokens not cached there): the holder's wait is weighed against the prefill it saves.
            wait = pred.ttft_s if cached else pred.wait_s
            k = (wait, pred.e2e_s, str(e.id))
            if best_any is None or k < best_any:
                best_any = k
            if meets(pred, left) and itl_ok(req, pred) and (best_meet is None or k < best_meet):
                best_meet = k
        chosen = best_meet or best_any
        assert chosen is not None  # the runner never calls a picker without candidates
        return by_id[chosen[2]]


SPEC = PluginSpec(
    PluginKind.PICKER,
    "cato-slack",
    CatoSlackParams,
    lambda p, ctx: CatoSlackPicker(p, ctx.loads.get(p.predict_params())),
    "CATO: smallest predicted wait that meets the deadlines, else smallest wait",
)
