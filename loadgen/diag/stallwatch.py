"""What holds a running asyncio server's event loop: a watchdog thread that snapshots the main thread's
stack whenever the loop has not ticked for longer than a threshold, and a report of where those
snapshots were (by the callback that was running and the code inside it), with the garbage collector's
pauses beside them.

    berth-loadgen diag stallwatch [--threshold-ms 1.5] [--out stalls.json] -- gateway.cli serve ...

The target is a module run as `python -m MODULE ARGS` would run it, in this process. Once its event loop
runs (the watchdog finds it in the main thread's frames), a heartbeat callback re-arms itself every
`--beat-ms`; the watchdog thread polls every `--poll-ms` and, while the last beat is older than the beat
interval plus the threshold, records the main thread's stack (`sys._current_frames`). A stall is a run
of such snapshots: its length is the gap between two beats, and its CPU the main thread's CPU time over
that gap (each beat reads `time.thread_time`). On a shared machine most late beats are the process
waiting for a CPU (little CPU in a long gap); a stall whose CPU is about its gap is work on the loop, and
one long callback shows the same stack (the same callback root) in every snapshot. The report's sites
count the snapshots of "busy" stalls only (CPU at least half the gap). The collector's pauses are
timed by the thread's CPU too.

`--asyncio` runs the target on the stdlib event loop instead of uvloop, in debug mode with
`slow_callback_duration` at the threshold, and adds asyncio's own "Executing <handle> took N s" lines to
the report (debug mode slows everything; use it to name callbacks, not to time them).

The watchdog needs the GIL to look, so the switch interval is set to the poll interval (the default,
5 ms, would let it look only every 5 ms during a busy stretch): the target runs a little slower. A
diagnostic, not a measurement; lives here, not in the gateway.

`--turns` also times every turn of the loop (`TurnLog`: how many turns of each length, and the share of
the time in turns longer than 1, 1.5, 2 ... ms: a timer due inside a turn waits for the rest of it).
`--callbacks MS` runs the stdlib loop without debug mode, times every callback, and reports what the turns
whose callbacks took more than MS together held (`TurnWork`: time and count by callback, a task's step
named by its coroutine and the line it resumed from).

`kill -USR2 PID` starts the count afresh (send it when the load under study begins: a server's start,
its first scrapes of a whole fleet at once, is not what its loop does in service). `kill -USR1 PID` adds
a census to the report: the collector's tracked objects by type, per generation
(what survives into the older generations is what makes their collections long).

The report is written when the target returns (SIGTERM, SIGINT: berth drains and stops) and printed to
stderr as a table of the sites where the loop was held longest.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import logging
import math
import runpy
import signal
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

#: Frames of the machinery that runs the loop (outermost), cut from each snapshot before the callback.
RUNNER_FILES: Final = (
    "/asyncio/runners.py",
    "/asyncio/base_events.py",
    "/asyncio/events.py",
    "/uvloop/",
    "/runpy.py",
)
#: Our code: the innermost of its frames names a site better than a library's frame does.
OWN: Final = ("/gateway/", "/loadgen/")

Frame = tuple[str, int, str]  # file, line, function


def _frame(f: types.FrameType, line: int) -> Frame:
    return (f.f_code.co_filename, line, f.f_code.co_name)


def frames_of(top: types.FrameType | None) -> list[Frame]:
    """A stack, outermost first."""
    out: list[Frame] = []
    f = top
    while f is not None:
        out.append(_frame(f, f.f_lineno))
        f = f.f_back
    out.reverse()
    return out


def callback_part(stack: Sequence[Frame]) -> list[Frame]:
    """The frames of the callback the loop was running: those after the last frame of the runner and
    the launcher (empty: the loop itself, e.g. waiting in epoll or in its C code)."""
    last = -1
    for i, (filename, _, _) in enumerate(stack):
        if any(part in filename for part in RUNNER_FILES) or filename == __file__:
            last = i
    return list(stack[last + 1 :])


def _short(frame: Frame) -> str:
    filename, line, func = frame
    for marker in ("/site-packages/", "/gateway/", "/loadgen/", "/lib/python3"):
        if marker in filename:
            root = marker.strip("/")
            rest = filename.split(marker, 1)[1]
            filename = rest if root in ("site-packages", "lib/python3") else f"{root}/{rest}"
            break
    return f"{func} ({filename}:{line})"


def site_of(callback: Sequence[Frame]) -> tuple[str, str, str]:
    """(callback root, our innermost frame, innermost frame) of a snapshot's callback frames."""
    if not callback:
        return ("<loop>", "", "")
    own = [f for f in callback if any(p in f[0] for p in OWN)]
    return (_short(callback[0]), _short(own[-1]) if own else "", _short(callback[-1]))


#: A stall is work on the loop (not a wait for a CPU) when the main thread ran at least this share of it.
BUSY_SHARE: Final = 0.5


@dataclass(frozen=True, slots=True)
class Beat:
    wall: float  # perf_counter
    cpu: float  # the main thread's CPU time (thread_time)


@dataclass(slots=True)
class Stall:
    started: float  # when the beat it waited for was due (perf_counter)
    snapshots: list[list[Frame]] = field(default_factory=list)
    gap_s: float = 0.0  # beat to beat, set when the next beat came
    cpu_s: float = 0.0  # the main thread's CPU time over the gap

    @property
    def busy(self) -> bool:
        return self.cpu_s >= BUSY_SHARE * self.gap_s


@dataclass(slots=True)
class StallLog:
    """Stalls as the watchdog saw them; pure bookkeeping (tested with a scripted clock)."""

    beat_s: float
    threshold_s: float
    stalls: list[Stall] = field(default_factory=list)
    _open: Stall | None = None
    _seen: Beat | None = None

    def poll(self, now: float, last: Beat, snapshot: Callable[[], list[Frame]]) -> None:
        """One look: close a stall once a new beat came; snapshot while the beat is late."""
        seen = self._seen
        if self._open is not None and seen is not None and last != seen:
            self._open.gap_s = last.wall - seen.wall
            self._open.cpu_s = last.cpu - seen.cpu
            self.stalls.append(self._open)
            self._open = None
        self._seen = last
        if now - last.wall > self.beat_s + self.threshold_s:
            if self._open is None:
                self._open = Stall(started=last.wall + self.beat_s)
            self._open.snapshots.append(snapshot())

    def report(self, top: int = 25, gc_ended: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
        """Snapshots counted by site, the longest stalls with their sites and the collector's CPU within
        them (`gc_ended`: (ended at, seconds) of the long collections)."""
        sites: Counter[tuple[str, str, str]] = Counter()
        stalls_at: Counter[tuple[str, str, str]] = Counter()
        busy = [s for s in self.stalls if s.busy]
        for stall in busy:
            seen = [site_of(callback_part(s)) for s in stall.snapshots]
            sites.update(seen)
            stalls_at.update(set(seen))
        longest = sorted(busy, key=lambda s: s.cpu_s, reverse=True)[:top]
        return {
            "beat_ms": self.beat_s * 1000,
            "threshold_ms": self.threshold_s * 1000,
            "stalls": len(self.stalls),
            "stalled_ms": round(sum(s.gap_s for s in self.stalls) * 1000, 3),
            "busy_stalls": len(busy),
            "busy_stalled_ms": round(sum(s.gap_s for s in busy) * 1000, 3),
            "busy_cpu_ms": sorted((round(s.cpu_s * 1000, 3) for s in busy), reverse=True),
            "sites": [
                {"root": r, "own": o, "leaf": leaf, "snapshots": n, "stalls": stalls_at[(r, o, leaf)]}
                for (r, o, leaf), n in sites.most_common(top)
            ],
            "longest": [
                {
                    "gap_ms": round(s.gap_s * 1000, 3),
                    "cpu_ms": round(s.cpu_s * 1000, 3),
                    "gc_ms": round(
                        1000
                        * sum(
                            t for end, t in gc_ended if s.started - self.beat_s < end <= s.started + s.gap_s
                        ),
                        3,
                    ),
                    "sites": [list(site_of(callback_part(snap))) for snap in s.snapshots],
                    "stack": [_short(f) for f in callback_part(s.snapshots[0])] if s.snapshots else [],
                }
                for s in longest
            ],
        }


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


def stdlib_uvloop() -> types.ModuleType:
    """A stand-in `uvloop` module that runs asyncio's own loop (for code that imports uvloop)."""
    shim = types.ModuleType("uvloop")
    shim.new_event_loop = asyncio.new_event_loop  # type: ignore[attr-defined]
    shim.run = asyncio.run  # type: ignore[attr-defined]
    return shim


class GcPauses:
    """The cyclic collector's collections (gc.callbacks): count and time per generation (the thread's
    CPU time: a collection the OS interrupted is not counted longer), and those longer than `above_s`."""

    def __init__(self, above_s: float) -> None:
        self.above_s = above_s
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        self.long: list[tuple[int, float, int, float]] = []  # generation, seconds, collected, ended at
        self._started = 0.0

    def reset(self) -> None:
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        self.long = []

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        took = time.thread_time() - self._started
        gen = info["generation"]
        self.count[gen] += 1
        self.total_s[gen] += took
        if took > self.above_s:
            self.long.append((gen, took, info["collected"], time.perf_counter()))

    def report(self) -> dict[str, Any]:
        return {
            "collections": self.count,
            "total_ms": [round(t * 1000, 3) for t in self.total_s],
            "longer_than_ms": self.above_s * 1000,
            "long": [{"generation": g, "ms": round(t * 1000, 3), "collected": c} for g, t, c, _ in self.long],
        }


class SlowCallbacks(logging.Handler):
    """asyncio's debug-mode lines about callbacks slower than `slow_callback_duration`."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Executing"):
            self.lines.append(record.getMessage()[:400])


def _exceptions(objects: list[Any]) -> Counter[str]:
    """Exceptions among `objects`, by type and where they were raised: a caught exception kept in a
    frame's locals holds its traceback, which holds that frame: a cycle only the collector frees."""
    found: Counter[str] = Counter()
    for o in objects:
        if isinstance(o, BaseException):
            tb = o.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = "" if tb is None else " at " + _short(_frame(tb.tb_frame, tb.tb_lineno))
            found[type(o).__qualname__ + where] += 1
    return found


class Census:
    """Tracked objects by type and generation, taken on SIGUSR1 (in the main thread, between bytecodes)."""

    def __init__(self, top: int = 20) -> None:
        self.top = top
        self.taken: list[dict[str, Any]] = []

    def __call__(self, signum: int, frame: types.FrameType | None) -> None:
        take: dict[str, Any] = {"at": time.time(), "counts": list(gc.get_count())}
        for gen in range(3):
            objects = gc.get_objects(generation=gen)
            kinds = Counter(type(o).__qualname__ for o in objects)
            take[f"gen{gen}"] = {
                "objects": len(objects),
                "types": kinds.most_common(self.top),
                "exceptions": _exceptions(objects).most_common(self.top),
            }
            del objects
        take["frozen"] = gc.get_freeze_count()
        self.taken.append(take)


def find_loop(thread_id: int) -> asyncio.AbstractEventLoop | None:
    """The running event loop of thread `thread_id`, found in its frames' locals (a local loop, as
    `web.run_app` has, or an `asyncio.Runner`'s, as `asyncio.run` and `uvloop.run` have); None while it
    has none. Only those two types are looked into: other objects' attributes may be lazy proxies."""
    f = sys._current_frames().get(thread_id)
    while f is not None:
        for value in f.f_locals.values():
            candidate = getattr(value, "_loop", None) if isinstance(value, asyncio.Runner) else value
            if isinstance(candidate, asyncio.AbstractEventLoop) and candidate.is_running():
                return candidate
        f = f.f_back
    return None


class Watchdog:
    def __init__(self, args: argparse.Namespace) -> None:
        self.beat_s = args.beat_ms / 1000
        self.poll_s = args.poll_ms / 1000
        self.log = StallLog(self.beat_s, args.threshold_ms / 1000)
        self.debug = args.asyncio
        self.turns: TurnLog | None = TurnLog() if args.turns else None
        self._turn_at: Beat | None = None
        self.threshold_s = args.threshold_ms / 1000
        self.last_beat: Beat | None = None
        self.slow = SlowCallbacks()
        self.main_id = threading.get_ident()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._watch, name="stallwatch", daemon=True)

    def _beat(self) -> None:
        self.last_beat = Beat(time.perf_counter(), time.thread_time())
        if self._loop is not None and not self._stop.is_set():
            self._loop.call_later(self.beat_s, self._beat)

    def _start_in_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        if self.debug:
            loop.set_debug(True)
            loop.slow_callback_duration = self.threshold_s
            logging.getLogger("asyncio").addHandler(self.slow)
        self._beat()
        if self.turns is not None:
            self._turn()

    def _turn(self) -> None:
        now = Beat(time.perf_counter(), time.thread_time())
        last, self._turn_at = self._turn_at, now
        if last is not None and self.turns is not None:
            self.turns.add(now.wall - last.wall, now.cpu - last.cpu)
        if self._loop is not None and not self._stop.is_set():
            self._loop.call_soon(self._turn)

    def _snapshot(self) -> list[Frame]:
        return frames_of(sys._current_frames().get(self.main_id))

    def _watch(self) -> None:
        while self._loop is None and not self._stop.wait(0.05):
            self._loop = find_loop(self.main_id)
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._start_in_loop)
        while not self._stop.wait(self.poll_s):
            if self.last_beat is not None:
                self.log.poll(time.perf_counter(), self.last_beat, self._snapshot)

    def reset(self) -> None:
        self.log = StallLog(self.log.beat_s, self.log.threshold_s)
        if self.turns is not None:
            self.turns = TurnLog()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(1.0)


def _print_summary(doc: dict[str, Any]) -> None:
    st = doc["stalls"]
    out = sys.stderr
    print(
        f"stallwatch: {st['stalls']} stalls (beat late by > {st['threshold_ms']:g} ms), "
        f"{st['stalled_ms']:.1f} ms in all; busy {st['busy_stalls']} ({st['busy_stalled_ms']:.1f} ms, CPU ms "
        f"{st['busy_cpu_ms'][:12]}); gc {doc['gc']['collections']} collections, "
        f"{doc['gc']['total_ms']} ms",
        file=out,
    )
    for s in st["sites"][:15]:
        print(
            f"  {s['snapshots']:5d} snapshots {s['stalls']:4d} stalls {s['root']} | {s['own']} | {s['leaf']}",
            file=out,
        )
    for s in st["longest"][:10]:
        print(
            f" stall {s['gap_ms']:.2f} ms, cpu {s['cpu_ms']:.2f} ms, gc {s['gc_ms']:.2f} ms {s['sites'][:1]}",
            file=out,
        )
    turns = doc["turns"]
    if turns is not None:
        print(
            f"turns: {turns['turns']} in {turns['seconds']} s, mean {turns['mean_us']} µs, longest "
            f"{turns['longest_ms']} ms; time share in turns longer than {turns['time_share_in_turns']}",
            file=out,
        )
        for b in turns["buckets"]:
            where = f"  <= {b['le_ms']:g} ms: {b['turns']:7d} turns"
            print(f"{where} {b['wall_ms']:10.1f} ms (cpu {b['cpu_ms']:.1f})", file=out)
    cbs = doc["callbacks"]
    if cbs is not None:
        print(
            f"callbacks: {cbs['long_turns']} of {cbs['turns']} turns held more than {cbs['long_ms']:g} ms "
            f"({cbs['long_work_ms']:.1f} ms); callbacks per long turn {cbs['callbacks_per_long_turn'][:20]}",
            file=out,
        )
        for c in cbs["labels"][:25]:
            print(f"  {c['ms']:9.1f} ms {c['callbacks']:7d} x {c['label']}", file=out)
    for line in doc["slow_callbacks"][:15]:
        print(f"  {line}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag stallwatch", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--threshold-ms", type=float, default=1.5, help="a beat this late is a stall (default 1.5)"
    )
    p.add_argument("--beat-ms", type=float, default=1.0, help="heartbeat interval (default 1)")
    p.add_argument("--poll-ms", type=float, default=0.5, help="how often the watchdog looks (default 0.5)")
    p.add_argument("--asyncio", action="store_true", help="stdlib loop in debug mode instead of uvloop")
    p.add_argument(
        "--callbacks", type=float, default=None, metavar="MS",
        help="stdlib loop (not debug mode), every callback timed: what turns longer than MS held",
    )  # fmt: skip
    p.add_argument(
        "--turns", action="store_true",
        help="also time every turn of the loop (a call_soon spinner: keeps the loop from sleeping)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("stalls.json"))
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- MODULE ARGS...")
    args = p.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        p.error("name the module to run after --")
    work: TurnWork | None = None
    if args.asyncio or args.callbacks is not None:
        sys.modules["uvloop"] = stdlib_uvloop()
    if args.callbacks is not None:
        work = TurnWork(long_s=args.callbacks / 1000)
        time_callbacks(work)
    sys.setswitchinterval(args.poll_ms / 1000)
    pauses = GcPauses(above_s=0.0005)
    gc.callbacks.append(pauses)
    census = Census()
    signal.signal(signal.SIGUSR1, census)
    dog = Watchdog(args)

    def restart(signum: int, frame: types.FrameType | None) -> None:
        dog.reset()
        pauses.reset()
        if work is not None:
            work.reset()

    signal.signal(signal.SIGUSR2, restart)
    dog.thread.start()
    sys.argv = list(target)
    try:
        runpy.run_module(target[0], run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        dog.stop()
        gc.callbacks.remove(pauses)
        doc = {
            "census": census.taken,
            "target": target,
            "stalls": dog.log.report(gc_ended=[(end, t) for _, t, _, end in pauses.long]),
            "gc": pauses.report(),
            "turns": None if dog.turns is None else dog.turns.report(),
            "callbacks": None if work is None else work.report(),
            "slow_callbacks": dog.slow.lines,
        }
        args.out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        _print_summary(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
