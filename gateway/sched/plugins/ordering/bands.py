"""Strict priority bands by SLO class, least slack first inside a band.

A class's band comes from its definition in the policy (`[[slo.classes]] band = N`, lower first) unless
this plugin's `bands` table overrides it; a class named in neither is in the lowest band. A request
admission demoted to best-effort goes one band below the lowest. Inside a band, slack orders as in the
`slack` ordering (time left minus the predicted service time alone on the best endpoint); requests
without targets come last in their band, in arrival order. With `within = "arrival"` a band is served in
arrival order instead (Chiron's FCFS inside a request group): a key costs no prediction, which matters
when thousands of batch requests wait, and the keys do not move (`stable_keys`), so the queue asks each
request's key once instead of each time it is served.

The band is also the engine priority sent to endpoints with priority scheduling.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.core.slo import SloPolicy
from gateway.sched.interfaces import OrderKey
from gateway.sched.plugins.ordering.slack import KeyCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.registry import BuildContext, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


class BandsParams(PredictionParams, frozen=True, kw_only=True):
    # class -> band, overriding the class definitions
    bands: dict[str, Annotated[int, msgspec.Meta(ge=0, le=1000)]] = msgspec.field(default_factory=dict)
    within: Literal["slack", "arrival"] = "slack"  # the order inside a band


class PriorityBandsOrdering:
    name = "priority-bands"

    def __init__(self, params: BandsParams, slo: SloPolicy) -> None:
        self.params = params
        self._keys = KeyCache(params.predict_params(), ttl_s=0.02)
        bands = {name: c.band for name, c in slo.classes.items()}
        bands.update(params.bands)
        self._bands = bands
        self._lowest = max(bands.values(), default=0)
        # Band and arrival are the request's own; slack moves with time and the fleet.
        self.stable_keys = params.within == "arrival"

    def band(self, req: SchedRequest) -> int:
        if req.best_effort:
            return self._lowest + 1
        return self._bands.get(req.slo.slo_class, self._lowest)

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        if self.params.within == "arrival":
            return (float(self.band(req)), req.arrival)
        _, slack = self._keys.assess(req, snap)
        return (float(self.band(req)), slack)

    def engine_priority(self, req: SchedRequest, snap: FleetSnapshot) -> int | None:
        return self.band(req)


def _build(p: BandsParams, ctx: BuildContext) -> PriorityBandsOrdering:
    unknown = sorted(set(p.bands) - set(ctx.slo.classes))
    if unknown:
        raise ValueError(f"bands names classes the policy does not define: {', '.join(unknown)}")
    return PriorityBandsOrdering(p, ctx.slo)


SPEC = PluginSpec(
    PluginKind.ORDERING,
    "priority-bands",
    BandsParams,
    _build,
    "strict bands by SLO class, least slack first inside a band",
)
