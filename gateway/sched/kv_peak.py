"""The peak KV footprint of a set of requests over their remaining iterations (Aladdin's constraint
(e)), as `EndpointLoad.peak_kv` asks it."""

from __future__ import annotations

from collections.abc import Sequence


def peak_kv(items: Sequence[tuple[float, float]], h: float, j: float) -> float:
    """max over t >= 0 of Σ_{i: remaining_i > t} (h·(context_i + t) + j). The sum only drops when a
    request ends, so the maximum is at t = 0 or just before one ends (t = remaining_k − 1)."""
    if not items:
        return 0.0
    ordered = sorted(items, key=lambda it: it[1])
    m = len(ordered)
    suffix_ctx = [0.0] * (m + 1)
    for i in range(m - 1, -1, -1):
        suffix_ctx[i] = suffix_ctx[i + 1] + ordered[i][0]
    best = h * suffix_ctx[0] + m * j
    for k, (_, rem) in enumerate(ordered):
        t = max(0.0, rem - 1.0)
        alive = m - k
        best = max(best, h * (suffix_ctx[k] + alive * t) + alive * j)
    return best
