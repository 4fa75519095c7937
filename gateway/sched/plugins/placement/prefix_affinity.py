"""Prefix affinity: the cache-aware routers' rule, as a scorer (a baseline to compare berth's SLO
model with; berth's own presets weigh cached prefixes inside their latency predictions instead).

vllm-router's and sglang-router's `cache_aware` policies send a request to the endpoint holding the
longest share of its prompt when that share is at least `cache_threshold` and the fleet is balanced,
and to the least loaded endpoint otherwise; the fleet is imbalanced when the most and least loaded
endpoints differ by more than `balance_abs_threshold` requests *and* by more than
`balance_rel_threshold` times. The score is the share of the prompt cached on the endpoint
(`SchedRequest.cached`) when that rule would follow the prefix, else 0: pair it with a load scorer of a
smaller weight (least-outstanding) under max-score, and the load scorer decides whenever the prefix
does not. Load is outstanding requests (gateway in flight + engine waiting).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec
from msgspec import Meta

from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot


class PrefixAffinityParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    # the least share of the prompt cached on an endpoint for the prefix to decide (vllm-router: 0.3)
    cache_threshold: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.3
    # imbalance: max - min load above this many requests (vllm-router: 64) ...
    balance_abs_threshold: Annotated[int, Meta(ge=0)] = 64
    # ... and max load above this many times min load (vllm-router: 1.5)
    balance_rel_threshold: Annotated[float, Meta(ge=1.0)] = 1.5


class PrefixAffinityScorer:
    name = "prefix-affinity"

    def __init__(self, params: PrefixAffinityParams) -> None:
        self.params = params

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> list[float]:
        cached = req.cached
        if not cached or not candidates:
            return [0.0] * len(candidates)
        p = self.params
        loads = [e.inflight + (e.engine_waiting or 0.0) for e in candidates]
        hi, lo = max(loads), min(loads)
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            return [0.0] * len(candidates)  # imbalanced: the load scorer decides
        prompt = max(1, req.prompt_tokens)
        shares = [min(1.0, cached.get_tokens(e.id) / prompt) for e in candidates]
        if max(shares) < p.cache_threshold:
            return [0.0] * len(candidates)
        return shares


SPEC = PluginSpec(
    PluginKind.SCORER,
    "prefix-affinity",
    PrefixAffinityParams,
    lambda p, ctx: PrefixAffinityScorer(p),
    "the cache-aware routers' rule: share of the prompt cached there, unless the fleet is imbalanced",
)
