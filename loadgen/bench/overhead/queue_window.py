"""The standing-queue phase's window read from berth's admin documents: the scheduler's calls between two
readings of `GET /admin/sched-decisions` (per kind of call, the calls over `DECISION_LIMIT_MS` one by one
with their CPU time), which of the late lag samples waited on a slow call, and the garbage collections
between two readings of the loop-lag document's `gc` part (`overhead_queue` takes them and reports them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

from loadgen.bench.overhead.overhead_lag import LagReading

#: No scheduler call over this long (the scale issue's figure).
DECISION_LIMIT_MS: Final = 5.0
#: A lag sample this late (ms) is looked up among the slow scheduler calls (`late_lag`).
LATE_MS: Final = 5.0
#: The key of the figures over every kind of call in `Measurement.decisions`.
ALL: Final = "all"
#: The key of the garbage collector's figures in `Measurement.decisions` (`gc_window`).
GC: Final = "gc"
#: The key of the calls over `DECISION_LIMIT_MS` one by one in `Measurement.decisions` (`over_limit`).
OVER: Final = "over_limit_calls"
#: ... and their CPU time (ms; the daemon's thread, while the call ran), under the same keys.
OVER_CPU: Final = "over_limit_cpu"


def _bound_ms(bounds_s: Sequence[float], counts: Sequence[int], q: float) -> float:
    """The bucket bound (ms) at or under which a share `q` of the window's calls fell (inf: above the
    last bound); `counts` are the window's cumulative counts per bound, the total last."""
    total = counts[-1]
    for bound, n in zip(bounds_s, counts, strict=False):
        if n >= q * total:
            return bound * 1000.0
    return math.inf


def decision_window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """berth's scheduler calls between two readings of `GET /admin/sched-decisions` (`after` with the
    slow calls numbered above `before`'s `slow_taken`): per kind of call that was made, and over all
    (`ALL`), the calls, the bucket bounds of their p50 and p99, the calls over `DECISION_LIMIT_MS`, and
    the longest (ms: exact when a slow call was kept, else the highest bound reached)."""
    bounds: list[float] = after["bounds_s"]
    at_limit = bounds.index(DECISION_LIMIT_MS / 1000.0)
    slow: dict[str, float] = {}
    for _, call, seconds, *_ in after["slow"]:
        slow[call] = max(slow.get(call, 0.0), seconds * 1000.0)
    out: dict[str, dict[str, float]] = {}
    every = [0] * (len(bounds) + 1)
    for name, now in after["calls"].items():
        then = before["calls"][name]
        counts = [a - b for a, b in zip(now["le"], then["le"], strict=True)]
        if counts[-1] <= 0:
            continue
        every = [a + b for a, b in zip(every, counts, strict=True)]
        out[name] = _figures(bounds, counts, at_limit, slow.get(name))
    if every[-1] > 0:
        out[ALL] = _figures(bounds, every, at_limit, max(slow.values(), default=None))
    return out


def _figures(
    bounds: list[float], counts: list[int], at_limit: int, slow_ms: float | None
) -> dict[str, float]:
    highest = next((i for i in range(len(counts)) if counts[i] == counts[-1]), len(bounds))
    reached = bounds[highest] * 1000.0 if highest < len(bounds) else math.inf
    lowest = bounds[highest - 1] * 1000.0 if highest > 0 else 0.0
    if slow_ms is None or slow_ms < lowest:  # none kept (all fast), or more slow calls than are kept
        slow_ms = reached
    return {
        "calls": float(counts[-1]),
        "p50_le_ms": _bound_ms(bounds, counts, 0.50),
        "p99_le_ms": _bound_ms(bounds, counts, 0.99),
        "over_limit": float(counts[-1] - counts[at_limit]),
        "max_ms": slow_ms,
    }


def late_lag(reading: LagReading, slow: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Where the late lag samples come from: of the samples at least `LATE_MS` late, how many waited while
    a slow scheduler call ran (one of `slow`, [ended at, call, seconds, ...] on the same monotonic clock as
    the samples: the call overlapped the time the sample's timer waited), and the most late samples a
    kind of call overlapped (`late_during_<call>`)."""
    calls = sorted((float(t) - float(s), float(t), str(c)) for t, c, s, *_ in slow)
    late = during = 0
    by_call: dict[str, int] = {}
    for at, lag in zip(reading.taken_at, reading.samples_s, strict=False):
        if lag * 1000.0 < LATE_MS:
            continue
        late += 1
        waited_from = at - lag
        hit = [c for start, end, c in calls if start <= at and end >= waited_from]
        if hit:
            during += 1
            for c in set(hit):
                by_call[c] = by_call.get(c, 0) + 1
    out = {"late_samples": float(late), "late_during_calls": float(during)}
    out.update({f"late_during_{c}": float(n) for c, n in by_call.items()})
    return out


def _over(slow: Sequence[Sequence[Any]], start: float) -> list[tuple[str, Sequence[Any]]]:
    """The slow calls kept ([ended at, call, seconds, ...]) over `DECISION_LIMIT_MS`, in time order, each
    under its key "CALL@S" (S: seconds into the window when it ended, from `start`)."""
    return [
        (f"{e[1]}@{float(e[0]) - start:.2f}", e)
        for e in sorted(slow, key=lambda x: float(x[0]))
        if float(e[2]) * 1000.0 > DECISION_LIMIT_MS
    ]


def over_limit(slow: Sequence[Sequence[Any]], start: float) -> dict[str, float]:
    """The window's calls over `DECISION_LIMIT_MS` one by one (`_over`'s keys) -> ms, in time order."""
    return {key: float(e[2]) * 1000.0 for key, e in _over(slow, start)}


def over_limit_cpu(slow: Sequence[Sequence[Any]], start: float) -> dict[str, float]:
    """The CPU time (ms) of the calls `over_limit` lists, under its keys: those kept with their CPU
    time ([ended at, call, seconds, CPU seconds]; a daemon that does not report it leaves them out)."""
    return {key: float(e[3]) * 1000.0 for key, e in _over(slow, start) if len(e) > 3 and e[3] is not None}


def gc_window(before: dict[str, Any], after: dict[str, Any], reading: LagReading | None) -> dict[str, float]:
    """berth's garbage collections between two readings of its `gc` document (`after` with the pauses
    numbered above `before`'s `taken`): per generation the collections, their total and longest pause
    (ms; the longest exact from 1 ms, kept pauses, else 0) and their CPU, and of the lag samples at least
    `LATE_MS` late how many waited while a collection of 1 ms or more ran (`late_during_gc`)."""
    out: dict[str, float] = {}
    for gen, now in after["generations"].items():
        then = before["generations"][gen]
        out[f"gen{gen}_count"] = float(now["count"] - then["count"])
        out[f"gen{gen}_sum_ms"] = (now["sum_s"] - then["sum_s"]) * 1000.0
        out[f"gen{gen}_cpu_ms"] = (now.get("cpu_s", 0.0) - then.get("cpu_s", 0.0)) * 1000.0
        out[f"gen{gen}_max_ms"] = 0.0
    pauses = [(float(p[0]), f"gen{int(p[1])}", float(p[2])) for p in after["pauses"]]
    for _, gen, s in pauses:
        out[f"{gen}_max_ms"] = max(out.get(f"{gen}_max_ms", 0.0), s * 1000.0)
    if reading is not None:
        out["late_during_gc"] = late_lag(reading, pauses)["late_during_calls"]
    return out
