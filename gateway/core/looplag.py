"""The event loop's lag: how late a timer fires, sampled all the time (`berth_event_loop_lag_seconds`).

Everything berth does shares one event loop: a callback that runs long (a refit, a large parse, a
blocking call) delays every request's next step by as much. The monitor asks to be woken every
`interval_s` and records how much later than asked it was woken; under load the lag is the time the
loop spent on other callbacks before it got to the timer. One timer and one histogram observation per
interval (10 a second by default): cheap enough to leave on, and what an operator alerts on (its p99).
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

#: Seconds between samples.
LAG_INTERVAL_S: Final = 0.1


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


async def watch_lag(observer: Observer, interval_s: float = LAG_INTERVAL_S) -> None:
    """Observe each sample's lag (seconds late, never negative) until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observer.observe(max(0.0, loop.time() - due))
