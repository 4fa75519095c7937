"""The in-process half of `diag gc-census`: run a module as `python -m MODULE ARGS` would, with a
`gc.callbacks` entry that writes one JSON line per collection to a file.

    python -m loadgen.diag.gc_census_hook OUT MODULE ARGS...

For a young collection it records, before the collection: the young generation's objects by type, the
references each type's objects hold (`gc.get_referents`: what the collection visits besides the
objects themselves), the largest containers, and the frozen objects' count (0 until the daemon's
schedule settled); the pause itself on `time.perf_counter` and the thread's CPU time, the census
excluded; after it, the objects it collected and the survivors by type (the schedule freezes at every
step, so the middle generation holds exactly them). For an older generation, its pause alone. The census
holds the loop (tens of milliseconds per collection of tens of thousands of objects): the run's lag
figures are not the daemon's.
"""

from __future__ import annotations

import gc
import runpy
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import IO, Any, Final

import orjson

#: Types kept per record, by objects and by references.
TOP: Final = 30
#: A container holding this many references or more is listed among the largest.
LARGE_REFS: Final = 200


class YoungCensus:
    """The `gc.callbacks` entry: a census before each young collection, its pause, its survivors."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.rec: dict[str, Any] | None = None
        self.t0 = self.c0 = 0.0

    def __call__(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self.rec = census() if info["generation"] == 0 else {"generation": info["generation"]}
            self.rec["at"] = time.monotonic()
            self.t0, self.c0 = time.perf_counter(), time.thread_time()
            return
        wall, cpu = time.perf_counter() - self.t0, time.thread_time() - self.c0
        rec, self.rec = self.rec, None
        if rec is None:
            return
        rec.update(ms=wall * 1000.0, cpu_ms=cpu * 1000.0, collected=info["collected"])
        if info["generation"] == 0:
            survivors = gc.get_objects(1)
            rec["survivors"] = len(survivors)
            rec["survivor_types"] = Counter(type(o).__qualname__ for o in survivors).most_common(TOP)
            del survivors
        self.out.write(orjson.dumps(rec) + b"\n")
        self.out.flush()


def census() -> dict[str, Any]:
    """The young generation now: objects and references by type, the largest containers."""
    objects = gc.get_objects(0)
    kinds: Counter[str] = Counter()
    refs: Counter[str] = Counter()
    large: list[tuple[int, str, str]] = []
    for o in objects:
        name = type(o).__qualname__
        referents = gc.get_referents(o)
        kinds[name] += 1
        refs[name] += len(referents)
        if len(referents) >= LARGE_REFS:
            held = Counter(type(r).__qualname__ for r in referents).most_common(1)[0][0]
            large.append((len(referents), name, held))
    large.sort(reverse=True)
    return {
        "generation": 0,
        "objects": len(objects),
        "references": sum(refs.values()),
        "types": kinds.most_common(TOP),
        "refs_by_type": refs.most_common(TOP),
        "largest": large[:10],
        "frozen": gc.get_freeze_count(),
    }


def main() -> None:
    out_path, module, *rest = sys.argv[1:]
    out = open(out_path, "ab")  # noqa: SIM115 - open for the process's life
    gc.callbacks.insert(0, YoungCensus(out))
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
