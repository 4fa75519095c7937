"""The stall watcher's view of the loop's turns and callbacks: every turn's length (`TurnLog`), the
callbacks of the long turns by label (`TurnWork`, fed by `time_callbacks`, which patches the stdlib loop),
and asyncio debug mode's slow-callback lines (`SlowCallbacks`).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from loadgen.diag.stallwatch_stalls import OWN, Frame, _frame, _short

#: Upper edges (ms) of the turn-length histogram's buckets (the last one: everything longer).
TURN_EDGES_MS: Final = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, math.inf)


@dataclass(slots=True)
class TurnLog:
    """The event loop's turns, as a callback that re-arms itself with `call_soon` sees them: it runs once
    per turn (a turn runs the callbacks that were ready when it began; what they make ready waits for
    the next), so the time between two of its runs is one turn: the timers, the ready callbacks and the
    I/O callbacks. A timer due in a turn waits for the rest of it: the share of the time spent in turns
    longer than 1 ms is about the share of a lag monitor's samples that read more than a fraction of a
    millisecond. Counts and time (wall; the main thread's CPU beside it) per bucket of `TURN_EDGES_MS`.
    The spinner keeps the loop from sleeping in its poll: use it under load."""

    counts: list[int] = field(default_factory=lambda: [0] * len(TURN_EDGES_MS))
    wall_s: list[float] = field(default_factory=lambda: [0.0] * len(TURN_EDGES_MS))
    cpu_s: list[float] = field(default_factory=lambda: [0.0] * len(TURN_EDGES_MS))
    longest_ms: float = 0.0

    def add(self, wall_s: float, cpu_s: float) -> None:
        ms = wall_s * 1000
        i = bisect.bisect_left(TURN_EDGES_MS, ms)
        self.counts[i] += 1
        self.wall_s[i] += wall_s
        self.cpu_s[i] += cpu_s
        self.longest_ms = max(self.longest_ms, ms)

    def report(self) -> dict[str, Any]:
        total = sum(self.wall_s)
        above = {
            f">{edge:g}ms": round(sum(self.wall_s[i + 1 :]) / total, 5) if total else 0.0
            for i, edge in enumerate(TURN_EDGES_MS[:-1])
            if edge >= 1.0
        }
        return {
            "turns": sum(self.counts),
            "seconds": round(total, 3),
            "mean_us": round(1e6 * total / sum(self.counts), 1) if sum(self.counts) else 0.0,
            "longest_ms": round(self.longest_ms, 3),
            "time_share_in_turns": above,
            "buckets": [
                {"le_ms": edge, "turns": n, "wall_ms": round(w * 1000, 3), "cpu_ms": round(c * 1000, 3)}
                for edge, n, w, c in zip(TURN_EDGES_MS, self.counts, self.wall_s, self.cpu_s, strict=True)
                if n
            ],
        }


def label_of(callback: Any) -> str:
    """A callback by what it runs: a task's step by its coroutine and the line it resumes from (our own
    innermost frame when there is one), any other callback by its qualified name."""
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        frames: list[Frame] = []
        c: Any = coro
        while c is not None:
            f = getattr(c, "cr_frame", None) or getattr(c, "gi_frame", None)
            if f is None:
                break
            frames.append(_frame(f, f.f_lineno))
            c = getattr(c, "cr_await", None) or getattr(c, "gi_yieldfrom", None)
        own = [f for f in frames if any(p in f[0] for p in OWN)]
        where = _short(own[-1] if own else frames[-1]) if frames else "(starting)"
        return f"task {getattr(coro, '__qualname__', '?')} from {where}"
    return getattr(callback, "__qualname__", None) or type(callback).__qualname__


@dataclass(slots=True)
class TurnWork:
    """What the loop's long turns were made of (the stdlib loop only: each callback timed as it runs).
    A turn is long when its callbacks took more than `long_s` together; for those, time and count by
    callback label, and how many callbacks each held."""

    long_s: float
    turns: int = 0
    long_turns: int = 0
    long_work_s: float = 0.0
    by_label: dict[str, float] = field(default_factory=dict)
    n_by_label: Counter[str] = field(default_factory=Counter)
    callbacks_per_long_turn: Counter[int] = field(default_factory=Counter)

    def reset(self) -> None:
        self.turns = self.long_turns = 0
        self.long_work_s = 0.0
        self.by_label, self.n_by_label, self.callbacks_per_long_turn = {}, Counter(), Counter()

    def turn(self, callbacks: Sequence[tuple[float, str]]) -> None:
        self.turns += 1
        work = sum(t for t, _ in callbacks)
        if work <= self.long_s:
            return
        self.long_turns += 1
        self.long_work_s += work
        self.callbacks_per_long_turn[len(callbacks)] += 1
        for t, label in callbacks:
            self.by_label[label] = self.by_label.get(label, 0.0) + t
            self.n_by_label[label] += 1

    def report(self, top: int = 30) -> dict[str, Any]:
        return {
            "long_ms": self.long_s * 1000,
            "turns": self.turns,
            "long_turns": self.long_turns,
            "long_work_ms": round(self.long_work_s * 1000, 3),
            "callbacks_per_long_turn": sorted(self.callbacks_per_long_turn.items()),
            "labels": [
                {"label": label, "ms": round(t * 1000, 3), "callbacks": self.n_by_label[label]}
                for label, t in sorted(self.by_label.items(), key=lambda kv: kv[1], reverse=True)[:top]
            ],
        }


def time_callbacks(work: TurnWork) -> None:
    """Time every callback of the stdlib loop and hand each turn's to `work` (patches asyncio's
    `Handle._run` and `BaseEventLoop._run_once` in this process)."""
    from asyncio import base_events, events

    run = events.Handle._run
    run_once = base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
    current: list[tuple[float, str]] = []
    clock = time.perf_counter

    def timed_run(handle: events.Handle) -> None:
        label = label_of(handle._callback)  # type: ignore[attr-defined]
        t0 = clock()
        run(handle)
        current.append((clock() - t0, label))

    def timed_run_once(loop: asyncio.AbstractEventLoop) -> None:
        current.clear()
        run_once(loop)
        work.turn(current)

    events.Handle._run = timed_run  # type: ignore[method-assign,assignment]
    base_events.BaseEventLoop._run_once = timed_run_once  # type: ignore[attr-defined]


class SlowCallbacks(logging.Handler):
    """asyncio's debug-mode lines about callbacks slower than `slow_callback_duration`."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Executing"):
            self.lines.append(record.getMessage()[:400])
