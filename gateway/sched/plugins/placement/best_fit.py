"""Aladdin's best-fit request placement (papers/ALGORITHMS.md §2) as a filter that keeps one endpoint.

Endpoints are tried most loaded first, by ``capacity_norm`` = the L2 norm of (running / cap,
Σ(l_in + γ·l_out) / KV capacity); endpoints whose running requests are running long (their output
lengths were under-estimated, so they are more loaded than their predictions say) are tried last
(Aladdin's re-balancing for prediction error). The request goes to the first endpoint where all four
constraints hold; when none fits it stays queued (a fixed fleet: waiting beats overloading):

(b) ATGT: ``k2·Σ(l_in + γ·l_out) <= θ·(T_dec − c2·b − c3)`` over the running requests and this one,
    with ``T_dec`` the tightest per-token budget among them: an ITL target, or what an end-to-end
    deadline leaves per remaining token;
(c) TTFT: the predicted first token (seat, iteration in flight, prefill with the pending prompts)
    keeps the request's first-token deadline;
(d) prefill pauses decode: this prompt's prefill time ``<= θ ·`` the least time any running request
    has saved against its deadline or ITL target;
(e) KV: the footprint of every request over its remaining iterations (``h·(context + t) + j`` until it
    ends) summed, at its peak, fits the endpoint's KV capacity (skipped while the capacity is unknown).

For the running requests l_in is the context so far and l_out what is left. A request's own targets (in
(b) and (c)) are dropped when it cannot meet them even alone on that endpoint, or when admission
demoted it to best-effort: it then goes where it harms no one. An endpoint with nothing running always
fits. Output lengths are the predicted means, or the tail bound in `tail` mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

from msgspec import Meta

from gateway.sched.plugins.params import PredictionParams
from gateway.sched.predict import (
    EndpointLoad,
    LoadCache,
    PredictParams,
    RunningState,
    meets,
    time_left,
)
from gateway.sched.registry import BuildContext, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot

#: Scale of the token dimension of capacity_norm when the KV capacity is unknown (tokens per seat).
_TOKENS_PER_SEAT = 2048.0


class BestFitParams(PredictionParams, frozen=True, kw_only=True):
    gamma: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5  # strictness: share of l_out counted in (b)
    theta: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.9  # margin for prediction error in (b) and (d)
    # Endpoints whose running requests are, summed, this far past their predicted lengths (in units of
    # one request's length) are tried last.
    rebalance_threshold: Annotated[float, Meta(ge=0.0)] = 0.5


class BestFitFilter:
    name = "best-fit"

    def __init__(self, params: PredictParams, *, gamma: float, theta: float, rebalance: float) -> None:
        self._cache = LoadCache(params)
        self.gamma = gamma
        self.theta = theta
        self.rebalance = rebalance

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        loads = [self._cache.load(e, snap.now) for e in candidates]
        loads.sort(key=self.order_key)
        for load in loads:
            if self.fits(load, req):
                return [load.view]
        return []

    def order_key(self, load: EndpointLoad) -> tuple[bool, float, str]:
        return (load.running_long >= self.rebalance > 0, -self.capacity_norm(load), str(load.view.id))

    def capacity_norm(self, load: EndpointLoad) -> float:
        g = self.gamma
        tokens = sum(s.context + g * s.remaining for s in load.running)
        scale = load.kv_capacity or load.seats * _TOKENS_PER_SEAT
        return math.hypot(load.n / load.seats, tokens / scale)

    def violations(self, load: EndpointLoad, req: SchedRequest) -> list[str]:
        """The constraints `req` would break on this endpoint: "seats", "atgt", "ttft", "prefill", "kv"."""
        if load.n == 0:
            return []
        if load.n >= load.seats:
            return ["seats"]
        now = load.now
        coef = load.coef
        g, theta = self.gamma, self.theta
        pred = load.predict(req)
        left = time_left(req, now)
        own = not req.best_effort and meets(load.idle_service(req), left)
        out: list[str] = []
        # (b) ATGT / ITL
        budgets: list[float] = []
        if own:
            if req.slo.itl_ms is not None:
                budgets.append(req.slo.itl_ms / 1000.0)
            if left[1] is not None and pred.output_tokens > 1:
                budgets.append((left[1] - pred.ttft_s) / (pred.output_tokens - 1.0))
        for s in load.running:
            r = s.req
            if r.best_effort:
                continue
            if r.itl_s is not None:
                budgets.append(r.itl_s)
            if r.e2e_deadline is not None and s.remaining > 0:
                per = (r.e2e_deadline - now - max(0.0, s.first_s)) / s.remaining
                if per > 0:  # already late: nothing to protect
                    budgets.append(per)
        if budgets:
            t_dec = min(budgets) / (1.0 + load.params.prefill_overhead)
            b = load.n + 1
            total = sum(s.context + g * s.remaining for s in load.running)
            total += req.prompt_tokens + g * pred.output_tokens
            if coef.k2 * total > theta * (t_dec - coef.c2 * b - coef.c3):
                out.append("atgt")
        # (c) TTFT
        if own and left[0] is not None and pred.ttft_s > left[0]:
            out.append("ttft")
        # (d) a prefill pauses every running decode
        saved = [x for x in (_saved(s, load) for s in load.running) if x is not None]
        if saved and coef.prefill_s(req.prompt_tokens) > theta * min(saved):
            out.append("prefill")
        # (e) KV over future iterations
        cap = load.kv_capacity
        if cap is not None and load.peak_kv((float(req.prompt_tokens), pred.output_tokens)) > cap:
            out.append("kv")
        return out

    def fits(self, load: EndpointLoad, req: SchedRequest) -> bool:
        return not self.violations(load, req)


def _saved(s: RunningState, load: EndpointLoad) -> float | None:
    """Time a running request has in hand against its deadline or ITL target (None: no target, or
    already late: it has nothing left to protect)."""
    r = s.req
    if r.best_effort:
        return None
    best: float | None = None
    if r.e2e_deadline is not None:
        v = (r.e2e_deadline - load.now) - s.finish_s
        if v >= 0:
            best = v
    if r.itl_s is not None and s.prefilled:
        v = s.produced * (r.itl_s - load.tpot_now)
        if v >= 0:
            best = v if best is None else min(best, v)
    return best


def _build(p: BestFitParams, ctx: BuildContext) -> BestFitFilter:
    return BestFitFilter(p.predict_params(), gamma=p.gamma, theta=p.theta, rebalance=p.rebalance_threshold)


SPEC = PluginSpec(
    PluginKind.FILTER,
    "best-fit",
    BestFitParams,
    _build,
    "Aladdin: most loaded endpoint where ATGT, TTFT, prefill-pause and KV constraints hold",
)
