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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final, Protocol

#: Seconds between samples.
LAG_INTERVAL_S: Final = 0.1


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


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
