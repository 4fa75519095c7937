"""CACE: context-aware eviction (ALGORITHMS.md §3).

score = w_idle · (1 − 1/(1 + ln(1 + idle_s)))     idle longer           → more evictable
      + w_reload · 1/(1 + load_s/100)            slow to load again    → kept
      + w_demand · i/w                           needed soon in queue  → kept (1 when not in the window)
      + w_crit · o/scale                         long outputs (reasoning, batch) → more evictable;
                                                 short, TTFT-critical ones (completion) are kept

The paper prints the recency term as 1/(1 + ln t) with t the last-used time, which grows for recently
used models and so would evict them first, against its own text; here the term grows with idle time.
Each term lies in [0, 1] except criticality, which the scale puts near 1 for a typical long output.
"""

from __future__ import annotations

import math

import msgspec

from gateway.sched.plugins.eviction.interface import EvictionCandidate, EvictionContext
from gateway.sched.registry import PluginKind, PluginSpec


class CaceParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    idle_weight: float = 1.0
    reload_weight: float = 1.0
    demand_weight: float = 1.0
    criticality_weight: float = 1.0
    # Output tokens that count as 1.0 in the criticality term.
    criticality_scale_tokens: float = 1000.0

    def __post_init__(self) -> None:
        for name in ("idle_weight", "reload_weight", "demand_weight", "criticality_weight"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number ≥ 0 (got {v})")
        if not (math.isfinite(self.criticality_scale_tokens) and self.criticality_scale_tokens > 0):
            raise ValueError("criticality_scale_tokens must be > 0")


def idle_term(idle_s: float) -> float:
    return 1.0 - 1.0 / (1.0 + math.log1p(max(0.0, idle_s)))


def reload_term(load_s: float) -> float:
    return 1.0 / (1.0 + max(0.0, load_s) / 100.0)


def demand_term(first_pending: float | None, window: int) -> float:
    if first_pending is None or window <= 0:
        return 1.0
    return min(1.0, max(0.0, first_pending) / window)


def criticality_term(expected_output_tokens: float | None, scale_tokens: float) -> float:
    if expected_output_tokens is None:
        return 0.0
    return max(0.0, expected_output_tokens) / scale_tokens


class CaceEvictor:
    name = "cace"

    def __init__(self, params: CaceParams) -> None:
        self._p = params

    def score(self, cand: EvictionCandidate, ctx: EvictionContext) -> float:
        p = self._p
        return (
            p.idle_weight * idle_term(ctx.now - cand.last_used)
            + p.reload_weight * reload_term(cand.load_s)
            + p.demand_weight * demand_term(cand.first_pending, ctx.window)
            + p.criticality_weight * criticality_term(cand.expected_output_tokens, p.criticality_scale_tokens)
        )


SPEC = PluginSpec(
    PluginKind.EVICTOR,
    "cace",
    CaceParams,
    lambda p, ctx: CaceEvictor(p),
    "context-aware: idle time, reload cost, queued demand, output length",
)
