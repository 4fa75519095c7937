"""What the garbage collector's young collections walk in the live daemon with a standing queue: the
overhead benchmark's standing-queue phase (`bench overhead --tests queue`, berth alone) with berth's
process under a census of every collection (`gc_census_hook`).

    berth-loadgen diag gc-census [--out DIR] [--top 15] [-- BENCH-OVERHEAD-ARGS...]

Arguments after `--` go to `bench overhead` (e.g. `--queue-duration 20 --fleet-count 50`); `--tests queue
--configs berth` are given already. berth runs from this checkout, through a wrapper interpreter
(`--python`) that starts `gateway.cli` under the hook and everything else as it is.

Printed, for the young collections after the daemon's schedule settled (its first full collection
froze what startup built): each one's objects and references walked, its pause and CPU (the census
excluded), the cyclic garbage it found and the objects that survived it; then by type, per collection
on average, the objects, the references they hold and the survivors; the largest containers (with the
type most of their references are); and the older generations' pauses. The census itself holds the
loop for tens of milliseconds per collection: the benchmark's lag figures in this run are not the
daemon's, and its verdict means nothing. Run it under the benchmark lock all the same (the pauses are
timed). Output: DIR/census.jsonl (one line per collection), DIR/gc-census.json (the summary),
DIR/bench/ (the benchmark's report).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from loadgen.diag.gc_census_hook import REFERRERS_ENV
from loadgen.diag.queue_hook import hooked_python, run_queue, split_args


def wrapper(path: Path, census: Path) -> Path:
    """An interpreter for `--python`: `-m gateway.cli ...` under the census hook, anything else as is."""
    return hooked_python(path, "loadgen.diag.gc_census_hook", str(census))


def load(census: Path) -> list[dict[str, Any]]:
    """The records from the schedule's settling on (the first young census with frozen objects)."""
    recs = [orjson.loads(line) for line in census.read_bytes().splitlines() if line.strip()]
    start = next((i for i, r in enumerate(recs) if r["generation"] == 0 and r["frozen"] > 0), len(recs))
    return recs[start:]


def _spread(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "max": max(xs)} if xs else {"median": 0.0, "max": 0.0}


def summarize(recs: Sequence[dict[str, Any]], top: int) -> dict[str, Any]:
    young = [r for r in recs if r["generation"] == 0]
    n = max(1, len(young))
    objects: Counter[str] = Counter()
    refs: Counter[str] = Counter()
    survivors: Counter[str] = Counter()
    largest: dict[tuple[str, str], int] = {}
    for r in young:
        objects.update(dict(r["types"]))
        refs.update(dict(r["refs_by_type"]))
        survivors.update(dict(r["survivor_types"]))
        for size, name, held in r["largest"]:
            largest[name, held] = max(largest.get((name, held), 0), size)
    t0 = young[0]["at"] if young else 0.0
    return {
        "young": [
            {
                "at_s": round(r["at"] - t0, 2),
                "objects": r["objects"],
                "references": r["references"],
                "ms": round(r["ms"], 3),
                "cpu_ms": round(r["cpu_ms"], 3),
                "collected": r["collected"],
                "survivors": r["survivors"],
            }
            for r in young
        ],
        "young_objects": _spread([r["objects"] for r in young]),
        "young_ms": _spread([r["ms"] for r in young]),
        "young_cpu_ms": _spread([r["cpu_ms"] for r in young]),
        "types": [
            {
                "type": name,
                "objects": round(count / n, 1),
                "references": round(refs[name] / n, 1),
                "survivors": round(survivors[name] / n, 1),
            }
            for name, count in objects.most_common(top)
        ],
        "largest": [
            {"type": name, "holding": held, "references": size}
            for (name, held), size in sorted(largest.items(), key=lambda kv: -kv[1])[:top]
        ],
        "older": [
            {
                "generation": r["generation"],
                "at_s": round(r["at"] - t0, 2),
                "ms": round(r["ms"], 1),
                "survivors": r.get("survivors"),
                "holders": r.get("referrers"),
            }
            for r in recs
            if r["generation"] != 0
        ],
        "full_growth": full_growth(recs, top),
    }


def full_growth(recs: Sequence[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """What the tracked objects gained, by type, from the first of the schedule's full collections (all
    unfrozen first: its survivors are every tracked object) to the last: the types that grew most."""
    full = [r for r in recs if r["generation"] == 2 and r.get("frozen") == 0 and "survivor_types" in r]
    if len(full) < 2:
        return []
    first, last = dict(full[0]["survivor_types"]), dict(full[-1]["survivor_types"])
    grew = Counter({k: last.get(k, 0) - first.get(k, 0) for k in first.keys() | last.keys()})
    return [
        {
            "type": k,
            "from": first.get(k, 0),
            "to": last.get(k, 0),
            "seconds": round(full[-1]["at"] - full[0]["at"], 1),
        }
        for k, n in grew.most_common(top)
        if n > 0
    ]


def print_summary(doc: dict[str, Any]) -> None:
    young = doc["young"]
    print(f"\nyoung collections after the schedule settled: {len(young)}")
    print(f"{'at s':>8} {'objects':>8} {'refs':>8} {'ms':>8} {'CPU ms':>8} {'garbage':>8} {'survived':>9}")
    for r in young:
        print(
            f"{r['at_s']:8.1f} {r['objects']:8d} {r['references']:8d} {r['ms']:8.2f} {r['cpu_ms']:8.2f} "
            f"{r['collected']:8d} {r['survivors']:9d}"
        )
    for key, label in (("young_objects", "objects"), ("young_ms", "pause ms"), ("young_cpu_ms", "CPU ms")):
        print(f"{label}: median {doc[key]['median']:.1f}, max {doc[key]['max']:.1f}")
    print("\nby type, per young collection (mean): objects, references they hold, survivors")
    for t in doc["types"]:
        print(f"  {t['type'][:40]:40} {t['objects']:9.1f} {t['references']:10.1f} {t['survivors']:9.1f}")
    print("\nlargest containers walked (references; the type most of them are)")
    for c in doc["largest"]:
        print(f"  {c['type'][:30]:30} {c['references']:7d}  of {c['holding']}")
    if doc["older"]:
        print("\nolder generations' collections (ms): " + ", ".join(
            f"gen{o['generation']} {o['ms']:.0f} at {o['at_s']:.0f} s" for o in doc["older"]
        ))  # fmt: skip
    for o in doc["older"]:
        for name, samples in (o.get("holders") or {}).items():
            print(f"\nwhat holds the oldest {name} objects (full collection at {o['at_s']:.0f} s)")
            for chain in samples:
                print("  " + "; ".join(chain))
    if doc["full_growth"]:
        print(
            f"\ntracked objects gained between full collections ({doc['full_growth'][0]['seconds']} s apart)"
        )
        for g in doc["full_growth"]:
            print(f"  {g['type'][:40]:40} {g['from']:9d} -> {g['to']:9d}")


def main(argv: Sequence[str] | None = None) -> int:
    argv, bench_args = split_args(argv)
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag gc-census", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="directory for the census and reports")
    p.add_argument("--top", type=int, default=15, help="types and containers listed (default 15)")
    p.add_argument(
        "--holders",
        default="",
        help="comma-separated type names: each full collection records what holds the oldest survivors of "
        "each (e.g. SchedRequest,RunningRequest: the objects that accumulate between full collections)",
    )
    args = p.parse_args(argv)
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="berth-gc-census-"))
    out.mkdir(parents=True, exist_ok=True)
    census = out / "census.jsonl"
    census.unlink(missing_ok=True)
    python = wrapper(out / "python.sh", census)
    os.environ[REFERRERS_ENV] = args.holders  # the wrapper's berth inherits it
    run_queue(python, out / "bench", bench_args)
    if not census.is_file():
        print(f"no census was written ({census}): did berth start?", file=sys.stderr)
        return 1
    doc = summarize(load(census), args.top)
    (out / "gc-census.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print_summary(doc)
    print(f"\ncensus: {census}\nsummary: {out / 'gc-census.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
