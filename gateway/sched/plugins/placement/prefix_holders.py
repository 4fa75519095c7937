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
from typing import Annotated

import numpy as np
import numpy.typing as npt
from msgspec import Meta

from gateway.sched.loads import LoadCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot


class PrefixHoldersParams(PredictionParams, frozen=True, kw_only=True):
    # A request sent past the endpoints holding its prefix redoes that prefill: engine time the whole
    # fleet pays (every request queued behind it waits for it), not only this request's first token. A
    # holder is kept while its predicted first token, less this share of the prefill its cache saves
    # (k1 x cached tokens), beats every other endpoint's; 0 weighs the request's own first token alone.
    miss_charge: Annotated[float, Meta(ge=0.0, le=10.0)] = 1.0


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
        charge = self.params.miss_charge
        for e in candidates:
            load = self._cache.load(e, now)
            ttft = load.predict(req).ttft_s
            got = cached.get_tokens(e.id)
            if got > 0:
                holders.append((ttft - charge * load.coef.k1 * got, e))
            else:
                others = min(others, ttft)
        kept = [e for ttft, e in holders if ttft < others]
        return kept or candidates

    def filter_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]:
        """The columnar form (so a profile with this filter still places over columns at fleet scale):
        nothing cached anywhere, the mask as it is (no Python step per endpoint); else `filter` over the
        candidates, which predicts only then."""
        if not req.cached:
            return candidates
        idx = np.flatnonzero(candidates)
        if len(idx) < 2:
            return candidates
        views = [cols.endpoints[i] for i in idx]
        kept = self.filter(req, views, snap)
        if len(kept) == len(views):
            return candidates
        keep = {id(e) for e in kept}
        out = np.zeros_like(candidates)
        for i, e in zip(idx, views, strict=True):
            if id(e) in keep:
                out[i] = True
        return out


SPEC = PluginSpec(
    PluginKind.FILTER,
    "prefix-holders",
    PrefixHoldersParams,
    lambda p, ctx: PrefixHoldersFilter(p, ctx.loads.get(p.predict_params())),
    "the endpoints holding the request's prefix whose predicted first token beats every other's",
)
