"""MaaSO's overflow protection as a filter.

An endpoint is dropped when placing the request there would push a running request past its deadline
(its prefill pauses their decoding, its joining slows every later token), or when the request itself
would miss its deadlines there with worst-case throughput (every seat taken). A request that can meet
its deadlines nowhere is not held for that (unless `hold_infeasible`): it may go to any endpoint where it
harms no one, and admission decides what happens to such requests. Requests with nothing left to
protect (no targets, already late, best-effort) are not protected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from msgspec import Meta

from gateway.sched.harms import endangers
from gateway.sched.loads import LoadCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.targets import itl_ok, meets, time_left


class OverflowGuardParams(PredictionParams, frozen=True, kw_only=True):
    worst_case: bool = True  # the request's own completion at a full batch (else the batch it joins)
    margin: Annotated[float, Meta(gt=0.0, le=2.0)] = 1.0  # < 1 demands room to spare
    hold_infeasible: bool = False  # keep a request that meets its deadline nowhere queued
    # Protect a running request only while its time in hand is at least this share of its time left.
    on_track: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0


class OverflowGuardFilter:
    name = "overflow-guard"

    def __init__(self, params: OverflowGuardParams, loads: LoadCache | None = None) -> None:
        self.params = params
        self._cache = loads or LoadCache(params.predict_params())

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        p = self.params
        now = snap.now
        left = time_left(req, now)
        harmless: list[EndpointView] = []
        meeting: list[EndpointView] = []
        for e in candidates:
            load = self._cache.load(e, now)
            if endangers(load, req, margin=p.margin, on_track=p.on_track):
                continue
            harmless.append(e)
            if req.best_effort:
                continue
            pred = load.predict(req, worst_case=p.worst_case)
            if meets(pred, left, p.margin) and itl_ok(req, pred):
                meeting.append(e)
        if req.best_effort:
            return harmless
        if meeting or p.hold_infeasible:
            return meeting
        return harmless


SPEC = PluginSpec(
    PluginKind.FILTER,
    "overflow-guard",
    OverflowGuardParams,
    lambda p, ctx: OverflowGuardFilter(p, ctx.loads.get(p.predict_params())),
    "MaaSO: drop endpoints where the request or a running one would miss its deadline",
)
