"""The stall watcher's bookkeeping (loadgen.diag.stallwatch), driven by a scripted clock: a stall opens
when a beat is late by more than the threshold, collects a snapshot per look, closes when the next beat
comes with its gap and the main thread's CPU over it; the report counts the snapshots of busy stalls by
site (the callback's root, our innermost frame, the innermost frame)."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.diag.stallwatch_stalls import Beat, Frame, StallLog, callback_part, site_of
from loadgen.diag.stallwatch_turns import TurnLog, TurnWork, label_of

RUNNER: list[Frame] = [
    ("/venv/lib/python3.11/site-packages/gateway/cli.py", 10, "main"),
    ("/usr/lib/python3.11/asyncio/runners.py", 118, "run"),
    ("/venv/lib/python3.11/site-packages/uvloop/__init__.py", 82, "run"),
]
PARSE: list[Frame] = [
    *RUNNER,
    ("/repo/gateway/core/tasks.py", 43, "_run"),
    ("/repo/gateway/telemetry/scraper.py", 238, "_scrape_metrics"),
    ("/venv/lib/python3.11/re/__init__.py", 200, "match"),
]


def test_the_callback_is_what_follows_the_runner() -> None:
    assert callback_part(RUNNER) == []
    assert callback_part(PARSE) == PARSE[3:]
    assert site_of([]) == ("<loop>", "", "")
    root, own, leaf = site_of(callback_part(PARSE))
    assert root.startswith("_run (gateway/core/tasks.py:43)")
    assert own.startswith("_scrape_metrics (gateway/telemetry/scraper.py:238)")
    assert leaf.startswith("match (")


def test_a_late_beat_opens_a_stall_and_the_next_beat_closes_it() -> None:
    log = StallLog(beat_s=0.001, threshold_s=0.0015)
    b0 = Beat(wall=10.0, cpu=1.0)
    log.poll(10.002, b0, lambda: PARSE)  # 2 ms after the beat: within beat + threshold
    assert log.stalls == []
    log.poll(10.003, b0, lambda: PARSE)  # 3 ms: late, a snapshot
    log.poll(10.004, b0, lambda: RUNNER)  # still late: another
    b1 = Beat(wall=10.0045, cpu=1.004)  # the beat came: 4.5 ms after the last, 4 ms of it on CPU
    log.poll(10.0046, b1, lambda: PARSE)
    assert len(log.stalls) == 1
    stall = log.stalls[0]
    assert stall.gap_s == pytest.approx(0.0045)
    assert stall.cpu_s == pytest.approx(0.004)
    assert stall.busy
    assert len(stall.snapshots) == 2
    # A late beat while the process waited for a CPU: little CPU over the gap, not busy.
    log.poll(10.010, b1, lambda: RUNNER)
    log.poll(10.012, Beat(wall=10.011, cpu=1.0045), lambda: RUNNER)
    assert len(log.stalls) == 2
    assert not log.stalls[1].busy
    doc = log.report()
    assert (doc["stalls"], doc["busy_stalls"]) == (2, 1)
    assert doc["busy_cpu_ms"] == [pytest.approx(4.0)]
    sites = {(s["root"].split(" ")[0], s["snapshots"]) for s in doc["sites"]}
    assert sites == {("_run", 1), ("<loop>", 1)}  # the busy stall's snapshots only
    assert doc["longest"][0]["gap_ms"] == pytest.approx(4.5)


def test_turns_are_counted_and_timed_by_length() -> None:
    turns = TurnLog()
    for ms in (0.1, 0.1, 0.8, 1.2, 2.5, 12.0):
        turns.add(ms / 1000, ms / 2000)
    doc = turns.report()
    assert doc["turns"] == 6
    assert doc["longest_ms"] == pytest.approx(12.0)
    assert [(b["le_ms"], b["turns"]) for b in doc["buckets"]] == [
        (0.25, 2),
        (1.0, 1),
        (1.5, 1),
        (3.0, 1),
        (20.0, 1),
    ]
    assert doc["buckets"][-1]["cpu_ms"] == pytest.approx(6.0)
    total = 0.1 + 0.1 + 0.8 + 1.2 + 2.5 + 12.0
    assert doc["time_share_in_turns"][">1ms"] == pytest.approx((1.2 + 2.5 + 12.0) / total, abs=1e-5)
    assert doc["time_share_in_turns"][">5ms"] == pytest.approx(12.0 / total, abs=1e-5)


def test_only_long_turns_are_broken_down_by_callback() -> None:
    work = TurnWork(long_s=0.001)
    work.turn([(0.0004, "a"), (0.0004, "b")])  # 0.8 ms together: not long
    work.turn([(0.0007, "a"), (0.0002, "b"), (0.0003, "a")])
    doc = work.report()
    assert (doc["turns"], doc["long_turns"], doc["callbacks_per_long_turn"]) == (2, 1, [(3, 1)])
    assert [(c["label"], c["ms"], c["callbacks"]) for c in doc["labels"]] == [("a", 1.0, 2), ("b", 0.2, 1)]
    work.reset()
    assert (work.turns, work.long_turns, work.report()["labels"]) == (0, 0, [])


async def test_a_task_step_is_labelled_by_its_coroutine_and_where_it_waits() -> None:
    async def waits_here(ready: asyncio.Event) -> None:
        await ready.wait()

    ready = asyncio.Event()
    task = asyncio.create_task(waits_here(ready))
    await asyncio.sleep(0)  # the task runs up to its wait
    label = label_of(task.cancel)  # a callback bound to the task, as its steps and wake-ups are
    assert label.startswith("task test_a_task_step_is_labelled_by_its_coroutine_and_where_it_waits.<locals>.")
    assert "from wait (" in label  # asyncio's Event.wait: the innermost frame (none of ours below it)
    assert label_of(test_only_long_turns_are_broken_down_by_callback) == (
        "test_only_long_turns_are_broken_down_by_callback"
    )
    ready.set()
    await task
