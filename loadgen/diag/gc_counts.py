"""What the daemon's collector schedule (`gateway.core.heap.GcSchedule`) pays for the two counts it
takes by walking objects, in the live daemon with a standing queue, and how far the collector's net
count (`gc.get_count()[0]`, free to read) is from them: the overhead benchmark's standing-queue phase
(`bench overhead --tests queue`, berth alone) with berth's process under `gc_counts_hook`.

    berth-loadgen diag gc-counts [--out DIR] [--truth-every 2] [-- BENCH-OVERHEAD-ARGS...]

The two counts: the young generation's objects at a young collection's turn (`len(gc.get_objects(0))`,
the guard that puts off a collection over `YOUNG_MAX_OBJECTS`), and the frozen objects when the heap's
blocks grew enough for a full collection (`gc.get_freeze_count()`, a walk of the permanent generation;
also after every full collection). Printed: each walk of the frozen objects the schedule made, with its
time; the young generation's lists (objects, time, per object, how many were over the guard's bound)
beside the young collections (time, per object); the net count before each freeze; and, every
`--truth-every` seconds, the frozen objects counted against an estimate kept from the net counts (what
the last full collection left, plus the net count before each freeze, less the garbage each young
collection found), with the growth of both since that full collection. Run it under the benchmark lock
(the walks are timed); the hook's own walks hold the loop, so the run's lag figures are not the daemon's.
Output: DIR/calls.jsonl (one line per call), DIR/gc-counts.json (the summary), DIR/bench/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.core.heap import YOUNG_MAX_OBJECTS
from loadgen.diag.queue_hook import hooked_python, run_queue, split_args


def load(calls: Path) -> list[dict[str, Any]]:
    """A run's records (`load_records`)."""
    return load_records([orjson.loads(line) for line in calls.read_bytes().splitlines() if line.strip()])


def load_records(recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records from the schedule's settling on (its first walk of the frozen objects)."""
    start = next((i for i, r in enumerate(recs) if r["k"] == "frozen"), len(recs))
    return list(recs[start:])


def _spread(xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "median": 0.0, "max": 0.0}
    return {"n": len(xs), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3)}


def summarize(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    t0 = recs[0]["at"] if recs else 0.0
    young = [r for r in recs if r["k"] == "young"]
    walked: list[tuple[int, float]] = []  # a young collection's objects (the list just before it), seconds
    before: dict[str, Any] | None = None
    for r in recs:
        if r["k"] == "young":
            before = r
        elif r["k"] == "collect" and r["gen"] == 0:
            if before is not None and before["n"] > 0:
                walked.append((before["n"], r["s"]))
            before = None
        elif r["k"] == "freeze":
            before = None
    estimate: int | None = None
    base = 0
    full = True  # the first walk is the one after settle's full collection
    compared: list[dict[str, Any]] = []
    for r in recs:
        if r["k"] == "collect" and r["gen"] == 2:
            full = True
        elif r["k"] == "frozen":
            if full:  # the walk after a full collection; one at a growth check leaves the estimate be
                estimate = base = r["n"]
                full = False
        elif estimate is None:
            continue
        elif r["k"] == "freeze":
            estimate += r["net"]
        elif r["k"] == "collect" and r["gen"] == 0:
            estimate += r["net"] - r["garbage"]
        elif r["k"] == "truth":
            compared.append({
                "at_s": round(r["at"] - t0, 2), "frozen": r["n"], "estimate": estimate,
                "growth": r["n"] - base, "estimated_growth": estimate - base,
                "walk_ms": round(r["s"] * 1e3, 2),
            })  # fmt: skip
    return {
        "frozen_walks": [
            {"at_s": round(r["at"] - t0, 2), "objects": r["n"], "ms": round(r["s"] * 1e3, 2)}
            for r in recs
            if r["k"] == "frozen"
        ],
        "young_lists": {
            "objects": _spread([r["n"] for r in young]),
            "ms": _spread([r["s"] * 1e3 for r in young]),
            "ns_per_object": _spread([r["s"] * 1e9 / r["n"] for r in young if r["n"] > 0]),
            "over_bound": sum(r["n"] > YOUNG_MAX_OBJECTS for r in young),
        },
        "young_collections": {
            "ms": _spread([r["s"] * 1e3 for r in recs if r["k"] == "collect" and r["gen"] == 0]),
            "ns_per_object": _spread([s * 1e9 / n for n, s in walked]),
        },
        "net_before_freeze": _spread([float(r["net"]) for r in recs if r["k"] == "freeze"]),
        "frozen_against_estimate": compared,
    }


def print_summary(doc: dict[str, Any]) -> None:
    print("walks of the frozen objects by the schedule (s after it settled: objects, ms):")
    print("  " + "; ".join(f"{w['at_s']}: {w['objects']:,}, {w['ms']}" for w in doc["frozen_walks"]))
    y, c = doc["young_lists"], doc["young_collections"]
    print(
        f"young generation listed {y['objects']['n']} times: objects median {y['objects']['median']:,.0f} "
        f"max {y['objects']['max']:,.0f}, {y['over_bound']} over {YOUNG_MAX_OBJECTS:,}; ms median "
        f"{y['ms']['median']} max {y['ms']['max']}; ns per object median {y['ns_per_object']['median']}"
    )
    print(
        f"young collections {c['ms']['n']}: ms median {c['ms']['median']} max {c['ms']['max']}; ns per "
        f"object median {c['ns_per_object']['median']}"
    )
    net = doc["net_before_freeze"]
    print(
        f"net count before a freeze: median {net['median']:,.0f}, max {net['max']:,.0f} ({net['n']} freezes)"
    )
    print("frozen objects against the estimate from net counts (s: counted, estimated; growth since the")
    print("last full collection: counted, estimated; the walk's ms):")
    for r in doc["frozen_against_estimate"]:
        print(
            f"  {r['at_s']}: {r['frozen']:,}, {r['estimate']:,}; {r['growth']:+,}, "
            f"{r['estimated_growth']:+,}; {r['walk_ms']}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    argv, bench_args = split_args(argv)
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag gc-counts", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="directory for the calls and reports")
    p.add_argument(
        "--truth-every", type=float, default=2.0, help="seconds between the hook's own walks (0: none)"
    )
    args = p.parse_args(argv)
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="berth-gc-counts-"))
    out.mkdir(parents=True, exist_ok=True)
    calls = out / "calls.jsonl"
    calls.unlink(missing_ok=True)
    hook = "loadgen.diag.gc_counts_hook"
    python = hooked_python(out / "python.sh", hook, str(calls), str(args.truth_every))
    run_queue(python, out / "bench", bench_args)
    if not calls.is_file():
        print(f"no calls were written ({calls}): did berth start?", file=sys.stderr)
        return 1
    doc = summarize(load(calls))
    (out / "gc-counts.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print_summary(doc)
    print(f"\ncalls: {calls}\nsummary: {out / 'gc-counts.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
