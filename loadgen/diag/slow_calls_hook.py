"""The in-process half of `diag slow-calls`: run a module as `python -m MODULE ARGS` would, with every
call the live driver makes into the scheduler profiled on its own, and one JSON line per call that took
`THRESHOLD_MS` or more written to a file.

    python -m loadgen.diag.slow_calls_hook OUT THRESHOLD_MS MODULE ARGS...

Each call (`submit`, `complete`, `tick`, `serve`, `cancel`, the endpoint events) runs under a
`cProfile.Profile` of its own; the profile is kept only when the call was slow. A record says which call,
when (seconds since the hook started, and the number of calls of its kind before it), how long on the
wall and on the thread's CPU, its sizes (requests queued before and after, decisions it returned) and
what it did, counted: ranks given to queued requests (`RankIndex.add`), placements asked
(`SchedulerProfile.place`), snapshots taken, endpoint loads made (`EndpointLoad`, `Pending`) and the
garbage collections that ran inside it (their pause); then berth's functions by cumulative time. Every
call's time and sizes are summed by kind as well, so the slow calls can be set against the rest.

The profiler makes a call about twice as long (it times every function call): the records say which
part of a call is slow, not how slow it is; the benchmark's own figures (without the hook) say that.
"""

from __future__ import annotations

import cProfile
import gc
import os
import runpy
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any, Final

import orjson

#: Scheduler methods the driver calls, and the kind of call each counts as (`gateway.core.decisiontime`).
CALLS: Final = {
    "submit": "submit",
    "complete": "complete",
    "tick": "tick",
    "serve": "serve",
    "cancel": "cancel",
    "set_health": "endpoint",
    "set_models": "endpoint",
    "observe_gauges": "endpoint",
    "set_estimates": "endpoint",
    "sync_endpoints": "endpoint",
    "set_policy": "policy",
}
#: Functions of berth listed per slow call (by cumulative time).
TOP: Final = 25
#: What a call did, counted: (module, class, method, counter name).
_COUNTED: Final = (
    ("gateway.sched.ranked", "RankIndex", "add", "ranks"),
    ("gateway.sched.profile", "SchedulerProfile", "place", "placements"),
    ("gateway.sched.bookkeeping", "SchedulerBooks", "snapshot", "snapshots"),
    ("gateway.sched.predict", "EndpointLoad", "__init__", "loads_made"),
    ("gateway.sched.load_batch", "Pending", "__init__", "pending_made"),
    ("gateway.sched.queues", "ModelQueue", "first", "queue_firsts"),
)


class Recorder:
    """The counters, the collector's pauses inside calls, and the output."""

    def __init__(self, out: IO[bytes], threshold_s: float) -> None:
        self.out = out
        self.threshold_s = threshold_s
        self.counts: dict[str, int] = {name: 0 for *_, name in _COUNTED}
        self.gc_ms = 0.0
        self.gc_n = 0
        self._gc_t0 = 0.0
        self.depth = 0  # calls in progress (a call into the scheduler from inside one is not profiled)
        self.t0 = time.monotonic()
        self.seen: dict[str, int] = {}
        # per kind: calls, wall s, and per counter the sum (every call, slow or not)
        self.totals: dict[str, dict[str, float]] = {}
        self.queued: Callable[[Any], int] = lambda sched: 0

    def on_gc(self, phase: str, info: Mapping[str, int]) -> None:
        if self.depth == 0:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_ms += (time.perf_counter() - self._gc_t0) * 1000.0
            self.gc_n += 1

    def wrap_call(self, method: str, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(sched: Any, *args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(sched, *args, **kwargs)
            n = self.seen.get(kind, 0)
            self.seen[kind] = n + 1
            before = dict(self.counts)
            self.gc_ms, self.gc_n = 0.0, 0
            q0 = self.queued(sched)
            prof = cProfile.Profile()
            self.depth += 1
            c0 = time.thread_time()
            w0 = time.perf_counter()
            prof.enable()
            try:
                result = fn(sched, *args, **kwargs)
            finally:
                prof.disable()
                wall = time.perf_counter() - w0
                cpu = time.thread_time() - c0
                self.depth -= 1
            did = {k: v - before[k] for k, v in self.counts.items()}
            tot = self.totals.setdefault(kind, {"calls": 0.0, "wall_s": 0.0})
            tot["calls"] += 1
            tot["wall_s"] += wall
            for k, v in did.items():
                tot[k] = tot.get(k, 0.0) + v
            if wall >= self.threshold_s:
                self._write(
                    method,
                    kind,
                    n=n,
                    wall=wall,
                    cpu=cpu,
                    q0=q0,
                    sched=sched,
                    result=result,
                    did=did,
                    prof=prof,
                )
            return result

        return timed

    def _write(
        self,
        method: str,
        kind: str,
        *,
        n: int,
        wall: float,
        cpu: float,
        q0: int,
        sched: Any,
        result: Any,
        did: dict[str, int],
        prof: cProfile.Profile,
    ) -> None:
        prof.create_stats()
        stats: dict[Any, Any] = prof.stats  # set by create_stats
        ours = [
            (f"{_short(k[0])}:{k[1]}({k[2]})", calls, own * 1000.0, cum * 1000.0)
            for k, (_cc, calls, own, cum, _callers) in stats.items()
            if "/gateway/" in k[0]
        ]
        ours.sort(key=lambda r: -r[3])
        decisions = len(result) if isinstance(result, list) else int(result is not None)
        rec = {
            "at_s": round(time.monotonic() - self.t0, 3),
            "method": method,
            "call": kind,
            "nth": n,
            "ms": round(wall * 1000.0, 3),
            "cpu_ms": round(cpu * 1000.0, 3),
            "queued_before": q0,
            "queued_after": self.queued(sched),
            "decisions": decisions,
            "gc": self.gc_n,
            "gc_ms": round(self.gc_ms, 3),
            **did,
            "functions": [[f, c, round(o, 3), round(cm, 3)] for f, c, o, cm in ours[:TOP]],
        }
        self.out.write(orjson.dumps(rec) + b"\n")
        self.out.flush()

    def write_totals(self) -> None:
        self.out.write(orjson.dumps({"totals": self.totals}) + b"\n")
        self.out.flush()


def _short(path: str) -> str:
    i = path.rfind("/gateway/")
    return path[i + 1 :] if i >= 0 else path


def _count(rec: Recorder, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    counts = rec.counts

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return fn(*args, **kwargs)

    return counted


def install(rec: Recorder) -> None:
    import importlib

    from gateway.sched import scheduler

    for module, cls_name, method, name in _COUNTED:
        cls = getattr(importlib.import_module(module), cls_name)
        setattr(cls, method, _count(rec, name, getattr(cls, method)))
    for method, kind in CALLS.items():
        fn = getattr(scheduler.Scheduler, method)
        setattr(scheduler.Scheduler, method, rec.wrap_call(method, kind, fn))
    rec.queued = lambda sched: sum(sched.queue_depths().values())
    gc.callbacks.append(rec.on_gc)


def main() -> None:
    out_path, threshold_ms, module, *rest = sys.argv[1:]
    out = open(out_path, "ab")  # noqa: SIM115 (open for the process's life; closed at exit)
    rec = Recorder(out, float(threshold_ms) / 1000.0)
    install(rec)
    sys.argv = [module, *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        rec.write_totals()
        out.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
