"""Which scheduler calls are slow in the live daemon with a standing queue, with their sizes and
profiles: the overhead benchmark's standing-queue phase (`bench overhead --tests queue`, berth alone)
with berth's process under `slow_calls_hook` (every call into the scheduler profiled on its own; those
that took `--threshold-ms` or more under the profiler recorded).

    berth-loadgen diag slow-calls [--threshold-ms 4] [--out DIR] [--top 12] [-- BENCH-OVERHEAD-ARGS...]

Arguments after `--` go to `bench overhead` (e.g. `--queue-duration 20`); `--tests queue --configs berth`
are given already. Printed: per kind of call the calls and the slow ones, what an ordinary call and a
slow one did on average (ranks given, placements asked, snapshots, loads made, decisions returned);
the slowest calls one by one with their sizes and their three costliest functions; and per kind the slow
calls' functions added up (cumulative ms per slow call). The profiler about doubles a call's time (the
threshold is on the profiled time), so the benchmark's lag figures in this run are not the daemon's;
run it under the benchmark lock all the same. Output: DIR/slow-calls.jsonl (one line per slow call, the
totals last), DIR/bench/ (the benchmark's report).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.diag.queue_hook import hooked_python, run_queue, split_args

#: Counters a record carries (`slow_calls_hook._COUNTED`), in the order printed.
COUNTERS: Final = ("ranks", "placements", "queue_firsts", "snapshots", "loads_made", "pending_made")


def wrapper(path: Path, out: Path, threshold_ms: float) -> Path:
    """An interpreter for `--python`: `-m gateway.cli ...` under the hook, anything else as is."""
    return hooked_python(path, "loadgen.diag.slow_calls_hook", str(out), repr(threshold_ms))


def load(path: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    recs: list[dict[str, Any]] = []
    totals: dict[str, dict[str, float]] = {}
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        doc = orjson.loads(line)
        if "totals" in doc:
            totals = doc["totals"]
        else:
            recs.append(doc)
    return recs, totals


def report(recs: Sequence[dict[str, Any]], totals: dict[str, dict[str, float]], top: int) -> list[str]:
    lines = ["per kind: calls; slow calls; per ordinary call / per slow call: " + ", ".join(COUNTERS)]
    kinds = sorted({*totals, *(r["call"] for r in recs)})
    for kind in kinds:
        slow = [r for r in recs if r["call"] == kind]
        tot = totals.get(kind, {})
        n = tot.get("calls", 0.0)
        rest = max(1.0, n - len(slow))
        avg_all = [
            (tot.get(c, 0.0) - sum(r.get(c, 0) for r in slow)) / rest for c in COUNTERS
        ]  # the ordinary calls
        avg_slow = [sum(r.get(c, 0) for r in slow) / max(1, len(slow)) for c in COUNTERS]
        mean_ms = (tot.get("wall_s", 0.0) - sum(r["ms"] for r in slow) / 1000.0) / rest * 1000.0
        lines.append(
            f"  {kind:9} {n:>8.0f} calls ({mean_ms:.2f} ms each, profiled), {len(slow):>4} slow;  "
            + " ".join(f"{a:.1f}/{s:.1f}" for a, s in zip(avg_all, avg_slow, strict=True))
        )
    lines += ["", "the slowest calls (ms under the profiler; CPU; queued before->after; decisions; counters)"]
    for r in sorted(recs, key=lambda r: -r["ms"])[:top]:
        counters = " ".join(f"{c}={r.get(c, 0)}" for c in COUNTERS)
        gc_part = f" gc {r['gc']} ({r['gc_ms']:.1f} ms)" if r.get("gc") else ""
        lines.append(
            f"  {r['at_s']:8.2f}s {r['method']:10} #{r['nth']:<6} {r['ms']:6.2f} ms cpu {r['cpu_ms']:6.2f}  "
            f"q {r['queued_before']}->{r['queued_after']} d {r['decisions']}  {counters}{gc_part}"
        )
        for f, calls, own, cum in r["functions"][1:4]:
            lines.append(f"        {cum:7.2f} ms cum {own:6.2f} own {calls:>6}x  {f}")
    for kind in kinds:
        slow = [r for r in recs if r["call"] == kind]
        if not slow:
            continue
        summed: dict[str, list[float]] = {}
        for r in slow:
            for f, calls, own, cum in r["functions"]:
                row = summed.setdefault(f, [0.0, 0.0, 0.0])
                row[0] += calls
                row[1] += own
                row[2] += cum
        n = len(slow)
        lines += ["", f"{kind}: the {n} slow calls' functions, per slow call: calls, own ms, cumulative ms"]
        for f, (calls, own, cum) in sorted(summed.items(), key=lambda kv: -kv[1][2])[:20]:
            lines.append(f"  {calls / n:8.1f} {own / n:7.2f} {cum / n:7.2f}  {f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    argv, bench_args = split_args(argv)
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag slow-calls", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="directory for the records and reports")
    p.add_argument("--threshold-ms", type=float, default=4.0, help="a call this long (profiled) is recorded")
    p.add_argument("--top", type=int, default=12, help="slowest calls listed one by one (default 12)")
    args = p.parse_args(argv)
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="berth-slow-calls-"))
    out.mkdir(parents=True, exist_ok=True)
    records = out / "slow-calls.jsonl"
    records.unlink(missing_ok=True)
    python = wrapper(out / "python.sh", records, args.threshold_ms)
    run_queue(python, out / "bench", bench_args)
    if not records.is_file():
        print(f"nothing was recorded ({records}): did berth start?", file=sys.stderr)
        return 1
    recs, totals = load(records)
    print("\n".join(report(recs, totals, args.top)))
    print(f"\nrecords: {records}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
