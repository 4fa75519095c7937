"""The event-loop lag monitor records how late its timer fired: a loop blocked for a while shows at
least that much lag (a lower bound, whatever the machine's speed); the recent samples are kept as taken,
numbered, beside the histogram."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from gateway.core.looplag import RecentLag, watch_lag

BLOCK_S = 0.05


class Recorder:
    def __init__(self, wanted: int) -> None:
        self.samples: list[float] = []
        self.wanted = wanted
        self.enough = asyncio.Event()

    def observe(self, amount: float) -> None:
        self.samples.append(amount)
        if len(self.samples) >= self.wanted:
            self.enough.set()


def _block_the_loop() -> None:
    end = time.monotonic() + BLOCK_S
    while time.monotonic() < end:  # a callback that hogs the loop (no await)
        pass


async def test_a_blocked_loop_shows_as_lag() -> None:
    rec = Recorder(wanted=2)
    task = asyncio.get_running_loop().create_task(watch_lag(rec, interval_s=0.001))
    asyncio.get_running_loop().call_soon(_block_the_loop)
    await rec.enough.wait()
    task.cancel()
    assert all(s >= 0.0 for s in rec.samples)
    # The first timer was due 1 ms after it was set, but the loop was busy for BLOCK_S first.
    assert max(rec.samples) >= BLOCK_S - 0.001 - 0.002


async def test_lag_is_read_from_a_fine_clock_not_the_loops() -> None:
    """uvloop's loop.time() counts whole milliseconds; the monitor reads its own clock, so 0.3 ms late
    reads as 0.3 ms and a timer that fired early as no lag."""
    readings = itertools.chain([10.0, 10.0003, 20.0, 19.9995], itertools.repeat(30.0))
    rec = Recorder(wanted=2)
    task = asyncio.get_running_loop().create_task(
        watch_lag(rec, interval_s=0.0, clock=lambda: next(readings))
    )
    await rec.enough.wait()
    task.cancel()
    assert rec.samples[0] == pytest.approx(0.0003)
    assert rec.samples[1] == 0.0


def test_recent_lag_keeps_the_latest_samples_numbered_and_timed() -> None:
    hist = Recorder(wanted=1)
    times = itertools.count(100.0)
    recent = RecentLag(hist, keep=3, clock=lambda: float(next(times)))
    for lag in (0.001, 0.002, 0.003, 0.004):
        recent.observe(lag)
    assert hist.samples == [0.001, 0.002, 0.003, 0.004]  # the histogram sees every one
    assert recent.taken == 4
    assert recent.after(0) == [(101.0, 0.002), (102.0, 0.003), (103.0, 0.004)]  # the oldest is gone
    assert recent.after(2) == [(102.0, 0.003), (103.0, 0.004)]
    assert recent.after(4) == []
    assert recent.after(9) == []
    doc = recent.document(3)
    assert doc == {"interval_s": recent.interval_s, "taken": 4, "samples": [[103.0, 0.004]]}


async def test_the_monitor_feeds_the_recent_samples() -> None:
    hist = Recorder(wanted=3)
    recent = RecentLag(hist)
    task = asyncio.get_running_loop().create_task(watch_lag(recent, interval_s=0.0))
    await hist.enough.wait()
    task.cancel()
    assert recent.taken >= 3
    assert [lag for _, lag in recent.after(0)] == hist.samples[: recent.taken]
