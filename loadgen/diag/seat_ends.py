"""What SLO admission's pending loads cost made one by one against derived together as arrays, on the same
loads, inside a decisions run (`berth-loadgen bench decisions`' case of 1,000 queued on 100 `fleet-7b`
endpoints, the task SLAs x30).

Each time admission's seat order (`gateway.sched.plugins.admission.seat_order`) finds pending loads whose
ends it needs (asked every question: the sure admission, `seat_bound`, is left out of the run), both
paths are timed on them by the thread's CPU time before the run goes on as it would: `seat_ends.ends`
over all of them, the path the run takes (the rows a load's pace keeps, `Pace.arrays`, restored
afterwards, so the run and the other path see them as they were), then an `EndpointLoad` made for each.
The answers are checked equal. A load whose rows are kept on its pace (placement over columns or an
earlier batch derived a load of the same running requests) costs a batch less than one whose running
requests changed (its rows are made first).

    berth-loadgen diag seat-ends [--preset coding-assistant] [--rounds 300] [--batch-from N]

Prints, by the number of pending loads, the median of each path for the batches whose loads' rows were
all kept and for those with none kept, then a least-squares fit over every batch: made one by one, µs
a load; derived, a fixed cost plus µs a load with rows kept and a load without (what
`seat_order.SEAT_ENDS_FROM` is set from); and what the run's own path cost in all with admission's
threshold at `--batch-from` (the rows a batch makes stay on the loads' paces, so the threshold decides
how many later loads have them kept: compare runs at several thresholds). A CPU-time measurement: run
it alone (`flock`), it takes a few minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final
from unittest import mock

import numpy as np

from gateway.sched.load_batch import Pending
from gateway.sched.plugins.admission import seat_order, slo_feasibility
from gateway.sched.plugins.admission.seat_ends import ends
from gateway.sched.predict import EndpointLoad
from loadgen.bench.overhead.decision_cost import PRESETS, DecisionConfig, measure_preset

_BUCKETS: Final = ((1, 7), (8, 15), (16, 23), (24, 31), (32, 63), (64, 1 << 30))


class _Batch:
    """One batch of pending loads: its size, how many had their rows kept, each path's CPU ns."""

    __slots__ = ("derived_ns", "kept", "made_ns", "n")

    def __init__(self, n: int, kept: int, derived_ns: int, made_ns: int) -> None:
        self.n, self.kept, self.derived_ns, self.made_ns = n, kept, derived_ns, made_ns


def _both(todo: list[Pending]) -> _Batch:
    """Both paths on `todo`, the rows kept on their paces left as they were."""
    clock = time.thread_time_ns
    paces = [(p.pace, p.pace.arrays) for p in todo]
    # (`load_batch`'s rows: the running requests they were last brought up to date for, the matrix)
    rows: dict[int, Any] = {id(a): a for _, a in paces if a is not None}
    saved = [(r, r.running, r.per.copy()) for r in rows.values()]
    kept = sum(a is not None for _, a in paces)
    t0 = clock()
    derived = ends(todo)
    t1 = clock()
    for pace, a in paces:
        pace.arrays = a
    for r, running, per in saved:
        r.running = running
        r.per[:] = per
    t2 = clock()
    made = [np.asarray(EndpointLoad(p.view, p.now, p.params, pace=p.pace).seat_free) for p in todo]
    t3 = clock()
    for a, b in zip(derived, made, strict=True):
        if not np.array_equal(np.sort(a), b):
            raise AssertionError("a derived load's ends differ from its made load's")
    return _Batch(len(todo), kept, t1 - t0, t3 - t2)


class _Run:
    """What the run's own path cost: CPU ns, calls, pending loads and those with rows kept."""

    __slots__ = ("calls", "kept", "ns", "pending")

    def __init__(self) -> None:
        self.ns = self.calls = self.pending = self.kept = 0


def measure(preset: str, rounds: int, batch_from: int) -> tuple[list[_Batch], _Run]:
    """Every batch of pending loads admission's seat order met in a decisions run of `preset`, its
    threshold `batch_from` (`SEAT_ENDS_FROM`), and what the run's own path cost."""
    batches: list[_Batch] = []
    run = _Run()
    plain = seat_order._seat_frees

    def timed(loads: Sequence[EndpointLoad | Pending], batch_from: int) -> object:
        todo = [p for p in loads if isinstance(p, Pending) and p.made is None and p.seat_free is None and p.n]
        if todo:
            batches.append(_both(todo))
        run.calls += 1
        run.pending += len(todo)
        run.kept += sum(p.pace.arrays is not None for p in todo)
        t0 = time.thread_time_ns()
        out = plain(loads, batch_from)
        run.ns += time.thread_time_ns() - t0
        return out

    with tempfile.TemporaryDirectory(prefix="berth-seat-ends-") as tmp:
        cfg = DecisionConfig(
            out=Path(tmp), presets=(preset,), rounds=rounds, backlog=0, profile=False, clock="cpu"
        )
        with (
            mock.patch.object(seat_order, "_seat_frees", timed),
            mock.patch.object(slo_feasibility, "SEAT_ENDS_FROM", batch_from),
            # every question to the seat order: the paths timed are those of the exact answer, which
            # the sure admission (`seat_bound`) spares most submits of this run
            mock.patch.object(slo_feasibility.SloFeasibilityAdmitter, "_surely", _never),
        ):
            measure_preset(cfg, preset, Path(tmp), lambda *_: None)
    return batches, run


def _never(*_: object, **__: object) -> bool:
    return False


def report(batches: list[_Batch]) -> str:
    lines = [
        "pending loads | rows kept: batches, made / derived µs | rows not kept: batches, made / derived µs",
        "---|---|---",
    ]
    for lo, hi in _BUCKETS:
        cells = []
        for all_kept in (True, False):
            got = [b for b in batches if lo <= b.n <= hi and b.kept == (b.n if all_kept else 0)]
            if got:
                one = statistics.median(b.made_ns for b in got) / 1000
                together = statistics.median(b.derived_ns for b in got) / 1000
                cells.append(f"{len(got)}, {one:.0f} / {together:.0f}")
            else:
                cells.append("-")
        lines.append(f"{lo}-{hi if hi < 1 << 30 else ''} | {cells[0]} | {cells[1]}")
    if len(batches) >= 3:
        n = np.array([b.n for b in batches], dtype=np.float64)
        kept = np.array([b.kept for b in batches], dtype=np.float64)
        made = np.array([b.made_ns for b in batches], dtype=np.float64) / 1000
        derived = np.array([b.derived_ns for b in batches], dtype=np.float64) / 1000
        per_made = float(np.linalg.lstsq(n[:, None], made, rcond=None)[0][0])
        a = np.stack([np.ones_like(n), kept, n - kept], axis=1)
        fixed, per_kept, per_new = (float(x) for x in np.linalg.lstsq(a, derived, rcond=None)[0])
        lines += [
            "",
            f"fit over {len(batches)} batches: made one by one {per_made:.1f} µs a load; derived "
            f"{fixed:.0f} µs + {per_kept:.1f} µs a load with rows kept + {per_new:.1f} µs a load without",
        ]
        if per_made > per_kept:
            lines.append(
                f"loads with rows kept: a batch pays from {fixed / (per_made - per_kept):.1f} of them"
            )
        if per_made <= per_new:
            lines.append("loads without rows kept: a batch never pays (a load costs more derived than made)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen diag seat-ends", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="coding-assistant", choices=list(PRESETS))
    p.add_argument("--rounds", type=int, default=300, help="completions of the decisions run")
    p.add_argument(
        "--batch-from",
        type=int,
        default=seat_order.SEAT_ENDS_FROM,
        help=f"admission's threshold in the run (default {seat_order.SEAT_ENDS_FROM}, `SEAT_ENDS_FROM`)",
    )
    args = p.parse_args(argv)
    batches, run = measure(args.preset, args.rounds, args.batch_from)
    print(report(batches))
    print(
        f"the run's own seat ends, derived from {args.batch_from} pending loads: "
        f"{run.ns / 1e6:.1f} ms of CPU over {run.calls} calls, {run.pending} pending loads "
        f"({run.kept} with rows kept)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
