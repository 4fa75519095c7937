"""The share of growth that makes a full collection due (`gateway.core.heap.GcSchedule.full_growth`): it
doubles after full collections that find almost no cyclic garbage and comes back to a quarter after one
that finds some, so live growth gets rarer full collections and a workload that makes cycles keeps the
quarter's cadence, its garbage within the bound the module states. On a fake `gc` whose heap is live
objects and cycles (ten memory blocks an object)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.heap import (
    FULL_GARBAGE_SHARE,
    FULL_GROWTH,
    FULL_GROWTH_MAX,
    GcSchedule,
    GcScheduleCollector,
)
from tests.unit.test_gc_schedule import Clock, FakeGc

BLOCKS_PER_OBJECT = 10


class CyclicHeap(FakeGc):
    """Tracked objects: `live` ones and `cycles` (garbage only a full collection frees)."""

    def __init__(self, live: int) -> None:
        super().__init__(lambda: self.live + self.cycles)
        self.live = live
        self.cycles = 0

    def collect(self, generation: int = 2) -> int:
        self.garbage = self.cycles if generation == 2 else 0
        if generation == 2:
            self.cycles = 0
        return super().collect(generation)


def _settled(live: int) -> tuple[GcSchedule, CyclicHeap]:
    heap = CyclicHeap(live)
    schedule = GcSchedule(collector=heap, blocks=lambda: BLOCKS_PER_OBJECT * heap.tracked(), clock=Clock())
    schedule.settle()
    return schedule, heap


def _fulls(schedule: GcSchedule, heap: CyclicHeap, ticks: int, live: int, cycles: int) -> list[int]:
    """`ticks` ticks under load, each after `live` more live objects and `cycles` more garbage; the ticks
    at which a full collection ran."""
    ran = []
    for t in range(ticks):
        heap.live += live
        heap.cycles += cycles
        before = schedule.full_collections
        schedule.tick(busy=5)
        if schedule.full_collections > before:
            ran.append(t)
    return ran


def test_full_collections_that_find_nothing_get_rarer_up_to_the_cap() -> None:
    """Live state growing steadily (a standing queue filling, tasks remembered): the share that makes the
    next one due goes a quarter, a half, a whole, and stays there while nothing is found."""
    schedule, heap = _settled(100_000)
    assert schedule.full_growth == FULL_GROWTH  # settle's collection sets nothing
    ran = _fulls(schedule, heap, 1_000, live=1_000, cycles=0)
    # 100k -> 125k (a quarter more) -> 188k (a half) -> 376k (a whole) -> 752k
    assert ran == [24, 87, 275, 651]
    assert schedule.full_growth == FULL_GROWTH_MAX
    # The quarter's cadence would have run one at every quarter's growth: 125k, 156k, 195k, ...
    quarter_cadence = sum(1 for n in range(30) if 100_000 * 1.25**n <= 1_100_000) - 1
    assert len(ran) < quarter_cadence == 10


def test_a_full_collection_that_finds_garbage_sets_the_share_back_to_a_quarter() -> None:
    schedule, heap = _settled(100_000)
    _fulls(schedule, heap, 300, live=1_000, cycles=0)
    assert schedule.full_growth == FULL_GROWTH_MAX
    heap.live *= 2  # grown by a whole: the next full collection is due ...
    heap.cycles = round(2 * FULL_GARBAGE_SHARE * heap.live)  # ... and finds a fiftieth of cycles
    schedule.tick(busy=5)
    assert heap.cycles == 0
    assert schedule.full_growth == FULL_GROWTH
    heap.live = round(heap.live * (1 + FULL_GROWTH))  # a quarter again makes the next due
    heap.cycles = round(FULL_GARBAGE_SHARE * heap.live / 2)  # which finds a negligible share
    schedule.tick(busy=5)
    assert (heap.cycles, schedule.full_growth) == (0, 2 * FULL_GROWTH)


def test_a_workload_that_makes_cycles_keeps_the_quarter_cadence() -> None:
    """Every tick drops a thousand objects of cycles (nothing live grows): a full collection every quarter's
    growth, as before the share adapted, and the garbage kept within a quarter of the live objects."""
    schedule, heap = _settled(100_000)
    kept = []
    for _ in range(200):
        kept.append(heap.cycles)
        _fulls(schedule, heap, 1, live=0, cycles=1_000)
        assert schedule.full_growth == FULL_GROWTH
    assert schedule.full_collections == 8  # every 25 ticks
    assert max(kept) <= FULL_GROWTH * heap.live


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20_000), st.integers(0, 5_000)),
        min_size=1,
        max_size=400,
    )
)
def test_the_garbage_kept_stays_within_the_stated_bound(steps: list[tuple[int, int]]) -> None:
    """Whatever grows, live objects or cycles, the cycles kept before a tick are at most the due share
    (never over `FULL_GROWTH_MAX`) of the tracked objects the last full collection left, plus what one tick
    added; and the share is `FULL_GROWTH` after every full collection that found garbage."""
    schedule, heap = _settled(100_000)
    for live, cycles in steps:
        share = schedule.full_growth
        assert FULL_GROWTH <= share <= FULL_GROWTH_MAX
        assert heap.cycles <= share * schedule.live_tracked + 20_000 + 5_000
        found = heap.cycles + cycles
        before = schedule.full_collections
        _fulls(schedule, heap, 1, live=live, cycles=cycles)
        if schedule.full_collections > before:
            walked = schedule.live_tracked + found
            doubled = min(2 * share, FULL_GROWTH_MAX)
            assert schedule.full_growth == (FULL_GROWTH if found >= FULL_GARBAGE_SHARE * walked else doubled)


def _exported(schedule: GcSchedule) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in GcScheduleCollector(schedule).collect()
        for s in m.samples
    }


def test_the_schedule_exports_its_collections_its_put_offs_and_its_due_share() -> None:
    """What a scrape reads is what the schedule did: four full collections of live growth, a due share
    doubled to the cap, and nothing young (no step ran)."""
    schedule, heap = _settled(100_000)
    before = _exported(schedule)
    assert before[("berth_gc_full_growth_ratio", ())] == FULL_GROWTH
    assert before[("berth_gc_scheduled_collections_total", (("kind", "full"),))] == 0
    _fulls(schedule, heap, 1_000, live=1_000, cycles=0)
    schedule.young_put_off = 3
    after = _exported(schedule)
    assert after[("berth_gc_scheduled_collections_total", (("kind", "full"),))] == 4
    assert after[("berth_gc_scheduled_collections_total", (("kind", "young"),))] == 0
    assert after[("berth_gc_scheduled_collections_total", (("kind", "idle"),))] == 0
    assert after[("berth_gc_young_put_off_total", ())] == 3
    assert after[("berth_gc_skipped_full_total", ())] == schedule.skipped_full
    assert after[("berth_gc_full_growth_ratio", ())] == FULL_GROWTH_MAX
