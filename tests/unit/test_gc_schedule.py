"""The collector's schedule (`gateway.core.heap.GcSchedule`) on a fake `gc` module, a fake heap size and
a fake clock; and the pause recorder (`gateway.core.gcpauses.GcPauses`) on fake timers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from gateway.core.gcpauses import RECENT_S, GcCollector, GcPauses
from gateway.core.heap import (
    BACKSTOP,
    FULL_MIN_GROWTH_BLOCKS,
    GARBAGE_MIN,
    IDLE_MIN_INTERVAL_S,
    IDLE_TICKS,
    PROBE_EVERY,
    STEP_S,
    YOUNG_INTERVAL_S,
    YOUNG_MAX_OBJECTS,
    YOUNG_THRESHOLD,
    GcSchedule,
)


class FakeGc:
    """The part of `gc` the schedule uses; a collection runs the callbacks as CPython does and resets
    the counts of the generations it collected."""

    def __init__(self, tracked: Callable[[], int] = lambda: 0) -> None:
        self.tracked = tracked  # the objects in the permanent generation
        self.counted = 0  # walks of the permanent generation (`get_freeze_count`)
        self.callbacks: list[Any] = []
        self.threshold = (700, 10, 10)
        self.count = (0, 0, 0)
        self.log: list[str] = []
        self.garbage = 3  # cyclic garbage a collection finds
        self.young = 0  # objects in the young generation

    def get_objects(self, generation: int | None = None) -> list[Any]:
        assert generation == 0
        return [None] * self.young

    def collect(self, generation: int = 2) -> int:
        self.log.append(f"collect {generation}")
        for cb in self.callbacks:
            cb("start", {"generation": generation})
        c = list(self.count)
        for g in range(generation + 1):
            c[g] = 0
        if generation < 2:
            c[generation + 1] += 1
        self.count = (c[0], c[1], c[2])
        for cb in self.callbacks:
            cb("stop", {"generation": generation, "collected": self.garbage, "uncollectable": 0})
        return self.garbage

    def freeze(self) -> None:
        self.log.append("freeze")
        self.count = (0, *self.count[1:])  # CPython's freeze resets the young count too

    def unfreeze(self) -> None:
        self.log.append("unfreeze")

    def get_count(self) -> tuple[int, int, int]:
        return self.count

    def get_freeze_count(self) -> int:
        self.counted += 1
        return self.tracked()

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, threshold: int, threshold1: int = 10, threshold2: int = 10, /) -> None:
        self.threshold = (threshold, threshold1, threshold2)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _schedule(
    blocks: list[int], tracked: list[int] | None = None
) -> tuple[GcSchedule, FakeGc, Clock, GcPauses]:
    """`tracked`: the objects the collector tracks (default: a tenth of the blocks, growing with them)."""
    fake = FakeGc((lambda: blocks[0] // 10) if tracked is None else (lambda: tracked[0]))
    clock = Clock()
    pauses = GcPauses(timer=clock, stamp=clock)
    schedule = GcSchedule(pauses, collector=fake, blocks=lambda: blocks[0], clock=clock)
    return schedule, fake, clock, pauses


def test_settle_collects_freezes_and_leaves_cpython_a_backstop() -> None:
    schedule, fake, _, pauses = _schedule([2_000_000])
    schedule.settle()
    assert fake.log == ["unfreeze", "collect 2", "freeze"]
    assert fake.threshold == (YOUNG_THRESHOLD * BACKSTOP, 10, 10)
    assert schedule.live_blocks == 2_000_000
    assert fake.callbacks == [pauses.callback]
    schedule.settle()  # a second settle does nothing
    assert fake.callbacks == [pauses.callback]
    assert fake.log == ["unfreeze", "collect 2", "freeze"]
    schedule.close()
    assert fake.callbacks == []
    assert fake.threshold == (700, 10, 10)  # CPython's again
    assert fake.log[-1] == "unfreeze"


def test_nothing_is_collected_or_frozen_before_settle_nor_after_close() -> None:
    schedule, fake, clock, _ = _schedule([10**9])
    fake.count = (YOUNG_THRESHOLD * 5, 0, 0)
    assert not schedule.step()
    schedule.tick(busy=0)
    schedule.tick(busy=0)
    schedule.tick(busy=0)
    assert fake.log == []
    schedule.settle()
    schedule.close()
    fake.log.clear()
    clock.t += 100.0
    assert not schedule.step()
    schedule.tick(busy=0)
    assert fake.log == []


def test_a_young_step_is_due_by_count_or_by_time_and_freezes_the_young_generation() -> None:
    schedule, fake, clock, _ = _schedule([1_000_000])
    schedule.settle()
    fake.log.clear()
    assert schedule.step()  # the first: no young step yet; it probes
    assert fake.log == ["collect 0", "freeze"]
    fake.log.clear()
    clock.t += YOUNG_INTERVAL_S / 2
    assert not schedule.step()
    fake.count = (YOUNG_THRESHOLD + 1, 0, 0)  # an allocation burst: due before its time
    assert schedule.step()
    clock.t += YOUNG_INTERVAL_S / 2
    assert not schedule.step()
    clock.t += YOUNG_INTERVAL_S / 2
    assert schedule.step()  # its time
    assert fake.log == ["freeze"] * 2  # the last probe found (almost) no garbage: no walk


def test_a_step_collects_only_as_a_probe_until_a_collection_finds_garbage() -> None:
    schedule, fake, clock, _ = _schedule([1_000_000])
    schedule.settle()
    fake.log.clear()

    def steps(n: int) -> list[str]:
        fake.log.clear()
        for _ in range(n):
            clock.t += YOUNG_INTERVAL_S
            assert schedule.step()
        return fake.log

    fake.garbage = GARBAGE_MIN - 1
    assert steps(1) == ["collect 0", "freeze"]  # the first probe
    assert steps(PROBE_EVERY - 1) == ["freeze"] * (PROBE_EVERY - 1)
    assert steps(PROBE_EVERY) == ["collect 0", "freeze"] + ["freeze"] * (PROBE_EVERY - 1)
    fake.garbage = GARBAGE_MIN  # cycles are being made: the next probe finds them ...
    assert steps(PROBE_EVERY) == ["collect 0", "freeze"] * PROBE_EVERY  # ... and every step collects
    fake.garbage = 0  # ... until one finds too few
    assert steps(PROBE_EVERY) == ["collect 0", "freeze"] + ["freeze"] * (PROBE_EVERY - 1)
    assert schedule.young_collections == 3 + PROBE_EVERY


class YoungGc(FakeGc):
    """A fake `gc` whose young generation holds what arrived since the last freeze or collection and is
    still alive: `rate` objects a second of the fake clock (a standing queue's arrivals). A collection
    records how many objects it walked; the net count (`get_count`) stays near 0, as it does while the
    requests that end free what the arrivals allocate."""

    def __init__(self, clock: Clock, rate: float) -> None:
        super().__init__()
        self.clock, self.rate = clock, rate
        self.since = clock.t  # the young generation holds what arrived since then
        self.walked: list[float] = []

    def get_objects(self, generation: int | None = None) -> list[Any]:
        return [None] * round((self.clock.t - self.since) * self.rate)

    def collect(self, generation: int = 2) -> int:
        if generation == 0:
            self.walked.append((self.clock.t - self.since) * self.rate)
        self.since = self.clock.t
        return super().collect(generation)

    def freeze(self) -> None:
        self.since = self.clock.t
        super().freeze()


@pytest.mark.parametrize("early_s", [0.0, 0.0004], ids=["on-time", "timers-early"])
def test_a_probe_walks_one_intervals_arrivals_and_comes_every_probe_every_intervals(early_s: float) -> None:
    """The pause of a probe is bounded by the steps' interval, not by how long since the last probe:
    with 35,000 live arrivals a second (a standing queue of 1,000 before 100 endpoints) each probe walks
    at most `YOUNG_INTERVAL_S` of them (plus one check's worth), and the checks that the loop's timers
    bring a fraction early still make a step every `YOUNG_INTERVAL_S`."""
    clock = Clock()
    fake = YoungGc(clock, rate=35_000.0)
    schedule = GcSchedule(collector=fake, blocks=lambda: 1_000_000, clock=clock)
    schedule.settle()
    fake.garbage = GARBAGE_MIN - 1
    fake.walked.clear()
    seconds = 10.0
    steps = 0
    for _ in range(round(seconds / STEP_S)):
        clock.t += STEP_S - early_s
        steps += schedule.step()
    assert steps == pytest.approx(seconds / YOUNG_INTERVAL_S, abs=1)
    assert len(fake.walked) == pytest.approx(steps / PROBE_EVERY, abs=1)
    assert max(fake.walked[1:]) <= 35_000 * (YOUNG_INTERVAL_S + STEP_S)  # the first: since settle
    # A walk takes about 0.7 us per object on a quiet core (a second's 30,000-35,000: 20-25 ms): a
    # probe stays under the 5 ms a scheduler call may take.
    assert max(fake.walked) <= 5_000


def test_a_young_collection_over_a_too_large_generation_is_put_off_to_the_next_check() -> None:
    """A late timer (a backlog of callbacks ran first) finds a large young generation at a probe's
    turn: it is frozen unwalked, and the next check (one `STEP_S` later, whatever the interval) walks
    the smaller one that arrived since; a step while cycles are found is put off the same way."""
    schedule, fake, clock, _ = _schedule([1_000_000])
    schedule.settle()
    fake.garbage = 0
    fake.log.clear()
    fake.young = YOUNG_MAX_OBJECTS + 1
    assert schedule.step()  # the first probe's turn: too large
    assert fake.log == ["freeze"]
    assert schedule.young_put_off == 1
    fake.young = YOUNG_MAX_OBJECTS
    clock.t += STEP_S  # before the interval, but the put-off probe is due
    assert schedule.step()
    assert fake.log == ["freeze", "collect 0", "freeze"]
    clock.t += STEP_S
    assert not schedule.step()  # back to the interval
    fake.log.clear()
    fake.garbage = GARBAGE_MIN  # cycles: every step collects ...
    for _ in range(PROBE_EVERY):
        clock.t += YOUNG_INTERVAL_S
        assert schedule.step()
    assert fake.log[-2:] == ["collect 0", "freeze"]
    fake.log.clear()
    fake.young = YOUNG_MAX_OBJECTS + 1  # ... unless its generation is too large
    clock.t += YOUNG_INTERVAL_S
    assert schedule.step()
    fake.young = 10
    clock.t += STEP_S
    assert schedule.step()
    assert fake.log == ["freeze", "collect 0", "freeze"]
    assert schedule.young_put_off == 2


@pytest.mark.parametrize(
    ("live", "now", "due"),
    [
        (1_000_000, 1_249_999, False),
        (1_000_000, 1_250_000, True),  # a quarter more
        (100_000, 300_000, False),  # a small heap: at least FULL_MIN_GROWTH_BLOCKS more
        (100_000, 100_000 + FULL_MIN_GROWTH_BLOCKS, True),
        (4_000_000, 4_900_000, False),
        (4_000_000, 5_000_000, True),
    ],
    ids=["1M-under", "1M-due", "small-under", "small-due", "4M-under", "4M-due"],
)
def test_a_full_collection_is_due_when_the_heap_grew_by_a_quarter(live: int, now: int, due: bool) -> None:
    heap = [live]
    schedule, _, _, _ = _schedule(heap)  # the tracked objects grow with the blocks
    schedule.settle()
    heap[0] = now
    assert schedule.full_due(now) is due


@pytest.mark.parametrize(
    ("tracked_now", "due"),
    [
        pytest.param(100_000, False, id="blocks-alone"),
        pytest.param(124_999, False, id="tracked-under-a-quarter"),
        pytest.param(125_000, True, id="tracked-a-quarter"),
    ],
)
def test_blocks_that_grew_without_the_tracked_objects_make_no_full_collection(
    tracked_now: int, due: bool
) -> None:
    """A heap grown by memory the collector does not track (an index of ints filling up) is no garbage it
    could find: the block measure starts again from there, and only the tracked objects' growth (or a
    doubled heap) makes a full collection due."""
    heap, tracked = [2_000_000], [100_000]
    schedule, fake, _, _ = _schedule(heap, tracked)
    schedule.settle()
    assert (schedule.live_tracked, fake.counted) == (100_000, 1)
    assert schedule.full_due(2_400_000) is False  # under a quarter more blocks: nothing counted
    assert fake.counted == 1
    tracked[0] = tracked_now
    assert schedule.full_due(2_500_000) is due
    assert fake.counted == 2
    if not due:
        assert (schedule.skipped_full, schedule.live_blocks) == (1, 2_500_000)
        assert schedule.full_due(3_000_000) is False  # a quarter over 2,500,000 is 3,125,000
        assert fake.counted == 2


def test_a_heap_that_doubled_since_the_last_full_collection_gets_one_whatever_was_tracked() -> None:
    heap, tracked = [2_000_000], [100_000]
    schedule, fake, _, _ = _schedule(heap, tracked)
    schedule.settle()
    fake.log.clear()
    for blocks in (2_500_000, 3_125_000, 3_906_250):  # a quarter more each time, nothing tracked
        heap[0] = blocks
        schedule.tick(busy=5)
    assert (schedule.skipped_full, schedule.full_collections, fake.log) == (3, 0, [])
    assert schedule.live_blocks == 3_906_250
    heap[0] = 4_000_000  # twice what the last full collection left
    schedule.tick(busy=5)
    assert fake.log == ["unfreeze", "collect 2", "freeze"]
    assert schedule.full_collections == 1
    assert (schedule.live_blocks, schedule.full_blocks) == (4_000_000, 4_000_000)


def test_the_tick_runs_a_full_collection_when_the_heap_grew_and_measures_it_again() -> None:
    heap = [1_000_000]
    schedule, fake, _, _ = _schedule(heap)
    schedule.settle()
    fake.log.clear()
    heap[0] = 1_200_000
    schedule.tick(busy=5)
    assert fake.log == []
    heap[0] = 1_300_000
    schedule.tick(busy=5)
    assert fake.log == ["unfreeze", "collect 2", "freeze"]  # the frozen objects too
    assert schedule.live_blocks == 1_300_000
    assert schedule.full_collections == 1
    schedule.tick(busy=5)
    assert schedule.full_collections == 1


def test_idle_collects_once_after_young_collections_then_waits_for_more() -> None:
    schedule, fake, clock, _ = _schedule([1_000_000])
    schedule.settle()
    for _ in range(IDLE_TICKS):
        schedule.tick(busy=0)
    assert schedule.idle_collections == 0  # nothing collected young since the full one
    schedule.tick(busy=1)  # a request came
    schedule.step()
    fake.log.clear()
    for _ in range(IDLE_TICKS - 1):
        schedule.tick(busy=0)
    schedule.tick(busy=1)  # another: not idle long enough
    assert fake.log == []
    for _ in range(IDLE_TICKS):
        clock.t += 1.0
        schedule.tick(busy=0)
    assert fake.log == ["unfreeze", "collect 2", "freeze"]
    assert schedule.idle_collections == 1
    schedule.step()
    clock.t += 1.0
    schedule.tick(busy=0)
    assert schedule.idle_collections == 1  # too soon after the last
    clock.t += IDLE_MIN_INTERVAL_S
    schedule.tick(busy=0)
    assert schedule.idle_collections == 2
    clock.t += IDLE_MIN_INTERVAL_S
    schedule.tick(busy=0)
    assert schedule.idle_collections == 2  # no young collection since


def test_the_pauses_are_recorded_per_generation_and_the_long_ones_kept() -> None:
    clock = Clock()
    pauses = GcPauses(timer=clock, stamp=clock, cpu=lambda: clock.t / 2, keep=2)

    def collect(gen: int, seconds: float, collected: int = 0) -> None:
        info: Mapping[str, int] = {"generation": gen}
        pauses.callback("start", info)
        clock.t += seconds
        pauses.callback("stop", {"generation": gen, "collected": collected, "uncollectable": 0})

    collect(0, 0.0002, collected=4)
    collect(1, 0.004)
    collect(2, 0.120, collected=7)
    collect(0, 2 * RECENT_S)
    assert [pauses.gens[g].count for g in ("0", "1", "2")] == [2, 1, 1]
    assert pauses.gens["2"].max_s == pytest.approx(0.120)
    assert pauses.collected == {"0": 4, "1": 0, "2": 7}
    assert pauses.recent_taken == 3
    doc = pauses.document(after=1)
    assert [p[1] for p in doc["pauses"]] == [2, 0]  # the last two kept, numbered above 1
    assert doc["pauses"][0][0] == pytest.approx(clock.t - 2 * RECENT_S)
    assert pauses.document(after=3)["pauses"] == []
    assert doc["pauses"][0][3] == pytest.approx(0.06)  # half of it on the CPU
    assert doc["generations"]["2"] == {
        "count": 1,
        "sum_s": pytest.approx(0.12),
        "max_s": pytest.approx(0.12),
        "cpu_s": pytest.approx(0.06),
        "collected": 7,
    }


def test_the_collector_exports_the_histogram_the_maximum_and_the_collected_objects() -> None:
    clock = Clock()
    pauses = GcPauses(timer=clock, stamp=clock)
    pauses.callback("start", {"generation": 2})
    clock.t += 0.03
    pauses.callback("stop", {"generation": 2, "collected": 5})
    metrics = {m.name: m for m in GcCollector(pauses).collect()}
    assert set(metrics) == {
        "berth_gc_pause_seconds",
        "berth_gc_pause_max_seconds",
        "berth_gc_collected_objects",
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for s in metrics["berth_gc_pause_seconds"].samples
    }
    assert samples[("berth_gc_pause_seconds_bucket", (("generation", "2"), ("le", "0.025")))] == 0
    assert samples[("berth_gc_pause_seconds_bucket", (("generation", "2"), ("le", "0.05")))] == 1
    assert samples[("berth_gc_pause_seconds_count", (("generation", "2"),))] == 1
    collected = {
        s.labels["generation"]: s.value
        for s in metrics["berth_gc_collected_objects"].samples
        if s.name.endswith("_total")
    }
    assert collected == {"0": 0, "1": 0, "2": 5}
