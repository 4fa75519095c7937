"""MaaSO's distributor as a filter: each request goes to the sub-cluster whose instance configuration
suits its deadline, and spills to the other one when its own cannot meet the deadline.

- A request's **deadline factor** is its time to the end-to-end deadline over ``decode length ×
  t_slot``: the decode length is its `max_tokens` (what a client sets a deadline against; else the
  predicted output), `t_slot` MaaSO's time slot: the single-token decode time of a plain instance
  serving (`t_slot_ms`, else the slowest decode iteration among the model's endpoints' performance models
  with a full batch, min(cap, max batch), at the request's context). A factor of 1 is then what a plain
  instance gives under load; small batches give less, large ones more.
  Factors below `strict_below` are *strict*, the rest *relaxed*; requests without a deadline are
  relaxed.
- An endpoint's **sub-cluster** is its engine's max batch (`EndpointView.max_batch`: gateway.toml
  `max_batch`, or the instance configuration of an agent-started engine): at most `strict_max_batch`
  is *strict* (small batches decode each request fast), larger or unknown is *relaxed*. The same two
  parameters split the mix in MaaSO's placer (`gateway.sched.heterogeneous.Placer`), so what it places
  for the strict requests is where they are sent. A model whose endpoints all fall on one side is not
  split.
- `spill` (one mode, or a table by sub-cluster): "when-late" (default) gives the preference tiers
  (`TieredFilter`) own endpoints where the request is predicted to meet its deadline, then the other
  sub-cluster's where it would, then the rest of its own (it meets it nowhere: it stays home, where the
  overflow guard after this filter still keeps it from pushing others past theirs), and, when its
  sub-cluster is **starved** (its share of the model's seats, min(cap, max batch) per endpoint, below
  `starved_below` x its share of the requests seen, decayed over `window_s`), then the rest of the
  other's (its own cannot take it: the filters after this one left none of its own, e.g. the guard
  holds it from every own endpoint; the guard judges these too). Without that last tier a sub-cluster
  left with too few instances for its share (an autoscaled fleet that placed one small-batch instance
  while a burst made the placer give the strict requests up) held every request of its side in the
  queue behind each other, all late (bench maaso, scaled row, cv 4 seed 0: 0.389 attainment; with it
  0.957). Not for a sub-cluster that has its share: there a spilled request takes a seat a queued
  request of the other side needed (unconditional, cv 4 seed 2 of the same row fell 0.866 -> 0.661,
  and the static placement's 0.914 -> 0.883); "when-full": its
  own, the others only when none of its own has a free seat; "never": its own only (admission judges
  it on them, `ScopedFilter`).
- Put `overflow-guard` after it (MaaSO's overflow protection) and a shortest-queue picker
  (`least-outstanding`): among the instances that can meet its deadline, the shortest queue.

The filter also records each model's SLO mix (deadline factors and decode lengths of the requests it
sees, decayed over `window_s`) for the placer: `mix(model, now)`; and shows the split per model
(`GroupingFilter`: each sub-cluster's share of the requests seen, decayed over the same `window_s`
as the mix, and its endpoints).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Final, Literal

from msgspec import Meta

from gateway.core.types import EndpointId, ModelName
from gateway.sched.heterogeneous import RELAXED, STRICT, SubCluster, TrafficMix
from gateway.sched.loads import LoadCache
from gateway.sched.mix_window import MixWindow
from gateway.sched.perf import default_prior
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.registry import BuildContext, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.running import deadlines, output_estimate, remaining_max_tokens
from gateway.sched.seen import SeenRequests
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.targets import meets, time_left

SpillMode = Literal["when-late", "when-full", "never"]
_PRIOR: Final = default_prior()


class SubClusterParams(PredictionParams, frozen=True, kw_only=True):
    strict_below: Annotated[float, Meta(gt=0.0)] = 1.1  # deadline factors below this are strict
    strict_max_batch: Annotated[int, Meta(ge=1)] = 8  # endpoints of max batch at most this are strict
    t_slot_ms: Annotated[float, Meta(gt=0.0)] | None = None  # None: from the endpoints' models
    spill: SpillMode | dict[str, SpillMode] = "when-late"
    margin: Annotated[float, Meta(gt=0.0, le=2.0)] = 1.0  # < 1 demands room to spare to "meet"
    window_s: Annotated[float, Meta(gt=0.0)] = 60.0  # time constant of the recorded SLO mix
    # A sub-cluster whose share of the seats is below this x its share of the requests is starved: its
    # requests that it cannot take spill to the other's endpoints (where the guard lets them harm no one).
    starved_below: Annotated[float, Meta(ge=0.0)] = 0.5


class SubClusterFilter:
    name = "sub-cluster"

    def __init__(self, params: SubClusterParams, loads: LoadCache | None = None) -> None:
        self.params = params
        self._cache = loads or LoadCache(params.predict_params())
        spill = params.spill
        by_sub = spill if isinstance(spill, Mapping) else {}
        default: SpillMode = "when-late" if isinstance(spill, Mapping) else spill
        self.spill: dict[SubCluster, SpillMode] = {s: by_sub.get(s, default) for s in (STRICT, RELAXED)}
        self._mix: dict[ModelName, MixWindow] = {}
        self._seen = SeenRequests()  # the requests counted in the mix, each once
        self._split: dict[ModelName, dict[SubCluster, list[EndpointId]]] = {}
        # Per model: when its counts were last decayed, and the decayed requests per sub-cluster.
        self._counts: dict[ModelName, tuple[float, dict[SubCluster, float]]] = {}

    # ----------------------------------------------------------------- classification
    def sub_cluster_of(self, e: EndpointView) -> SubCluster:
        mb = e.max_batch
        return STRICT if mb is not None and mb <= self.params.strict_max_batch else RELAXED

    def decode_tokens(self, req: SchedRequest) -> float:
        cap = remaining_max_tokens(req)
        return float(cap) if cap is not None else output_estimate(req)[0]

    def t_slot_s(self, req: SchedRequest, serving: Sequence[EndpointView]) -> float:
        if self.params.t_slot_ms is not None:
            return self.params.t_slot_ms / 1000.0
        ctx = req.prompt_tokens + 0.5 * self.decode_tokens(req)
        if not serving:
            return _PRIOR.decode_iter_s(1.0, ctx)
        return max(
            (e.perf or _PRIOR).decode_iter_s(float(min(e.cap, e.max_batch or e.cap)), ctx) for e in serving
        )

    def factor(self, req: SchedRequest, serving: Sequence[EndpointView]) -> float | None:
        """The request's deadline factor (None: it has no end-to-end deadline)."""
        _, e2e = deadlines(req)
        if e2e is None:
            return None
        return (e2e - req.arrival) / (self.decode_tokens(req) * self.t_slot_s(req, serving))

    def request_sub_cluster(self, req: SchedRequest, serving: Sequence[EndpointView]) -> SubCluster:
        f = self.factor(req, serving)
        return STRICT if f is not None and f < self.params.strict_below else RELAXED

    # ----------------------------------------------------------------- the filter
    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        return next((t for t in self.tiers(req, candidates, snap) if t), [])

    def tiers(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[Sequence[EndpointView]]:
        if not candidates:
            return []
        serving = snap.serving(req.model)
        own_sub = self._observe(req, serving, snap.now)
        if own_sub is None:
            return [candidates]
        own = [e for e in candidates if self.sub_cluster_of(e) == own_sub]
        others = [e for e in candidates if self.sub_cluster_of(e) != own_sub]
        spill = self.spill[own_sub]
        if spill == "never":
            return [own]
        if spill == "when-full":
            return [own or others]
        left = time_left(req, snap.now)
        if left[1] is None and left[0] is None:
            return [own, others]
        p = self.params
        own_ok = [e for e in own if meets(self._cache.load(e, snap.now).predict(req), left, p.margin)]
        others_ok = [e for e in others if meets(self._cache.load(e, snap.now).predict(req), left, p.margin)]
        rest = [e for e in own if not any(e is o for o in own_ok)]
        if not self.starved(req.model, own_sub, serving):
            return [own_ok, others_ok, rest]
        others_rest = [e for e in others if not any(e is o for o in others_ok)]
        return [own_ok, others_ok, rest, others_rest]

    def starved(self, model: ModelName, sub: SubCluster, serving: Sequence[EndpointView]) -> bool:
        """Whether `sub`'s share of the model's seats is below `starved_below` x its share of the
        requests seen (decayed over `window_s`)."""
        counts = self._counts.get(model)
        if counts is None:
            return False
        total = sum(counts[1].values())
        seats = {STRICT: 0, RELAXED: 0}
        for e in serving:
            seats[self.sub_cluster_of(e)] += min(e.cap, e.max_batch or e.cap)
        all_seats = seats[STRICT] + seats[RELAXED]
        if total <= 0 or all_seats <= 0:
            return False
        return seats[sub] / all_seats < self.params.starved_below * counts[1][sub] / total

    def scope(
        self, req: SchedRequest, serving: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        """Every serving endpoint, but the own sub-cluster's only for requests that never spill."""
        own_sub = self._observe(req, serving, snap.now)
        if own_sub is None or self.spill[own_sub] != "never":
            return serving
        return [e for e in serving if self.sub_cluster_of(e) == own_sub]

    def _observe(self, req: SchedRequest, serving: Sequence[EndpointView], now: float) -> SubCluster | None:
        """The request's sub-cluster, None when the model's endpoints are not split; counts the request
        in the model's mix the first time it is seen."""
        split: dict[SubCluster, list[EndpointId]] = {STRICT: [], RELAXED: []}
        for e in serving:
            split[self.sub_cluster_of(e)].append(e.id)
        self._split[req.model] = split
        sub = self.request_sub_cluster(req, serving)
        if self._seen.first(req.id):
            f = self.factor(req, serving)
            if f is not None and math.isfinite(f):
                window = self._mix.get(req.model)
                if window is None:
                    window = self._mix[req.model] = MixWindow(self.params.window_s)
                window.observe(now, f, self.decode_tokens(req))
            at, counts = self._counts.get(req.model, (now, {STRICT: 0.0, RELAXED: 0.0}))
            if now > at:  # shares are ratios: decaying both sides at each addition is enough
                f = math.exp(-(now - at) / self.params.window_s)
                counts = {s: c * f for s, c in counts.items()}
            counts[sub] += 1.0
            self._counts[req.model] = (max(now, at), counts)
        if not split[STRICT] or not split[RELAXED]:
            return None
        return sub

    # ----------------------------------------------------------------- for the placer and the admin view
    def mix(self, model: ModelName, now: float, *, t_slot_s: float, cv: float = 1.0) -> TrafficMix:
        """The model's recent SLO mix (empty before any request with a deadline)."""
        window = self._mix.get(model)
        if window is None:
            return TrafficMix(rate=0.0, t_slot_s=t_slot_s, kinds=(), cv=cv)
        return window.mix(now, t_slot_s, cv)

    def groups(self, model: ModelName) -> dict[str, tuple[float | None, list[EndpointId]]]:
        split = self._split.get(model, {STRICT: [], RELAXED: []})
        counts = self._counts.get(model, (0.0, {STRICT: 0.0, RELAXED: 0.0}))[1]
        total = sum(counts.values())
        return {
            s: (counts[s] / total if total else None, sorted(split[s], key=str)) for s in (STRICT, RELAXED)
        }


def _build(p: SubClusterParams, ctx: BuildContext) -> SubClusterFilter:
    if isinstance(p.spill, dict):
        for name in p.spill:
            if name not in (STRICT, RELAXED):
                raise ValueError(f"spill names {name!r}: the sub-clusters are strict and relaxed")
    return SubClusterFilter(p, ctx.loads.get(p.predict_params()))


SPEC = PluginSpec(
    PluginKind.FILTER,
    "sub-cluster",
    SubClusterParams,
    _build,
    "MaaSO: strict-deadline requests to small-batch instances, relaxed ones to large; spill when late",
)
