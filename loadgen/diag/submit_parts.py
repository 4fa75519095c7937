"""Where a submit's CPU time goes with a standing queue: the parts of `Scheduler.submit` timed inside a
decisions run (`berth-loadgen bench decisions`' case of 1,000 queued on 100 `fleet-7b` endpoints, the
task SLAs x30), by the thread's CPU time.

Each part is timed whole (what it calls included) while a submit runs, and only then; a part called
several times in one submit counts every call. Beside the load cache's `refs` (the load reference of
every ready endpoint SLO admission asks for), its walk alone is timed: the same question asked again
at once, when every answer is the one kept (not counted in the other parts).

    berth-loadgen diag submit-parts [--preset coding-assistant] [--rounds 300]

Prints per part: calls, µs per submit (mean) and µs per call. A CPU-time measurement: run it alone
(`flock`), it takes under a minute.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final
from unittest import mock

from gateway.sched import admission, loads, scheduler, snapshot
from gateway.sched.load_batch import Pending
from gateway.sched.plugins.admission import seat_order, slo_feasibility
from gateway.sched.plugins.ordering import slack
from gateway.sched.profile import SchedulerProfile
from gateway.sched.queues import ModelQueue
from loadgen.bench.overhead.decision_cost import PRESETS, DecisionConfig, measure_preset
from loadgen.bench.overhead.decision_driver import Driver

WALK: Final = "refs: the walk alone (asked again)"

#: (owner, attribute, name): the parts timed.
_PARTS: Final[tuple[tuple[Any, str, str], ...]] = (
    (scheduler.Scheduler, "submit", "submit"),
    (admission.AdmissionLedger, "admit", "admission (scope and admitter)"),
    (SchedulerProfile, "scope", "placement scope (profile.scope)"),
    (slo_feasibility.SloFeasibilityAdmitter, "admit", "SLO admission"),
    (slo_feasibility, "ReadySeats", "ready endpoints and free seats (ReadySeats)"),
    (snapshot.ReadyServing, "__init__", "ready endpoints listed, once per views (ReadyServing)"),
    (loads.LoadCache, "refs", "load references (LoadCache.refs)"),
    (seat_order.SeatOrder, "renewed", "seat order renewed (with the seat ends)"),
    (seat_order, "_seat_frees", "seat ends of remade loads (_seat_frees)"),
    (Pending, "load", "pending loads made (Pending.load)"),
    (seat_order.SeatOrder, "kth", "the k-th seat (SeatOrder.kth)"),
    (scheduler.Scheduler, "snapshot", "snapshots"),
    (scheduler.Scheduler, "_serve", "serving (the queue's pick)"),
    (ModelQueue, "first", "the queue's first (ordering)"),
    (slack.SlackOrdering, "delay", "slack: the least wait for a seat (delay)"),
)


class _Parts:
    """CPU ns and calls per part, counted while a submit runs; `hidden`: ns not to count (the walk)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.in_submit = False
        self.hidden = 0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.thread_time_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            top = name == "submit"
            if not (self.in_submit or top):
                return fn(*args, **kwargs)
            self.in_submit = True
            hidden, t0 = self.hidden, clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - t0 - (self.hidden - hidden)
                self.ns[name] = self.ns.get(name, 0) + spent
                self.calls[name] = self.calls.get(name, 0) + 1
                if top:
                    self.in_submit = False

        return timed

    def measured(self, run: Callable[..., None]) -> Callable[..., None]:
        """`Driver.measure` with what the warm-up and the fill counted dropped first."""

        def fresh(*args: Any, **kwargs: Any) -> None:
            self.ns.clear()
            self.calls.clear()
            run(*args, **kwargs)

        return fresh

    def walk(self, refs: Callable[..., Any]) -> Callable[..., Any]:
        """`refs` timed as a part, then asked again at once (the walk alone, hidden from the others)."""
        timed = self.wrap("load references (LoadCache.refs)", refs)
        clock = time.thread_time_ns

        def both(cache: loads.LoadCache, views: Sequence[Any], now: float, **kwargs: Any) -> Any:
            out = timed(cache, views, now, **kwargs)
            if self.in_submit:
                t0 = clock()
                again = refs(cache, list(views), now)
                spent = clock() - t0
                self.hidden += spent
                self.ns[WALK] = self.ns.get(WALK, 0) + spent
                self.calls[WALK] = self.calls.get(WALK, 0) + 1
                if any(a is not b for a, b in zip(out, again, strict=True)):
                    raise AssertionError("the load cache answered differently when asked again at once")
            return out

        return both


def measure(preset: str, rounds: int) -> tuple[_Parts, dict[str, Any]]:
    parts = _Parts()
    with tempfile.TemporaryDirectory(prefix="berth-submit-parts-") as tmp, ExitStack() as stack:
        for owner, attr, name in _PARTS:
            fn = getattr(owner, attr)
            new = parts.walk(fn) if owner is loads.LoadCache else parts.wrap(name, fn)
            stack.enter_context(mock.patch.object(owner, attr, new))
        stack.enter_context(mock.patch.object(Driver, "measure", parts.measured(Driver.measure)))
        cfg = DecisionConfig(
            out=Path(tmp), presets=(preset,), rounds=rounds, backlog=0, profile=False, clock="cpu"
        )
        result = measure_preset(cfg, preset, Path(tmp), lambda *_: None)
    return parts, result


def report(parts: _Parts, result: dict[str, Any]) -> str:
    submits = max(1, int(result["submits"]))
    lines = [
        f"{result['preset']}: {result['submits']} submits measured ({result['submits_refused']} refused), "
        f"queued {result['queued_at_start']}",
        "part | calls | µs a submit | µs a call",
        "---|---|---|---",
    ]
    for name in [n for _, _, n in _PARTS] + [WALK]:
        n = parts.calls.get(name, 0)
        if n:
            ns = parts.ns[name]
            lines.append(f"{name} | {n} | {ns / submits / 1000:.1f} | {ns / n / 1000:.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen diag submit-parts", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="coding-assistant", choices=list(PRESETS))
    p.add_argument("--rounds", type=int, default=300, help="completions of the decisions run")
    args = p.parse_args(argv)
    print(report(*measure(args.preset, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
