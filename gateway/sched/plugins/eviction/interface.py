"""The `Evictor` extension point and what it decides on.

An evictor only ranks. Which instances may be ranked at all (idle ones, past the churn guard, not
pinned), how many go and whether their going frees enough memory is the runner's business
(`gateway.sched.plugins.eviction.victims`), so no plugin can evict a busy, pinned or just-loaded
instance, whatever it scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gateway.core.types import ModelName


@dataclass(frozen=True, slots=True)
class EvictionCandidate:
    """One resident instance that the runner found evictable now, with what the evictors weigh."""

    instance: str
    model: ModelName
    last_used: float  # clock time of its last dispatch (its ready time when never used)
    loaded_at: float  # clock time it became ready
    load_s: (
        float  # measured load time (the cost of loading it again); the registry's expectation until measured
    )
    frees_bytes: int  # per device it holds
    # Expected position (0-based) of the model's next request in the look-ahead window: its first queued
    # request's, or past the queued ones as predicted from its share of recent requests; None: unknown.
    first_pending: float | None
    # Output tokens expected of the model's requests (its recent traffic); None: nothing seen yet.
    expected_output_tokens: float | None
    # `first_pending` is a queued request's place (not a prediction from the recent shares).
    queued: bool = False


@dataclass(frozen=True, slots=True)
class EvictionContext:
    now: float
    window: int  # length of the look-ahead window that `first_pending` indexes (≥ 1)


@runtime_checkable
class Evictor(Protocol):
    """Eviction score of one candidate: the higher, the sooner it goes.

    Must return a finite float (the runner treats anything else as a fault and ranks the candidate
    last). Must not mutate anything. Ties are broken by the runner (oldest `last_used`, then id).
    """

    name: str

    def score(self, cand: EvictionCandidate, ctx: EvictionContext) -> float: ...


def checked_score(evictor: Evictor, cand: EvictionCandidate, ctx: EvictionContext) -> float:
    """The runner's side of the contract: a score that is not a finite float ranks last."""
    s = evictor.score(cand, ctx)
    if not isinstance(s, (int, float)) or not math.isfinite(s):
        return -math.inf
    return float(s)
