"""Settings and schedule of CPython's cyclic garbage collector for the long-running daemon.

CPython collects its youngest generation each time the container objects allocated since the last
collection, less those freed, pass 700. A proxy allocates and frees hundreds of them per request
(frames, futures, headers, parsed JSON), so with tens of requests in flight that count passes 700
dozens of times a second although almost nothing is cyclic garbage: every collection walks the young
objects, the ones of the requests in flight survive into older generations, and the oldest grows until
a full collection walks every object the process has, tens of milliseconds during which no request
moves. On the overhead benchmark (64 clients) the collector took about 8% of berth's CPU, and its full
collections were the slowest requests.

`GcSchedule.settle()` runs once, when the daemon has built what it keeps for its lifetime (modules,
config, plugins, metric families, the app): it collects, freezes the survivors so that no collection
walks them again, and raises the young threshold so that a young collection runs when objects really
accumulate (every `YOUNG_THRESHOLD` net allocations).

Between the loop's callbacks. CPython collects inside the allocation that crossed the threshold: in
the middle of a scheduler call, a relayed chunk, a request's parse, which then takes the collection's
time too (a 2 ms decision became an 80 ms one). The schedule runs the collections itself instead, from
a timer of its own every `STEP_S` (a read of three counters when nothing is due): the young threshold
CPython sees is `BACKSTOP` times the schedule's, so CPython collects by itself only when one callback
allocated that much without yielding, and the collection the schedule runs is the one CPython would
have chosen (the oldest generation past its threshold). A pause is then a callback of its own in the
loop: the lag counts it, the scheduler's decision times do not, and `berth_gc_pause_seconds` names it.

The older generations. A collection of the middle generation walks every object that survived a young
collection since the last one; with a standing queue that is most of what the requests in flight hold
(about a hundred tracked objects each: coroutines, tasks, aiohttp's request and response, the
scheduler's records), so its pause grows with the load, and CPython's fixed rule (every 10 young
collections) makes it as frequent at 2,600 requests in flight as at 10. The schedule scales that rule to
the heap: the middle generation is collected once the young collections since the last one may have
promoted `OLDER_SHARE` of the memory blocks that were live after the last full collection
(`threshold1 = OLDER_SHARE x live / YOUNG_THRESHOLD`, at least CPython's 10), and a full collection
every 10 middle ones (CPython's count): full collections too come after the heap grew in proportion to
itself. And when no request is in flight or queued for `IDLE_TICKS` ticks in a row, anything
promoted since the last full collection is collected then (at most every `IDLE_MIN_INTERVAL_S`): a
burst starts with its older generations empty instead of paying for the last burst's leftovers.

Memory stays bounded: every collection still runs, only less often in proportion to the heap (and
CPython's own collections stay on as a backstop). Cyclic garbage waits at most one young threshold in
the young generation (`BACKSTOP` of them if the loop is held that long), about `OLDER_SHARE x live` in
the middle one, and 11 middle collections' worth in the oldest: in all about
`YOUNG_THRESHOLD + 12 x OLDER_SHARE x live` at most, proportional to the heap the last full
collection left, which the collection that frees it measures again. Nothing is frozen after startup (a
frozen cycle would never be freed).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from gateway.core.gcpauses import GcPauses

YOUNG_THRESHOLD: Final = 10_000
#: The middle generation is collected once young collections may have promoted this share of the memory
#: blocks live after the last full collection (CPython's own share for full collections).
OLDER_SHARE: Final = 0.25
#: Bounds of the middle generation's threshold (young collections between two of its collections).
OLDER_MIN: Final = 10
OLDER_MAX: Final = 1000
#: Seconds between two checks for a due collection (`GcSchedule.step`).
STEP_S: Final = 0.05
#: CPython's own young threshold is this many times the schedule's: it collects only when a callback
#: allocated that much without yielding to the loop.
BACKSTOP: Final = 10
#: Seconds between the schedule's ticks (a rescale when a full collection measured the heap; the idle check).
TICK_S: Final = 1.0
#: Ticks in a row with nothing in flight or queued before an idle collection.
IDLE_TICKS: Final = 2
#: Seconds at least between two idle collections.
IDLE_MIN_INTERVAL_S: Final = 10.0


GcCallback = Callable[[str, Mapping[str, int]], None]


class GcModule(Protocol):
    """What the schedule uses of the `gc` module (tests pass a fake)."""

    @property
    def callbacks(self) -> list[Any]: ...

    def collect(self, generation: int = 2) -> int: ...

    def freeze(self) -> None: ...

    def get_count(self) -> tuple[int, int, int]: ...

    def get_threshold(self) -> tuple[int, int, int]: ...

    def set_threshold(self, threshold: int, threshold1: int = ..., threshold2: int = ..., /) -> None: ...


def older_threshold(live_blocks: int, young: int = YOUNG_THRESHOLD, share: float = OLDER_SHARE) -> int:
    """Young collections between two collections of the middle generation for a heap of `live_blocks`."""
    return max(OLDER_MIN, min(OLDER_MAX, math.ceil(share * live_blocks / young)))


class GcSchedule:
    """The collector's thresholds and idle collections (see the module docstring); `pauses` (if any)
    records every collection's pause (`gateway.core.gcpauses`) while installed."""

    def __init__(
        self,
        pauses: GcPauses | None = None,
        *,
        collector: GcModule = gc,
        blocks: Callable[[], int] = sys.getallocatedblocks,
        clock: Callable[[], float] = time.monotonic,
        young: int = YOUNG_THRESHOLD,
    ) -> None:
        self._gc = collector
        self._blocks = blocks
        self._clock = clock
        self._young = young
        self._callbacks: list[GcCallback] = [self._after_full]
        if pauses is not None:
            self._callbacks.insert(0, pauses.callback)
        self._installed = False
        self._older = OLDER_MIN  # young collections between two of the middle generation
        self._oldest = 10  # middle collections between two full ones (CPython's, read at settle)
        self.live_blocks = 0  # memory blocks after the last full collection
        self._rescale = False  # a full collection measured the heap since the last tick
        self._idle_ticks = 0
        self._idle_at = -math.inf  # when the last idle collection ran
        self.idle_collections = 0

    def settle(self) -> None:
        """Once startup is done: collect, freeze the survivors, set the thresholds, install the callbacks."""
        self._gc.collect()
        self._gc.freeze()
        self.live_blocks = self._blocks()
        self._apply()
        if not self._installed:
            self._gc.callbacks.extend(self._callbacks)
            self._installed = True

    def close(self) -> None:
        """Remove the callbacks (the thresholds stay)."""
        if self._installed:
            for cb in self._callbacks:
                self._gc.callbacks.remove(cb)
            self._installed = False

    def _apply(self) -> None:
        _, _, self._oldest = self._gc.get_threshold()
        self._older = older_threshold(self.live_blocks, self._young)
        self._gc.set_threshold(self._young * BACKSTOP, self._older, self._oldest)

    def step(self) -> int | None:
        """Run the collection that is due, if any, and say which generation it was (None: none due).
        CPython's choice: once the young generation passed its threshold, the oldest generation whose
        count passed its own (its rule that a full collection also wait until the objects promoted since
        the last one are a quarter of those it kept is not visible from Python: the middle generation's
        threshold, scaled to the heap, spaces full collections instead)."""
        young, middle, oldest = self._gc.get_count()
        if young <= self._young:
            return None
        gen = 2 if oldest > self._oldest else 1 if middle > self._older else 0
        self._gc.collect(gen)
        return gen

    def _after_full(self, phase: str, info: Mapping[str, int]) -> None:
        # In the collector's callback only the heap is measured (a few hundred µs at a million blocks,
        # once per full collection); the next tick applies it.
        if phase == "stop" and info["generation"] == 2:
            self.live_blocks = self._blocks()
            self._rescale = True

    def tick(self, busy: int) -> None:
        """One tick: `busy` requests are in flight or queued."""
        if self._rescale:
            self._rescale = False
            self._apply()
        self._idle_ticks = 0 if busy else self._idle_ticks + 1
        if self._idle_ticks < IDLE_TICKS or self._clock() - self._idle_at < IDLE_MIN_INTERVAL_S:
            return
        _, middle, oldest = self._gc.get_count()
        if middle or oldest:  # something survived a young collection since the last full one
            self._idle_at = self._clock()
            self.idle_collections += 1
            self._gc.collect(2)  # the callback measures the heap; the next tick rescales

    async def run(self, busy: Callable[[], int]) -> None:
        """`step` every `STEP_S`, `tick` every `TICK_S`, until cancelled."""
        per_tick = round(TICK_S / STEP_S)
        for n in itertools.count(1):
            await asyncio.sleep(STEP_S)
            self.step()
            if n % per_tick == 0:
                self.tick(busy())
