"""A proxy's event-loop lag as the overhead benchmark reads it: the samples of berth's lag monitor
(`gateway.core.looplag`) from `GET /admin/loop-lag`, which berth and the bare proxy
(`overhead_bare_proxy`) both answer. A reading's `taken` count marks a moment: the samples taken after
one reading and up to the next are one phase's, and `overhead_report.lag_figures` turns them into its
p50, p99 and max (real samples, not a histogram's bucket edges)."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Any, Final

import orjson

LOOP_LAG_PATH: Final = "/admin/loop-lag"


@dataclass(frozen=True, slots=True)
class LagReading:
    taken: int  # samples the monitor had taken when read
    samples_s: tuple[float, ...]  # the lag of those numbered above the `after` asked for, in seconds
    # ... and when each was taken (the proxy's monotonic clock, system-wide: comparable across processes)
    taken_at: tuple[float, ...] = ()


def read_lag(base_url: str, after: int = 0, timeout_s: float = 5.0) -> LagReading | None:
    """The proxy's samples numbered above `after`; None when they cannot be read (not running, or a
    proxy without the monitor)."""
    try:
        with urllib.request.urlopen(f"{base_url}{LOOP_LAG_PATH}?after={after}", timeout=timeout_s) as resp:
            doc = orjson.loads(resp.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    samples = doc["samples"]
    return LagReading(
        int(doc["taken"]), tuple(float(lag) for _, lag in samples), tuple(float(t) for t, _ in samples)
    )


def read_gc(base_url: str, after: int = 1 << 62, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """berth's garbage-collector pauses (`gateway.core.gcpauses`: the `gc` member of its loop-lag
    document) with the kept pauses numbered above `after` (by default none: a mark); None when not
    berth or not answering."""
    url = f"{base_url}{LOOP_LAG_PATH}?after={1 << 62}&gc_after={after}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            doc = orjson.loads(resp.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    gc: dict[str, Any] | None = doc.get("gc")
    return gc


def mark_lag(base_url: str) -> LagReading | None:
    """A reading that only marks the moment (no samples asked for)."""
    return read_lag(base_url, after=1 << 62)


def lag_since(base_url: str, mark: LagReading | None) -> tuple[float, ...] | None:
    """The samples taken since `mark` (an earlier reading of the same proxy); None if either is unknown."""
    if mark is None:
        return None
    now = read_lag(base_url, mark.taken)
    return None if now is None else now.samples_s
