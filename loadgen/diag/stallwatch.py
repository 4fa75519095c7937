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
import gc
import logging
import runpy
import signal
import sys
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from loadgen.diag.stallwatch_gc import Census, GcPauses
from loadgen.diag.stallwatch_stalls import Beat, Frame, StallLog, frames_of
from loadgen.diag.stallwatch_turns import SlowCallbacks, TurnLog, TurnWork, time_callbacks


def stdlib_uvloop() -> types.ModuleType:
    """A stand-in `uvloop` module that runs asyncio's own loop (for code that imports uvloop)."""
    shim = types.ModuleType("uvloop")
    shim.new_event_loop = asyncio.new_event_loop  # type: ignore[attr-defined]
    shim.run = asyncio.run  # type: ignore[attr-defined]
    return shim


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
