"""How long the scheduler takes to decide (`berth_sched_decision_seconds{call}`), and the longest call.

The scheduler core is synchronous and runs on the event loop: a decision that takes 5 ms delays every
stream the gateway relays by 5 ms. The live driver (`gateway.dispatch.driver`) times each call it makes
into the scheduler with `time.perf_counter` and records it here under the call's kind:

| call       | what the daemon asked                                                        |
| ---------- | ---------------------------------------------------------------------------- |
| `submit`   | a new request (or a retry): place it now or queue it                         |
| `complete` | a request finished: its seat is free, the queue is served                     |
| `tick`     | the queue ticker (every 0.1 s): expiry, admission recheck, every queue served |
| `serve`    | the next slice of serving a call left to do (`gateway.sched.slices`)           |
| `cancel`   | a queued request's client went away                                          |
| `endpoint` | an endpoint changed (set, health, models, scraped gauges)                     |
| `peers`    | other replicas' published load (cluster mode)                                 |
| `policy`   | a reload swapped the policy or the queue limits                               |

`record` is a few hundred nanoseconds (one bisect and three additions; the event loop's thread alone
calls it, so no lock). The histogram is exported at scrape time by `DecisionCollector` (nothing on the
hot path) with the longest call of each kind since start as `berth_sched_decision_max_seconds{call}`: a
histogram's buckets say how many calls took over 5 ms, the maximum says by how much. The slow calls
(`SLOW_S`, 2 ms, or more) are also kept as they were, numbered, with the time each ended (as
`gateway.core.looplag.RecentLag` keeps lag samples): a stall can be dated, and a benchmark takes the
longest call of its own window. A slow call is kept with the CPU time the loop's thread spent in it
(`time.thread_time`, read at each call's start, about 0.4 µs, and at its end only when it was slow):
a call whose CPU is well under its time was the process waiting for a core (the machine's load), not
the scheduler's work. `document()` is all of it for `GET /admin/sched-decisions` (a benchmark
reads it before and after its window and takes the difference of the counts). A call's time is wall
time: a garbage collection that ran during it is part of it (the loop was held all the same). The
daemon's collector schedule (`gateway.core.heap`) runs collections between the loop's callbacks, so one
lands inside a call only when CPython's own backstop threshold fires there.
"""

from __future__ import annotations

import itertools
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from time import thread_time
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

#: The kinds of call, as the `call` label names them.
CALLS: Final = ("submit", "complete", "tick", "serve", "cancel", "endpoint", "peers", "policy")
#: Upper bounds in seconds: 50 µs (an FCFS decision) to 1 s; 0.005 is the scale issue's limit.
DECISION_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)

#: A call this long or longer is kept as it was (`DecisionTimes.slow_after`).
SLOW_S: Final = 0.002
#: Slow calls kept (the most recent): a minute of 150 a second; about 1 MB.
SLOW_KEPT: Final = 10_000


class CallTimes:
    """One kind of call: its count, total and longest time, and its count per bucket (not cumulative;
    the last counts calls above the last bound)."""

    __slots__ = ("buckets", "count", "max_s", "sum_s")

    def __init__(self) -> None:
        self.buckets = [0] * (len(DECISION_BUCKETS) + 1)
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0

    def record(self, seconds: float) -> None:
        self.buckets[bisect_left(DECISION_BUCKETS, seconds)] += 1
        self.count += 1
        self.sum_s += seconds
        if seconds > self.max_s:  # noqa: PLR1730 (a compare: max() is a call per decision)
            self.max_s = seconds

    def cumulative(self) -> list[int]:
        """Calls at or under each bound, then the total (Prometheus' `le` counts, +Inf last)."""
        out: list[int] = []
        total = 0
        for n in self.buckets:
            total += n
            out.append(total)
        return out


class DecisionTimes:
    """The scheduler's call times by kind (`CALLS`), since start, and the last `SLOW_KEPT` slow calls
    (numbered from 1 as taken, each with the time it was recorded by `clock`: the system-wide monotonic
    clock, so another process can place it in its own time; and the CPU time the thread spent in it, by
    `cpu_clock`, when the caller gave the call's start on that clock)."""

    __slots__ = ("_clock", "_slow", "calls", "cpu_clock", "slow_taken")

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = thread_time,
        keep: int = SLOW_KEPT,
    ) -> None:
        self.calls: dict[str, CallTimes] = {call: CallTimes() for call in CALLS}
        self._slow: deque[tuple[float, str, float, float | None]] = deque(maxlen=keep)
        self._clock = clock
        #: The thread's CPU clock: a caller reads it at a call's start and hands that to `record`.
        self.cpu_clock = cpu_clock
        self.slow_taken = 0

    def record(self, call: str, seconds: float, cpu_start: float | None = None) -> None:
        """One call of kind `call` (one of `CALLS`) took `seconds`; `cpu_start`: `cpu_clock()` at its
        start (None: its CPU time is not known)."""
        self.calls[call].record(seconds)
        if seconds >= SLOW_S:
            self.slow_taken += 1
            cpu = None if cpu_start is None else self.cpu_clock() - cpu_start
            self._slow.append((self._clock(), call, seconds, cpu))

    def slow_after(self, number: int) -> list[tuple[float, str, float, float | None]]:
        """(recorded at, call, seconds, CPU seconds or None) of the slow calls numbered above `number`
        still kept, oldest first."""
        n = min(self.slow_taken - max(number, 0), len(self._slow))
        if n <= 0:
            return []
        return list(itertools.islice(self._slow, len(self._slow) - n, None))

    @property
    def max_s(self) -> float:
        """The longest call of any kind since start, seconds."""
        return max(c.max_s for c in self.calls.values())

    def document(self, slow_after: int = 0) -> dict[str, Any]:
        """What `GET /admin/sched-decisions?slow_after=N` answers: the buckets' bounds; per kind of call
        its count, total and longest time and cumulative count per bound (+Inf last); `max_s` over every
        kind; how many slow calls were taken (ask with `slow_after` = that next time for the new ones
        only) and those numbered above `slow_after` as [recorded at, call, seconds, CPU seconds or
        null]."""
        return {
            "bounds_s": list(DECISION_BUCKETS),
            "max_s": self.max_s,
            "calls": {
                name: {"count": c.count, "sum_s": c.sum_s, "max_s": c.max_s, "le": c.cumulative()}
                for name, c in self.calls.items()
            },
            "slow_s": SLOW_S,
            "slow_taken": self.slow_taken,
            "slow": [list(entry) for entry in self.slow_after(slow_after)],
        }


class DecisionCollector:
    """Exports `DecisionTimes` at scrape time: `berth_sched_decision_seconds{call}` (a histogram) and
    `berth_sched_decision_max_seconds{call}` (the longest since start)."""

    def __init__(self, times: DecisionTimes) -> None:
        self._times = times

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        h = HistogramMetricFamily(
            "berth_sched_decision_seconds",
            "Time the scheduler took per call the daemon made into it, by kind of call",
            labels=["call"],
        )
        g = GaugeMetricFamily(
            "berth_sched_decision_max_seconds",
            "The longest scheduler call of each kind since start",
            labels=["call"],
        )
        bounds = [repr(b) for b in DECISION_BUCKETS] + ["+Inf"]
        for name, c in self._times.calls.items():
            h.add_metric([name], list(zip(bounds, (float(n) for n in c.cumulative()), strict=True)), c.sum_s)
            g.add_metric([name], c.max_s)
        yield h
        yield g
