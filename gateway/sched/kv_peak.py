"""The peak KV footprint of a set of requests over their remaining iterations (Aladdin's constraint
(e)), as `EndpointLoad.peak_kv` asks it."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Final


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


def _remaining(item: tuple[float, float]) -> float:
    return item[1]


class KvPeak:
    """`peak_kv` of a fixed set of items (a load's running requests) with one more item each time it is
    asked (`with_extra`: a request best fit tries there), without sorting the set again: the set is kept
    sorted by remaining tokens with its suffix sums of context and, per place, the largest of the terms
    from that place on. A new item goes where a stable sort of the items and it would put it (after the
    equal ones); the terms after it are those of the set alone, the sums before it are taken one by one
    from it as `peak_kv` takes them. So the answer is `peak_kv`'s, bit for bit
    (`tests/unit/test_kv_peak.py`)."""

    __slots__ = ("_ctx", "_h", "_j", "_m", "_rems", "_suffix", "_tail")

    def __init__(self, items: Sequence[tuple[float, float]], h: float, j: float) -> None:
        # (made once per load best fit tries: `max` spelled out as comparisons, the same results, the
        # first of equal values kept as `max` keeps it)
        ordered = sorted(items, key=_remaining)
        m = self._m = len(ordered)
        self._h, self._j = h, j
        ctx = self._ctx = [c for c, _ in ordered]
        rems = self._rems = [r for _, r in ordered]
        suffix = self._suffix = [0.0] * (m + 1)
        # tail[q]: the largest of `peak_kv`'s terms of the items from place q on (-inf: none)
        tail = self._tail = [-math.inf] * (m + 1)
        s = 0.0
        best = -math.inf
        for k in range(m - 1, -1, -1):
            s = suffix[k] = s + ctx[k]
            t = rems[k] - 1.0
            alive = m - k
            term = h * (s + alive * (t if t > 0.0 else 0.0)) + alive * j
            if term > best:  # noqa: PLR1730 (max() is a call per running request)
                best = term
            tail[k] = best

    def with_extra(self, context: float, remaining: float) -> float:
        """`peak_kv(items + [(context, remaining)], h, j)`."""
        h, j = self._h, self._j
        q = bisect.bisect_right(self._rems, remaining)
        m = self._m + 1
        s = self._suffix[q] + context
        alive = m - q
        t = remaining - 1.0
        term = h * (s + alive * (t if t > 0.0 else 0.0)) + alive * j
        best = self._tail[q]
        if term > best:  # noqa: PLR1730 (max() is a call per running request)
            best = term
        ctx, rems = self._ctx, self._rems
        for k in range(q - 1, -1, -1):
            s += ctx[k]
            alive = m - k
            t = rems[k] - 1.0
            term = h * (s + alive * (t if t > 0.0 else 0.0)) + alive * j
            if term > best:  # noqa: PLR1730 (max() is a call per running request)
                best = term
        first = h * s + m * j
        return best if best > first else first


#: The share by which `surely_under`'s bound must clear the capacity: far more than the rounding of
#: either sum (each of a few hundred non-negative terms at most: a relative error under 1e-13).
_CLEAR: Final = 1e-9


def spans(items: Iterable[tuple[float, float]]) -> float:
    """Σ max(0, context + max(0, remaining − 1)) over `items`: the most each can hold at its own last
    iteration, a set's part of `surely_under`'s bound (NaN stays NaN)."""
    total = 0.0
    for context, remaining in items:
        t = remaining - 1.0
        v = context + (t if t > 0.0 else 0.0)
        total += 0.0 if v < 0.0 else v  # (a NaN is added: the bound is then never clear)
    return total


def surely_under(kept: float, m: int, extra: tuple[float, float], *, h: float, j: float, cap: float) -> bool:
    """Whether `peak_kv(items + [extra], h, j) <= cap` surely holds, for `m` items with `spans(items)`
    = `kept`: each of `peak_kv`'s terms, h·Σ_{alive}(context + t) + alive·j, is at most h·Σ_{all}
    max(0, context + max(0, remaining − 1)) + (m + 1)·j when h and j are not negative (a request alive
    at t has remaining − 1 >= t), so a bound clear of `cap` by more than the rounding of either says the
    peak is under it. False: unknown (ask `peak_kv`)."""
    if not (h >= 0.0 and j >= 0.0):
        return False
    bound = h * (kept + spans((extra,))) + (m + 1) * j
    return bound * (1.0 + _CLEAR) < cap
