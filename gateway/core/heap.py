"""Settings and schedule of CPython's cyclic garbage collector for the long-running daemon.

CPython collects its youngest generation each time the container objects allocated since the last
collection, less those freed, pass 700. A proxy allocates and frees hundreds of them per request
(frames, futures, headers, parsed JSON), so with tens of requests in flight that count passes 700
dozens of times a second although almost nothing is cyclic garbage: every collection walks the young
objects, the ones of the requests in flight survive into older generations, and the oldest grows until
a full collection walks every object the process has, tens of milliseconds during which no request
moves. On the overhead benchmark (64 clients) the collector took about 8% of berth's CPU, and its full
collections were the slowest requests.

With thousands of requests in flight (a standing queue) it is worse. Each holds about a hundred tracked
objects (coroutines, tasks, aiohttp's request and response, the scheduler's records) for seconds, so a
collection of any generation but the youngest walks them all: 250,000 objects, a pause of 50-300 ms.
And the young collections are large too: the count that triggers them is allocations less frees, and
in a steady state the requests that end free about what the requests that arrive allocate, so the count
passes its threshold only every few seconds, and then the young generation holds every object of every
request that arrived since (an 80 ms pause on the benchmark's 200 requests a second). Yet nearly all of
it is freed by reference counting: in the benchmark's window the young collections found no cyclic
garbage at all.

So the schedule (`GcSchedule`) takes the collections over from CPython:

- `settle()`, once startup is done: collect, and freeze what survives (modules, config, plugins,
  metric families, the app) into CPython's permanent generation, which no collection walks.
- Young steps between the loop's callbacks, from a timer of the schedule's own (`step`, every
  `STEP_S`): when `YOUNG_THRESHOLD` net allocations accumulated, or `YOUNG_INTERVAL_S` passed since
  the last one. A step freezes the young generation: what is in it joins the permanent generation
  instead of an older one, so the older generations stay empty and are never walked. A freeze moves
  the generation's list whole (no walk); a young collection before it walks every object in it, and
  with a standing queue that is 25,000-50,000 objects a second (the arrivals' requests, headers and
  tasks, the scheduler's per-request records), to find no garbage: reference counting frees what dies.
  So a step collects only as a probe, every `PROBE_EVERY` steps, and every step while the last probe
  found `GARBAGE_MIN` or more objects of cyclic garbage (a workload that makes cycles, say exceptions
  kept with their tracebacks, has those it drops within a step collected at that step, until a
  collection finds fewer). A probe walks what arrived since the step before and is still alive, so
  the steps' interval bounds its pause: with a standing queue of 1,000 in front of 100 endpoints a
  second's arrivals take 20-25 ms to walk on a quiet core, a tenth of a second's 2-3 ms. The
  collector's CPU does not depend on it (a probe every second over a tenth of a second's objects, or
  one every ten seconds over a second's), and a freeze costs nothing (list splices). The timer can
  come late (a backlog of callbacks runs first), so a young collection is also put off when the
  young generation holds more than `YOUNG_MAX_OBJECTS` (counted at its turn: a list of them, itself a
  walk at about two thirds of a collection's cost per object, 0.7 ms for 4,000 with a standing queue;
  CPython 3.11 keeps no length of a generation, and its net count, `gc.get_count()[0]`, is not one:
  docs/standing-queue.md): that generation is frozen unwalked and the next check, `STEP_S` later,
  walks its own. What a short window gives up: a probe finds only the cycles made and dropped within
  it; longer-lived ones wait, frozen, for the next full collection. CPython's own thresholds stay on,
  `BACKSTOP` times higher, for a callback that allocates that much without yielding to the loop. A
  pause is a callback of its own: the loop's lag counts it, a scheduler call's time does not (inside
  whatever allocation crossed CPython's threshold, a 2 ms decision would become an 80 ms one).
- A full collection (unfreeze, collect everything, freeze the survivors again) when the process's
  memory blocks (`sys.getallocatedblocks`, read every `TICK_S`) grew by `FULL_GROWTH` over what the
  last full collection left (and at least `FULL_MIN_GROWTH_BLOCKS`) and so did the objects the
  collector tracks (`gc.get_freeze_count`, counted only then: a walk of the frozen list, 3 ms for the
  130,000 objects startup leaves, 20-130 ms for the 300,000-470,000 of a standing queue, scattered
  over the heap; the net counts do not add up to it); and, when nothing has been in flight or queued
  for `IDLE_TICKS` ticks, once after any young step since the last full one (at most every
  `IDLE_MIN_INTERVAL_S`). Blocks that grew without the tracked objects are memory no collection can
  free (ints, strings, buffers, the tables of dicts: the approximate prefix index filling its
  endpoints' capacity with a standing queue grows the heap by about 8,000 blocks a second, nearly all
  of them untracked), so the block measure
  starts again from there instead (`skipped_full`): a full collection then, 400 ms with a standing
  queue, would find nothing. Blocks that grew by `FULL_GROWTH_ANYWAY` over what the last full
  collection left make one due whatever the tracked objects did. The share that makes one due adapts
  to what they find: a full collection whose cyclic garbage was under `FULL_GARBAGE_SHARE` of the
  objects it walked doubles it for the next (a quarter, a half, then `FULL_GROWTH_MAX`, a whole), and
  one that found more sets it back to `FULL_GROWTH`. With a standing queue the tracked objects grow for
  minutes with live state (the queued and running requests' records, the tasks the task clock
  remembers for `idle_expiry_s`), and a full collection, 350-1,000 ms, finds almost nothing; a
  workload that makes cycles keeps the quarter's cadence.

Memory stays bounded: cyclic garbage among frozen objects is not collected until the next full
collection. Garbage is tracked objects, each at least a block, so it grows both measures: the garbage
kept is at most the due share (`FULL_GROWTH`, a quarter; up to `FULL_GROWTH_MAX`, a whole, only after
full collections in a row that each found under `FULL_GARBAGE_SHARE` of what they walked) of the
tracked objects the last full collection left (or of the heap's blocks, `FULL_MIN_GROWTH_BLOCKS` on a
small heap; after a peak of load, up to that peak's size until the next idle moment collects) plus one
young generation, and the heap at most `1 + FULL_GROWTH_ANYWAY` times what the last full collection
left; each full collection measures both again, and the first that finds more garbage than that share
sets the due share back to a quarter. A cycle is still collected: while cycles are being made the young
collections find those made and dropped within a step's `YOUNG_INTERVAL_S` (a probe notices them within
`PROBE_EVERY` steps, a second), the full ones the rest.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.core.gcpauses import GcPauses

#: Net allocations of tracked objects that make a young collection due.
YOUNG_THRESHOLD: Final = 10_000
#: Seconds after which a young step is due whatever the count (the count barely moves while the
#: requests that end free as much as those that arrive allocate). A probe's pause grows with it: it walks
#: this long's arrivals that are still alive (20-25 ms a second at 200 requests a second with a standing
#: queue of 1,000, on a quiet core), so it is short enough for a probe to stay well under the 5 ms a
#: decision may take.
YOUNG_INTERVAL_S: Final = 0.1
#: Young steps between two probes (a young collection before the freeze) while the probes find no
#: garbage: the collector walks a tenth of what it would, and cycles made between probes wait for the
#: next probe to notice them (then the steps collect) or for the next full collection.
PROBE_EVERY: Final = 10
#: A young collection that finds this many objects of cyclic garbage (in the `YOUNG_INTERVAL_S` its
#: window is) makes the next step collect too. Fewer are left to the full collections (the heap's
#: growth): a hundred objects a second is a few megabytes an hour, against a walk of the young
#: generation at every step.
GARBAGE_MIN: Final = 10
#: A young collection (a probe, or a step while cycles are found) walks at most this many objects: one
#: whose young generation holds more (the loop's timers came late: a backlog of callbacks ran first) is
#: put off, that generation frozen unwalked, to the next check's (`STEP_S` later). About 0.6 us an
#: object on a quiet core: 2-3 ms.
YOUNG_MAX_OBJECTS: Final = 4_000
#: Seconds between two checks for a due collection (`GcSchedule.step`): a read of three counters.
STEP_S: Final = 0.05
#: A check this much short of `YOUNG_INTERVAL_S` counts as on time: the loop's timers round (uvloop's to
#: the millisecond), so the check two `STEP_S` after a step may come a fraction early.
_EARLY_S: Final = STEP_S / 2
#: CPython's own young threshold is this many times the schedule's: it collects by itself only when a
#: callback allocated that much without yielding to the loop.
BACKSTOP: Final = 10
#: A full collection is due once the memory blocks grew by this share over what the last one left ...
FULL_GROWTH: Final = 0.25
#: ... and by at least this many blocks (about 10-30 MB: a small heap is not collected at every turn),
#: when the tracked objects grew by `FULL_GROWTH` too ...
FULL_MIN_GROWTH_BLOCKS: Final = 250_000
#: ... or, whatever the tracked objects did, once the blocks grew by this share.
FULL_GROWTH_ANYWAY: Final = 1.0
#: A full collection whose cyclic garbage was under this share of the objects it walked doubles the
#: share of growth that makes the next one due (`FULL_GROWTH` after `settle`), up to `FULL_GROWTH_MAX`;
#: one that found more sets it back to `FULL_GROWTH`.
FULL_GARBAGE_SHARE: Final = 0.01
#: The most the share of growth that makes a full collection due becomes: the bound on the cyclic
#: garbage kept, as a share of the tracked objects the last full collection left.
FULL_GROWTH_MAX: Final = FULL_GROWTH_ANYWAY
#: Seconds between the schedule's ticks (the heap read, the idle check).
TICK_S: Final = 1.0
#: Ticks in a row with nothing in flight or queued before an idle full collection.
IDLE_TICKS: Final = 2
#: Seconds at least between two idle full collections.
IDLE_MIN_INTERVAL_S: Final = 10.0


class GcModule(Protocol):
    """What the schedule uses of the `gc` module (tests pass a fake)."""

    @property
    def callbacks(self) -> list[Any]: ...

    def collect(self, generation: int = 2) -> int: ...

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...

    def get_count(self) -> tuple[int, int, int]: ...

    def get_freeze_count(self) -> int: ...

    def get_objects(self, generation: int | None = None) -> list[Any]: ...

    def get_threshold(self) -> tuple[int, int, int]: ...

    def set_threshold(self, threshold: int, threshold1: int = ..., threshold2: int = ..., /) -> None: ...


class GcSchedule:
    """The collector's schedule (see the module docstring); `pauses` (if any) records every
    collection's pause (`gateway.core.gcpauses`) while installed."""

    def __init__(
        self,
        pauses: GcPauses | None = None,
        *,
        collector: GcModule = gc,
        blocks: Callable[[], int] = sys.getallocatedblocks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gc = collector
        self._blocks = blocks
        self._clock = clock
        self._pauses = pauses
        self._settled: tuple[int, int, int] | None = None  # CPython's thresholds before `settle`
        self.live_blocks = 0  # memory blocks after the last full collection (or its re-basing)
        self.full_blocks = 0  # memory blocks after the last full collection
        self.live_tracked = 0  # objects the collector tracked after the last full collection
        self.full_growth = FULL_GROWTH  # the share of growth that makes a full collection due
        self.skipped_full = 0  # block growths without the tracked objects' (no full collection)
        self._young_at = -math.inf  # when the last young collection ran
        self._young_since_full = 0
        self._since_probe = PROBE_EVERY  # young steps since the last young collection (the first probes)
        self._garbage = 0  # cyclic garbage the last young collection found
        self._retry = False  # a young collection was put off: the next check steps
        self.young_put_off = 0  # young collections put off (the young generation was too large)
        self.young_collections = 0
        self._idle_ticks = 0
        self._idle_at = -math.inf  # when the last idle collection ran
        self.full_collections = 0
        self.idle_collections = 0

    def settle(self) -> None:
        """Once startup is done: collect, freeze the survivors, set CPython's thresholds to the backstop,
        install the pause recorder. Until then (and after `close`) `step` and `tick` do nothing: an app
        built in a test process leaves that process's collector alone."""
        if self._settled is not None:
            return
        self._full()
        self._settled = _, older, oldest = self._gc.get_threshold()
        self._gc.set_threshold(YOUNG_THRESHOLD * BACKSTOP, older, oldest)
        if self._pauses is not None:
            self._gc.callbacks.append(self._pauses.callback)

    def close(self) -> None:
        """Hand the collector back: unfreeze (CPython collects everything again), restore its thresholds,
        remove the pause recorder."""
        if self._settled is None:
            return
        self._gc.unfreeze()
        self._gc.set_threshold(*self._settled)
        self._settled = None
        if self._pauses is not None:
            self._gc.callbacks.remove(self._pauses.callback)

    def _full(self) -> int:
        self._gc.unfreeze()
        garbage = self._gc.collect(2)
        self._gc.freeze()
        self.live_blocks = self.full_blocks = self._blocks()
        self.live_tracked = self._gc.get_freeze_count()
        self._young_since_full = 0
        return garbage

    def _full_adapting(self) -> None:
        """A full collection after `settle`'s, whose garbage sets the share that makes the next one due:
        doubled (up to `FULL_GROWTH_MAX`) if under `FULL_GARBAGE_SHARE` of what it walked (the survivors
        and the garbage), `FULL_GROWTH` again if not."""
        garbage = self._full()
        if garbage < FULL_GARBAGE_SHARE * (self.live_tracked + garbage):
            self.full_growth = min(2 * self.full_growth, FULL_GROWTH_MAX)
        else:
            self.full_growth = FULL_GROWTH

    def step(self) -> bool:
        """Run a young step if one is due: a young collection when it is a probe's turn or the last one
        found garbage (unless the young generation holds more than `YOUNG_MAX_OBJECTS`: then at the next
        check), then a freeze; whether it ran."""
        if self._settled is None:
            return False
        now = self._clock()
        if (
            not self._retry
            and self._gc.get_count()[0] <= YOUNG_THRESHOLD
            and now - self._young_at < YOUNG_INTERVAL_S - _EARLY_S
        ):
            return False
        self._young_at = now
        self._since_probe += 1
        self._retry = False
        if self._since_probe >= PROBE_EVERY or self._garbage >= GARBAGE_MIN:
            if len(self._gc.get_objects(0)) > YOUNG_MAX_OBJECTS:
                self._retry = True  # its turn stays: the next check walks a generation of one STEP_S
                self.young_put_off += 1
            else:
                self._since_probe = 0
                self._garbage = self._gc.collect(0)
                self.young_collections += 1
        self._gc.freeze()
        self._young_since_full += 1
        return True

    def full_due(self, blocks: int) -> bool:
        """Whether the heap (`blocks` now) grew enough since the last full collection for another: by
        `FULL_GROWTH_ANYWAY`, or by the due share (`full_growth`) with the tracked objects grown by as
        much (counted only then). A growth of blocks alone re-bases the block measure (`skipped_full`)."""
        if blocks - self.full_blocks >= max(FULL_GROWTH_ANYWAY * self.full_blocks, FULL_MIN_GROWTH_BLOCKS):
            return True
        growth = self.full_growth
        if blocks - self.live_blocks < max(growth * self.live_blocks, FULL_MIN_GROWTH_BLOCKS):
            return False
        tracked = self._gc.get_freeze_count() + self._gc.get_count()[0]
        if tracked - self.live_tracked >= growth * self.live_tracked:
            return True
        self.skipped_full += 1
        self.live_blocks = blocks
        return False

    def tick(self, busy: int) -> None:
        """One tick: `busy` requests are in flight or queued."""
        if self._settled is None:
            return
        self._idle_ticks = 0 if busy else self._idle_ticks + 1
        if self.full_due(self._blocks()):
            self.full_collections += 1
            self._full_adapting()
        elif (
            self._idle_ticks >= IDLE_TICKS
            and self._young_since_full
            and self._clock() - self._idle_at >= IDLE_MIN_INTERVAL_S
        ):
            self._idle_at = self._clock()
            self.idle_collections += 1
            self._full_adapting()

    async def run(self, busy: Callable[[], int]) -> None:
        """`step` every `STEP_S`, `tick` every `TICK_S`, until cancelled."""
        per_tick = round(TICK_S / STEP_S)
        for n in itertools.count(1):
            await asyncio.sleep(STEP_S)
            self.step()
            if n % per_tick == 0:
                self.tick(busy())


class GcScheduleCollector:
    """Exports what the schedule did, at scrape time: `berth_gc_scheduled_collections_total{kind}` (young
    collections its steps ran, full collections the heap's growth made due, idle full collections),
    `berth_gc_young_put_off_total` (young collections put off because the young generation held more
    than `YOUNG_MAX_OBJECTS`: the timer came late), `berth_gc_skipped_full_total` (block growths without
    the tracked objects', which re-based the measure instead of collecting) and
    `berth_gc_full_growth_ratio` (the heap growth that makes the next full collection due)."""

    def __init__(self, schedule: GcSchedule) -> None:
        self._schedule = schedule

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self._schedule
        kinds = CounterMetricFamily(
            "berth_gc_scheduled_collections",
            "Collections the daemon's collector schedule ran, by kind (young, full, idle)",
            labels=["kind"],
        )
        kinds.add_metric(["young"], float(s.young_collections))
        kinds.add_metric(["full"], float(s.full_collections))
        kinds.add_metric(["idle"], float(s.idle_collections))
        yield kinds
        yield CounterMetricFamily(
            "berth_gc_young_put_off",
            "Young collections put off to the next step because the young generation was too large",
            value=float(s.young_put_off),
        )
        yield CounterMetricFamily(
            "berth_gc_skipped_full",
            "Heap growths of memory blocks alone (not tracked objects): the measure re-based, none collected",
            value=float(s.skipped_full),
        )
        yield GaugeMetricFamily(
            "berth_gc_full_growth_ratio",
            "The share of heap growth since the last full collection that makes the next one due",
            value=s.full_growth,
        )
