"""Prefix holders first, by the SLO model's own numbers: a filter that keeps the endpoints holding part
of the request's prompt in their prefix cache (`SchedRequest.cached`) whose predicted first token
(`EndpointLoad.predict`: the wait there, then the prefill of the tokens not cached there), less the
prefill a miss would make the fleet redo (`miss_charge`), comes before that of every endpoint holding
less of the prompt and after none holding more (`holders_kept`); otherwise it keeps every candidate. So
a request stays with its prefix exactly while waiting there costs less than the prefill it saves, with
no affinity threshold; the rest of the pipeline (scorers, picker) chooses among what is kept. A holder
with every seat under its cap taken is weighed too (its predicted first token counts the wait for its
next seat): when it beats every candidate, nothing is kept and the request waits for it in the queue
(give the policy a `lookahead` so the requests behind it are placed meanwhile). A request with nothing
cached anywhere passes through untouched (no prediction is made).

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

from gateway.core.types import EndpointHealth
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
        if not cached or not candidates:
            return candidates
        now = snap.now
        charge = self.params.miss_charge
        # (cached tokens, charged first token) per candidate; charged: the predicted first token less the
        # prefill the fleet would redo elsewhere (miss_charge x k1 x cached tokens)
        scored: list[tuple[int, float]] = []
        for e in candidates:
            load = self._cache.load(e, now)
            got = cached.get_tokens(e.id)
            scored.append((got, load.predict(req).ttft_s - charge * load.coef.k1 * got))
        if self._wait_for_holder(req, candidates, snap, min(t for _, t in scored)):
            return ()
        if len(candidates) < 2:
            return candidates
        keep = holders_kept(scored)
        if not keep:
            return candidates
        return [e for e, k in zip(candidates, keep, strict=True) if k]

    def _wait_for_holder(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot, best: float
    ) -> bool:
        """Whether a holder with no free seat (not a candidate: every seat under its cap taken) is
        predicted to give the request its first token, charged like the candidates, sooner than the best
        candidate: its seat is then worth waiting for (the predicted first token counts the wait until
        its next request finishes) rather than redoing the cached prefill elsewhere."""
        ids = {e.id for e in candidates}
        charge = self.params.miss_charge
        model, ready = req.model, EndpointHealth.READY
        for eid, got in req.cached.items():
            if eid in ids:
                continue
            e = snap.get(eid)
            if e is None or e.inflight < e.cap or e.health is not ready or model not in e.models:
                continue  # gone, or left out by an earlier filter rather than for want of a seat
            load = self._cache.load(e, snap.now)
            if load.predict(req).ttft_s - charge * load.coef.k1 * got < best:
                return True
        return False

    def filter_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]:
        """The columnar form (so a profile with this filter still places over columns at fleet scale):
        nothing cached anywhere, the mask as it is (no Python step per endpoint); else `filter` over the
        candidates, which predicts only then."""
        if not req.cached:
            return candidates
        idx = candidates.nonzero()[0]
        if len(idx) == 0:
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


def holders_kept(scored: Sequence[tuple[int, float]]) -> list[bool] | None:
    """Which candidates `(cached tokens, charged first token)` to keep: each holder whose charged first
    token beats every candidate holding less of the prompt (sending the request there redoes the
    difference) and is not beaten by any holding more (a longer prefix that is also sooner); None when
    no holder is kept. Placing a request on an endpoint holding less than the longest match costs the
    fleet the prefill of the difference, so a shorter holder is kept only while it is sooner by more
    than that difference's charge."""
    levels = sorted({c for c, _ in scored})
    if len(levels) < 2 and levels[0] == 0:
        return None
    best: dict[int, float] = {}  # the earliest charged first token per cached level
    for c, t in scored:
        if t < best.get(c, math.inf):
            best[c] = t
    below: dict[int, float] = {}  # the earliest among the levels under each
    run = math.inf
    for c in levels:
        below[c] = run
        run = min(run, best[c])
    above: dict[int, float] = {}  # the earliest among the levels over each
    run = math.inf
    for c in reversed(levels):
        above[c] = run
        run = min(run, best[c])
    keep = [c > 0 and t < below[c] and t <= above[c] for c, t in scored]
    return keep if any(keep) else None


SPEC = PluginSpec(
    PluginKind.FILTER,
    "prefix-holders",
    PrefixHoldersParams,
    lambda p, ctx: PrefixHoldersFilter(p, ctx.loads.get(p.predict_params())),
    "the endpoints holding the request's prefix whose predicted first token beats every other's",
)
