"""The engine calls' deadlines: one sweep for all (gateway.upstream.deadlines), on a fake clock; the
sweep is called directly, as its timer would."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from gateway.core.clock import FakeClock
from gateway.upstream.deadlines import MAX_TICK_S, Deadlines, TaskWatch


def _content() -> aiohttp.StreamReader:
    loop = asyncio.get_running_loop()
    return aiohttp.StreamReader(BaseProtocol(loop), 2**16, loop=loop)


async def _waiting(deadlines: Deadlines, timeout_s: float) -> tuple[asyncio.Task[str], list[TaskWatch]]:
    """A task that waits forever under a `cancel_after` watch and says how it ended."""
    watches: list[TaskWatch] = []
    started = asyncio.Event()

    async def call() -> str:
        watch = deadlines.cancel_after(timeout_s)
        watches.append(watch)
        started.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if watch.timed_out():
                return "timed out"
            raise
        finally:
            deadlines.forget(watch)
        return "answered"

    task = asyncio.ensure_future(call())
    await started.wait()
    return task, watches


async def test_the_deadline_cancels_the_waiting_task_which_takes_it_as_its_timeout() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    task, _ = await _waiting(deadlines, 2.0)
    clock.advance(1.9)
    deadlines.sweep()
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    deadlines.sweep()
    assert await task == "timed out"
    assert len(deadlines) == 0


async def test_another_cancellation_stays_a_cancellation() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    task, _ = await _waiting(deadlines, 1.0)
    task.cancel("client left")  # the client went away, and the deadline passes in the same turn
    clock.advance(1.0)
    deadlines.sweep()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_forgotten_watch_never_fires_and_the_timer_stops_with_the_last_one() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    content = _content()
    watch = deadlines.stall(content, 0.4)
    assert deadlines.tick_s == pytest.approx(0.05)  # an eighth of the timeout
    deadlines.stall(_content(), 600.0)
    assert deadlines.tick_s == pytest.approx(0.05)  # the shortest timeout's
    deadlines.forget(watch)
    clock.advance(10.0)
    deadlines.sweep()
    assert content.exception() is None
    assert deadlines.tick_s == pytest.approx(0.05)  # the other watch (600 s) is still on
    long_only = Deadlines(clock)
    w = long_only.stall(_content(), 600.0)
    assert long_only.tick_s == MAX_TICK_S
    long_only.forget(w)
    long_only.sweep()
    assert long_only.tick_s is None  # nothing watched: no timer


async def test_a_silent_stream_fails_once_nothing_arrived_for_the_timeout() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    content = _content()
    watch = deadlines.stall(content, 1.0)
    clock.advance(0.5)
    content.feed_data(b"data: 1\n\n")
    watch.seen = clock.now()  # the reader took the chunk
    clock.advance(0.9)  # 1.4 s since the start, 0.9 s since the chunk
    deadlines.sweep()
    assert content.exception() is None
    clock.advance(0.1)  # 1.0 s of silence
    deadlines.sweep()
    assert isinstance(content.exception(), TimeoutError)
    assert watch.fired
    assert len(deadlines) == 0


async def test_a_reader_held_up_by_its_client_is_no_stalled_engine() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    content = _content()
    watch = deadlines.stall(content, 1.0)
    content.feed_data(b"data: 1\n\n")  # bytes arrive, but the reader takes none for a while
    clock.advance(1.0)
    deadlines.sweep()
    assert content.exception() is None  # bytes came since the watch began: the engine is alive
    clock.advance(1.0)
    deadlines.sweep()
    assert isinstance(content.exception(), TimeoutError)  # nothing for a whole timeout since
    assert watch.fired


async def test_an_ended_response_is_never_failed() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    content = _content()
    deadlines.stall(content, 1.0)
    content.feed_data(b"data: [DONE]\n\n")
    content.feed_eof()
    clock.advance(5.0)
    deadlines.sweep()
    assert content.exception() is None
    assert len(deadlines) == 0
