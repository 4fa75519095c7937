"""The cyclic garbage collector during a simulation, on the daemon's schedule (`SimOptions.collector`).

The daemon runs `gateway.core.heap.GcSchedule`: what survives startup is frozen, the young generation is
frozen (not walked) every `YOUNG_INTERVAL_S` and collected only as a probe, and a full collection waits for
the heap to grow by a quarter (up to a whole while the full collections find almost no garbage). Under
CPython's own thresholds a simulation pays what the daemon does not:
a young collection every 700 net allocations (a decision that makes a hundred loads sets one off), whose
survivors move to the older generations and are walked again by theirs. `SimCollector` puts the
simulation on the daemon's schedule: `start` settles it (before the fleet is brought up), `step` (at
every scheduler tick of the virtual clock, as the daemon's timer steps it between callbacks) runs a
young step when one is due, and a tick (the idle check and the heap's growth) at most every `TICK_S`
of wall time; `stop` hands the collector back (after the report is built). Collections free only what
reference counting left, so the run's events and report are the same either way; only its cost moves.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping

from gateway.core.heap import TICK_S, GcSchedule


class SimCollector:
    """The daemon's collector schedule over one simulation (`start`, `step` at each tick, `stop`)."""

    __slots__ = ("_busy", "_clock", "_last_tick", "schedule", "tally")

    def __init__(self, busy: Callable[[], int], *, clock: Callable[[], float] = time.monotonic) -> None:
        """`busy`: requests in flight or queued now (the schedule's idle check)."""
        self.schedule = GcSchedule(clock=clock)
        self._busy = busy
        self._clock = clock
        self._last_tick = 0.0
        self.tally = GcTally()  # the collections from `start` to `stop`: the schedule's alone

    def start(self) -> None:
        self.tally.__enter__()
        self.schedule.settle()
        self._last_tick = self._clock()

    def step(self) -> None:
        schedule = self.schedule
        schedule.step()
        now = self._clock()
        if now - self._last_tick >= TICK_S:
            self._last_tick = now
            schedule.tick(self._busy())

    def stop(self) -> None:
        self.schedule.close()
        self.tally.__exit__()


class GcTally:
    """Collections per generation and the wall seconds spent in them, while installed (a `gc.callbacks`
    entry: `with GcTally() as tally:`)."""

    __slots__ = ("_started", "count", "seconds")

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def _callback(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += time.perf_counter() - self._started

    def __enter__(self) -> GcTally:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def document(self) -> dict[str, list[int] | list[float]]:
        return {"collections": list(self.count), "seconds": [round(s, 3) for s in self.seconds]}
