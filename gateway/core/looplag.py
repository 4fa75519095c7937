"""The event loop's lag: how late a timer fires, sampled all the time (`berth_event_loop_lag_seconds`).

Everything berth does shares one event loop: a callback that runs long (a refit, a large parse, a
blocking call) delays every request's next step by as much. The monitor asks to be woken every
`interval_s` and records how much later than asked it was woken; under load the lag is the time the
loop spent on other callbacks before it got to the timer. One timer and one histogram observation per
interval (10 a second by default): cheap enough to leave on, and what an operator alerts on (its p99).

The time is read from `time.perf_counter`, not the loop's clock: uvloop's `loop.time()` counts whole
milliseconds (libuv's cached loop time), so an idle loop read 0, 1 or 2 ms of lag and a quarter of its
samples landed above 1 ms; with a sub-microsecond clock an idle loop reads about 0.2 ms (a timer
whose delay libuv truncated to whole milliseconds may even fire early: that reads as no lag).

`RecentLag` keeps the last samples as they were, with the time each was taken, beside the histogram:
`GET /admin/loop-lag` answers with them, so a stall can be dated and a benchmark can take real
percentiles and the maximum over its own window instead of a histogram's bucket edges.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

#: Seconds between samples.
LAG_INTERVAL_S: Final = 0.1
#: Samples `RecentLag` keeps: ten minutes at the default interval (about 100 kB).
RECENT_SAMPLES: Final = 6000


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class RecentLag:
    """The most recent lag samples, numbered from 1 in the order taken, each with the time it was taken
    (`clock`: the system-wide monotonic clock, so another process on the machine can place it in its own
    time); each is also passed on to `histogram` (the operator's metric)."""

    def __init__(
        self,
        histogram: Observer | None = None,
        keep: int = RECENT_SAMPLES,
        *,
        interval_s: float = LAG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._histogram = histogram
        self._samples: deque[tuple[float, float]] = deque(maxlen=keep)
        self._clock = clock
        self.interval_s = interval_s
        self.taken = 0

    def observe(self, amount: float) -> None:
        self.taken += 1
        self._samples.append((self._clock(), amount))
        if self._histogram is not None:
            self._histogram.observe(amount)

    def after(self, number: int) -> list[tuple[float, float]]:
        """(taken at, seconds late) of the samples numbered above `number` that are still kept, oldest
        first."""
        n = min(self.taken - max(number, 0), len(self._samples))
        if n <= 0:
            return []
        return list(itertools.islice(self._samples, len(self._samples) - n, None))

    def document(self, after: int = 0) -> dict[str, Any]:
        """What `GET /admin/loop-lag?after=N` answers: the interval, how many samples were taken (ask
        with `after` = that next time for the new ones only) and the samples as [taken at, seconds]."""
        return {
            "interval_s": self.interval_s,
            "taken": self.taken,
            "samples": [[t, lag] for t, lag in self.after(after)],
        }


async def watch_lag(
    observer: Observer,
    interval_s: float = LAG_INTERVAL_S,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Observe each sample's lag (seconds late by `clock`, never negative) until cancelled."""
    while True:
        due = clock() + interval_s
        await asyncio.sleep(interval_s)
        observer.observe(max(0.0, clock() - due))
