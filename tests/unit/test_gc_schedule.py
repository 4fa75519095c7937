"""The collector's schedule (`gateway.core.heap.GcSchedule`) on a fake `gc` module, a fake heap size and
a fake clock; and the pause recorder (`gateway.core.gcpauses.GcPauses`) on fake timers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gateway.core.gcpauses import RECENT_S, GcCollector, GcPauses
from gateway.core.heap import (
    BACKSTOP,
    IDLE_MIN_INTERVAL_S,
    IDLE_TICKS,
    OLDER_MAX,
    OLDER_MIN,
    YOUNG_THRESHOLD,
    GcSchedule,
    older_threshold,
)


class FakeGc:
    """The part of `gc` the schedule uses; a collection runs the callbacks as CPython does and resets
    the counts of the generations it collected."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.threshold = (700, 10, 10)
        self.count = (0, 0, 0)
        self.collections: list[int] = []
        self.frozen = False

    def collect(self, generation: int = 2) -> int:
        self.collections.append(generation)
        for cb in self.callbacks:
            cb("start", {"generation": generation})
        c = list(self.count)
        for g in range(generation + 1):
            c[g] = 0
        if generation < 2:
            c[generation + 1] += 1
        self.count = (c[0], c[1], c[2])
        for cb in self.callbacks:
            cb("stop", {"generation": generation, "collected": 3, "uncollectable": 0})
        return 3

    def freeze(self) -> None:
        self.frozen = True

    def get_count(self) -> tuple[int, int, int]:
        return self.count

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, threshold: int, threshold1: int = 10, threshold2: int = 10, /) -> None:
        self.threshold = (threshold, threshold1, threshold2)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        (0, OLDER_MIN),
        (100_000, OLDER_MIN),  # a small heap: CPython's own rule
        (1_000_000, 25),
        (4_000_000, 100),
        (10**10, OLDER_MAX),
    ],
    ids=["empty", "small", "1M", "4M", "huge"],
)
def test_older_threshold_scales_with_the_heap(blocks: int, expected: int) -> None:
    assert older_threshold(blocks) == expected


def _schedule(blocks: list[int]) -> tuple[GcSchedule, FakeGc, Clock, GcPauses]:
    fake = FakeGc()
    clock = Clock()
    pauses = GcPauses(timer=clock, stamp=clock)
    schedule = GcSchedule(pauses, collector=fake, blocks=lambda: blocks[0], clock=clock)
    return schedule, fake, clock, pauses


def test_settle_collects_freezes_and_scales_the_thresholds_to_the_heap() -> None:
    schedule, fake, _, _ = _schedule([2_000_000])
    schedule.settle()
    assert fake.collections == [2]
    assert fake.frozen
    assert fake.threshold == (
        YOUNG_THRESHOLD * BACKSTOP,
        50,
        10,
    )  # the oldest generation's count is CPython's
    assert len(fake.callbacks) == 2
    schedule.settle()  # a second settle installs nothing twice
    assert len(fake.callbacks) == 2
    schedule.close()
    assert fake.callbacks == []


def test_a_full_collection_rescales_at_the_next_tick() -> None:
    heap = [1_000_000]
    schedule, fake, _, _ = _schedule(heap)
    schedule.settle()
    assert fake.threshold[1] == 25
    heap[0] = 8_000_000  # the load grew; CPython runs a full collection
    fake.collect(2)
    assert schedule.live_blocks == 8_000_000
    assert fake.threshold[1] == 25  # not from inside the collector's callback
    schedule.tick(busy=5)
    assert fake.threshold[1] == 200
    heap[0] = 9_000_000
    fake.collect(1)  # a middle collection does not measure the heap
    schedule.tick(busy=5)
    assert fake.threshold[1] == 200


def test_idle_collects_what_was_promoted_once_then_waits_for_more() -> None:
    schedule, fake, clock, _ = _schedule([1_000_000])
    schedule.settle()
    fake.collections.clear()
    fake.count = (500, 3, 0)  # three young collections promoted survivors
    for _ in range(IDLE_TICKS - 1):
        schedule.tick(busy=0)
    schedule.tick(busy=1)  # not idle long enough: a request came
    assert fake.collections == []
    for _ in range(IDLE_TICKS):
        clock.t += 1.0
        schedule.tick(busy=0)
    assert fake.collections == [2]
    assert schedule.idle_collections == 1
    clock.t += IDLE_MIN_INTERVAL_S
    schedule.tick(busy=0)  # nothing promoted since
    assert fake.collections == [2]
    fake.count = (100, 1, 0)
    clock.t += 1.0
    schedule.tick(busy=0)
    assert fake.collections == [2, 2]


def test_idle_collections_are_spaced() -> None:
    schedule, fake, clock, _ = _schedule([1_000_000])
    schedule.settle()
    fake.collections.clear()
    fake.count = (0, 1, 0)
    for _ in range(IDLE_TICKS):
        schedule.tick(busy=0)
    assert fake.collections == [2]
    fake.count = (0, 0, 1)
    clock.t += IDLE_MIN_INTERVAL_S - 1.0
    schedule.tick(busy=0)
    assert fake.collections == [2]
    clock.t += 1.0
    schedule.tick(busy=0)
    assert fake.collections == [2, 2]


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


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        ((YOUNG_THRESHOLD, 0, 0), None),  # not past the young threshold
        ((YOUNG_THRESHOLD + 1, 0, 0), 0),
        ((YOUNG_THRESHOLD + 1, 25, 0), 0),  # the middle threshold is 25 at 1M blocks
        ((YOUNG_THRESHOLD + 1, 26, 0), 1),
        ((YOUNG_THRESHOLD + 1, 26, 10), 1),
        ((YOUNG_THRESHOLD + 1, 3, 11), 2),  # CPython's choice: the oldest generation past its threshold
        ((5, 30, 30), None),  # nothing is due while the young generation is below its threshold
    ],
    ids=["below", "young", "middle-not-yet", "middle", "oldest-not-yet", "oldest", "idle-counts"],
)
def test_step_runs_the_collection_cpython_would_choose(
    count: tuple[int, int, int], expected: int | None
) -> None:
    schedule, fake, _, _ = _schedule([1_000_000])
    schedule.settle()
    fake.collections.clear()
    fake.count = count
    assert schedule.step() == expected
    assert fake.collections == ([] if expected is None else [expected])


def test_cpython_collects_by_itself_only_past_the_backstop() -> None:
    schedule, fake, _, _ = _schedule([1_000_000])
    schedule.settle()
    assert fake.threshold[0] == YOUNG_THRESHOLD * BACKSTOP
    fake.count = (YOUNG_THRESHOLD + 1, 0, 0)
    schedule.step()
    assert fake.count[0] == 0  # the young generation is collected by the schedule, long before that
