"""How long the cyclic garbage collector held the process (`berth_gc_pause_seconds{generation}`).

A collection runs inside whatever allocation crossed the young threshold: a scheduler call, a relayed
chunk's callback, a request's parse. Nothing else runs meanwhile, so a collection of the older
generations (every object tracked since the last one: with thousands of requests in flight, hundreds of
thousands) shows as a stall of the event loop (`gateway.core.looplag`) and as a slow call of whatever it
interrupted (`gateway.core.decisiontime`). `GcPauses.callback` is a `gc.callbacks` entry: on each
collection's start and stop it reads `time.perf_counter` and the thread's CPU time and records the pause
under its generation (0 young, 1 middle, 2 full) with the objects it freed. Pauses of `RECENT_S` (1 ms)
or more are also kept as they were, numbered, with the time each ended on the system's monotonic clock
(as `RecentLag` dates its samples) and the CPU it took (a pause much longer than its CPU is the process
waiting for a core mid-collection, not the collector's work), so that a benchmark can tell the lag
samples a collection caused from the rest.

Exported at scrape time by `GcCollector` (nothing but the callback on the hot path: two clock reads, a
bisect and three additions per collection): `berth_gc_pause_seconds{generation}` (a histogram),
`berth_gc_pause_max_seconds{generation}` (the longest since start) and
`berth_gc_collected_objects_total{generation}` (cyclic garbage found; refcounting frees the rest).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from gateway.core.decisiontime import DECISION_BUCKETS, CallTimes

#: The generations, as the `generation` label names them.
GENERATIONS: Final = ("0", "1", "2")
#: A pause this long or longer is kept as it was (`GcPauses.recent_after`).
RECENT_S: Final = 0.001
#: Pauses kept (the most recent): young collections of 1 ms a few times a second for an hour.
RECENT_KEPT: Final = 10_000


class GcPauses:
    """The collector's pauses by generation since the callback was installed, and the last
    `RECENT_KEPT` pauses of `RECENT_S` or more (numbered from 1, each with the time it ended by `stamp`)."""

    __slots__ = (
        "_cpu",
        "_cpu_started",
        "_recent",
        "_stamp",
        "_started",
        "_timer",
        "collected",
        "cpu_s",
        "gens",
        "recent_taken",
    )

    def __init__(
        self,
        *,
        timer: Callable[[], float] = time.perf_counter,
        stamp: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
        keep: int = RECENT_KEPT,
    ) -> None:
        self.gens: dict[str, CallTimes] = {g: CallTimes() for g in GENERATIONS}
        self.collected: dict[str, int] = dict.fromkeys(GENERATIONS, 0)
        self.cpu_s: dict[str, float] = dict.fromkeys(GENERATIONS, 0.0)
        self._recent: deque[tuple[float, int, float, float]] = deque(maxlen=keep)
        self._timer = timer
        self._stamp = stamp
        self._cpu = cpu
        self._started = self._cpu_started = 0.0
        self.recent_taken = 0

    def callback(self, phase: str, info: Mapping[str, int]) -> None:
        """The `gc.callbacks` entry: `phase` "start" or "stop", `info` the collection's generation and,
        at its stop, the objects it collected."""
        if phase == "start":
            self._cpu_started = self._cpu()
            self._started = self._timer()
            return
        seconds = self._timer() - self._started
        cpu = self._cpu() - self._cpu_started
        gen = int(info["generation"])
        name = GENERATIONS[gen]
        self.gens[name].record(seconds)
        self.cpu_s[name] += cpu
        self.collected[name] += int(info.get("collected", 0))
        if seconds >= RECENT_S:
            self.recent_taken += 1
            self._recent.append((self._stamp(), gen, seconds, cpu))

    def recent_after(self, number: int) -> list[tuple[float, int, float, float]]:
        """(ended at, generation, seconds, CPU seconds) of the kept pauses numbered above `number`, oldest
        first."""
        n = min(self.recent_taken - max(number, 0), len(self._recent))
        if n <= 0:
            return []
        return list(itertools.islice(self._recent, len(self._recent) - n, None))

    def document(self, after: int = 0) -> dict[str, Any]:
        """The `gc` member of `GET /admin/loop-lag?gc_after=N`: per generation the collections, their
        total and longest pause, their total CPU and the objects collected; how many pauses were kept (ask
        with `gc_after` = that next time for the new ones only), and those numbered above `after` as
        [ended at (monotonic s), generation, seconds, CPU seconds]."""
        return {
            "generations": {
                name: {
                    "count": t.count,
                    "sum_s": t.sum_s,
                    "max_s": t.max_s,
                    "cpu_s": self.cpu_s[name],
                    "collected": self.collected[name],
                }
                for name, t in self.gens.items()
            },
            "recent_s": RECENT_S,
            "taken": self.recent_taken,
            "pauses": [[t, gen, s, cpu] for t, gen, s, cpu in self.recent_after(after)],
        }


class GcCollector:
    """Exports `GcPauses` at scrape time, with the scheduler calls' bucket bounds (50 µs to 1 s, 5 ms
    among them): a pause and a decision compare bucket for bucket."""

    def __init__(self, pauses: GcPauses) -> None:
        self._pauses = pauses

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        h = HistogramMetricFamily(
            "berth_gc_pause_seconds",
            "Time the cyclic garbage collector held the process per collection, by generation collected",
            labels=["generation"],
        )
        g = GaugeMetricFamily(
            "berth_gc_pause_max_seconds",
            "The longest collection of each generation since start",
            labels=["generation"],
        )
        c = CounterMetricFamily(
            "berth_gc_collected_objects",
            "Objects the cyclic garbage collector freed (garbage in reference cycles), by generation",
            labels=["generation"],
        )
        bounds = [repr(b) for b in DECISION_BUCKETS] + ["+Inf"]
        for name, t in self._pauses.gens.items():
            h.add_metric([name], list(zip(bounds, (float(n) for n in t.cumulative()), strict=True)), t.sum_s)
            g.add_metric([name], t.max_s)
            c.add_metric([name], float(self._pauses.collected[name]))
        yield h
        yield g
        yield c
