"""The deadlines of every engine call in flight, checked by one coarse sweep instead of a timer per call.

A loop timer per call (aiohttp's read timer, made and cancelled per call and again per read;
`asyncio.timeout` around a streamed call's headers; a stall timer per stream) costs a timer made and
cancelled each time, and most never fire. Here a call registers a watch (a set insertion) and
forgets it when done (a removal); one timer, armed only while watches exist, sweeps them every
`tick_s`: an eighth of the shortest timeout watched, at most `MAX_TICK_S`. A deadline is therefore met
up to one tick late (at most 1/8 of its timeout), never early.

Two kinds of watch:
- `cancel_after`: the task waiting for an engine's response headers is cancelled at the deadline, and
  the caller turns that cancellation into its timeout (as `asyncio.timeout` does, counting the task's
  cancellation requests so that another canceller, a leaving client or a preemption, keeps its own).
- `stall`: a response body that the engine stops sending fails with TimeoutError (set on its stream,
  so the reader's next read raises it) once nothing arrived for the timeout. The reader may set the
  watch's `seen` to the time of each chunk it takes; at the deadline the stream fails only if no byte
  arrived since the watch's previous check either (a reader held up by a slow client is no stalled
  engine), and never once the response has ended.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Final, Protocol

from gateway.core.clock import Clock

#: The sweep's longest interval: an engine timeout of minutes is met within a second of it.
MAX_TICK_S: Final = 1.0
#: ... and a timeout's share of it: a deadline is met at most this share of its timeout late.
TICK_SHARE: Final = 1.0 / 8.0


class Body(Protocol):
    """What a stall watch reads of a response body as it arrives (`gateway.upstream.h1.H1Response`;
    aiohttp's `StreamReader` fits too)."""

    @property
    def total_bytes(self) -> int:
        """Bytes received so far."""
        ...

    def is_eof(self) -> bool:
        """Whether the whole body was received."""
        ...

    def set_exception(self, exc: BaseException) -> None:
        """Fail the reader's next read with `exc`."""
        ...


class Watch:
    """One call's deadline. `fired`: the sweep acted on it (cancelled the task, or failed the stream)."""

    __slots__ = ("deadline", "fired", "timeout_s")

    def __init__(self, timeout_s: float, now: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = now + timeout_s  # the next check
        self.fired = False

    def check(self, now: float) -> bool:
        """Act if the deadline passed; whether the watch is done with (fired, or its stream ended)."""
        raise NotImplementedError


class TaskWatch(Watch):
    """`Deadlines.cancel_after`: the waiting task is cancelled at the deadline."""

    __slots__ = ("_cancelling", "_task")

    def __init__(self, timeout_s: float, now: float, task: asyncio.Task[Any]) -> None:
        super().__init__(timeout_s, now)
        self._task = task
        self._cancelling = task.cancelling()

    def check(self, now: float) -> bool:
        if now < self.deadline:
            return False
        self.fired = True
        self._task.cancel("engine call deadline")
        return True

    def timed_out(self) -> bool:
        """For a task that got a CancelledError: whether the deadline caused it (then the caller raises
        its timeout) and no other cancellation is pending."""
        return self.fired and self._task.uncancel() <= self._cancelling


class StallWatch(Watch):
    """`Deadlines.stall`: the stream fails once nothing arrived for the timeout; `seen` is the reader's."""

    __slots__ = ("_bytes", "_content", "seen")

    def __init__(self, timeout_s: float, now: float, content: Body) -> None:
        super().__init__(timeout_s, now)
        self.seen = now  # the reader's last chunk
        self._content = content
        self._bytes = content.total_bytes

    def check(self, now: float) -> bool:
        if now < self.deadline:
            return False
        content = self._content
        if content.is_eof():
            return True  # the engine finished; what is left is only waiting to be read
        idle = now - self.seen
        received, self._bytes = self._bytes, content.total_bytes
        if idle < self.timeout_s:
            self.deadline = now + self.timeout_s - idle
        elif content.total_bytes != received:
            self.deadline = now + self.timeout_s
        else:
            self.fired = True
            content.set_exception(TimeoutError(f"no data for {self.timeout_s:g}s"))
            return True
        return False


class Deadlines:
    """Every engine call's watch, swept by one timer on the running loop."""

    __slots__ = ("_clock", "_handle", "_tick_s", "_watches")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._watches: set[Watch] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._tick_s = math.inf  # of the timer armed (inf: none)

    def __len__(self) -> int:
        return len(self._watches)

    def cancel_after(self, timeout_s: float) -> TaskWatch:
        """Cancel the current task `timeout_s` from now (see `TaskWatch.timed_out`), unless forgotten
        first."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("cancel_after needs a running task")
        watch = TaskWatch(timeout_s, self._clock.now(), task)
        self._add(watch)
        return watch

    def stall(self, content: Body, timeout_s: float) -> StallWatch:
        """Fail `content` with TimeoutError once the engine sent nothing for `timeout_s`."""
        watch = StallWatch(timeout_s, self._clock.now(), content)
        self._add(watch)
        return watch

    def forget(self, watch: Watch) -> None:
        self._watches.discard(watch)

    def _add(self, watch: Watch) -> None:
        self._watches.add(watch)
        if watch.timeout_s * TICK_SHARE < self._tick_s:  # else the timer armed is soon enough
            if self._handle is not None:
                self._handle.cancel()
            self._arm(min(MAX_TICK_S, watch.timeout_s * TICK_SHARE))

    def _arm(self, tick_s: float) -> None:
        self._tick_s = tick_s
        self._handle = asyncio.get_running_loop().call_later(tick_s, self.sweep)

    @property
    def tick_s(self) -> float | None:
        """The interval of the timer armed now (None: none is, no call is watched)."""
        return None if self._handle is None else self._tick_s

    def sweep(self) -> None:
        """Check every watch now (the timer calls this each tick)."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        now = self._clock.now()
        done = [w for w in self._watches if w.check(now)]
        for w in done:
            self._watches.discard(w)
        if self._watches:
            self._arm(self._tick_s)
        else:
            self._tick_s = math.inf
