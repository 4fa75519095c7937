"""Least recently used: the instance idle longest goes first (Ray Serve's model multiplexing baseline)."""

from __future__ import annotations

from gateway.sched.plugins.eviction.interface import EvictionCandidate, EvictionContext
from gateway.sched.registry import NoParams, PluginKind, PluginSpec


class LruEvictor:
    name = "lru"

    def score(self, cand: EvictionCandidate, ctx: EvictionContext) -> float:
        return max(0.0, ctx.now - cand.last_used)


SPEC = PluginSpec(
    PluginKind.EVICTOR, "lru", NoParams, lambda p, ctx: LruEvictor(), "evict the least recently used"
)
