"""Prefix holders first, by the SLO model's own numbers: a filter that keeps the endpoints holding part
of the request's prompt in their prefix cache (`SchedRequest.cached`) whose predicted first token
(`EndpointLoad.predict`: the wait there, then the prefill of the tokens not cached there) comes before
the earliest predicted first token on any endpoint holding none of it; otherwise it keeps every
candidate. So a request stays with its prefix exactly while waiting there costs less than the prefill
it saves, with no affinity threshold; the rest of the pipeline (scorers, picker) chooses among what is
kept. A request with nothing cached anywhere passes through untouched (no prediction is made).

For pipelines whose choice is not itself a prediction (a load scorer under max-score); `best-fit`
and `cato-slack` already weigh cached prefixes in their own choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.sched.loads import LoadCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot


class PrefixHoldersParams(PredictionParams, frozen=True, kw_only=True):
    pass


class PrefixHoldersFilter:
    name = "prefix-holders"

    def __init__(self, params: PrefixHoldersParams, loads: LoadCache | None = None) -> None:
        self.params = params
        self._cache = loads or LoadCache(params.predict_params())

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        cached = req.cached
        if not cached or len(candidates) < 2:
            return candidates
        now = snap.now
        holders: list[tuple[float, EndpointView]] = []
        others = math.inf
        for e in candidates:
            ttft = self._cache.load(e, now).predict(req).ttft_s
            if cached.get_tokens(e.id) > 0:
                holders.append((ttft, e))
            else:
                others = min(others, ttft)
        kept = [e for ttft, e in holders if ttft < others]
        return kept or candidates


SPEC = PluginSpec(
    PluginKind.FILTER,
    "prefix-holders",
    PrefixHoldersParams,
    lambda p, ctx: PrefixHoldersFilter(p, ctx.loads.get(p.predict_params())),
    "the endpoints holding the request's prefix whose predicted first token beats every other's",
)
