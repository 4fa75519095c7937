"""The in-process half of `diag gc-census`: run a module as `python -m MODULE ARGS` would, with a
`gc.callbacks` entry that writes one JSON line per collection to a file.

    python -m loadgen.diag.gc_census_hook OUT MODULE ARGS...

For a young collection it records, before the collection: the young generation's objects by type, the
references each type's objects hold (`gc.get_referents`: what the collection visits besides the
objects themselves), the largest containers, and the frozen objects' count (0 until the daemon's
schedule settled); the pause itself on `time.perf_counter` and the thread's CPU time, the census
excluded; after it, the objects it collected and the survivors by type (the schedule freezes at every
step, so the middle generation holds exactly them). For a full collection, its pause and its survivors
by type (the daemon's schedule unfroze everything before it: they are every tracked object), which two
full collections apart say what accumulates. The census
holds the loop (tens of milliseconds per collection of tens of thousands of objects): the run's lag
figures are not the daemon's.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import IO, Any, Final

import orjson

#: Comma-separated type names (the environment's): a full collection records what holds the oldest
#: survivors of each (`holders`).
REFERRERS_ENV: Final = "BERTH_GC_CENSUS_REFERRERS"
#: Types kept per record, by objects and by references.
TOP: Final = 30
#: A container holding this many references or more is listed among the largest.
LARGE_REFS: Final = 200


class YoungCensus:
    """The `gc.callbacks` entry: a census before each young collection, its pause, its survivors."""

    def __init__(self, out: IO[bytes], referrers: frozenset[str] = frozenset()) -> None:
        self.out = out
        self.referrers = referrers  # types whose oldest survivors' holders a full collection records
        self.rec: dict[str, Any] | None = None
        self.t0 = self.c0 = 0.0

    def __call__(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            gen = info["generation"]
            # frozen 0 at a full collection's start: the daemon's schedule unfroze everything for it
            self.rec = census() if gen == 0 else {"generation": gen, "frozen": gc.get_freeze_count()}
            self.rec["at"] = time.monotonic()
            self.t0, self.c0 = time.perf_counter(), time.thread_time()
            return
        wall, cpu = time.perf_counter() - self.t0, time.thread_time() - self.c0
        rec, self.rec = self.rec, None
        if rec is None:
            return
        rec.update(ms=wall * 1000.0, cpu_ms=cpu * 1000.0, collected=info["collected"])
        if info["generation"] in (0, 2):  # a full collection's survivors are in the oldest generation
            survivors = gc.get_objects(1 if info["generation"] == 0 else 2)
            rec["survivors"] = len(survivors)
            kinds = Counter(type(o).__qualname__ for o in survivors)
            rec["survivor_types"] = kinds.most_common(TOP if info["generation"] == 0 else 2 * TOP)
            if info["generation"] == 2 and self.referrers:
                rec["referrers"] = holders(survivors, self.referrers)
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


def _name(o: object) -> str:
    return type(o).__qualname__


def holders(objects: list[Any], names: frozenset[str], per_type: int = 3) -> dict[str, list[list[str]]]:
    """For the first (oldest) `per_type` objects of each type named in `names`: what holds them, two
    levels up (the holder's type, and for a container the types that hold it), the list of
    `objects` and this frame's locals left out."""
    found: dict[str, list[Any]] = {}
    for o in objects:
        name = _name(o)
        if name in names and len(found.setdefault(name, [])) < per_type:
            found[name].append(o)
    out: dict[str, list[list[str]]] = {}
    ignore = {id(objects), id(found)}
    for name, sample in found.items():
        ignore.add(id(sample))
        for o in sample:
            chain: list[str] = []
            for holder in gc.get_referrers(o):
                if id(holder) in ignore:
                    continue
                up = [_name(h) for h in gc.get_referrers(holder) if id(h) not in ignore and h is not sample]
                chain.append(f"{_name(holder)} <- {', '.join(sorted(set(up))[:4]) or '?'}")
            out.setdefault(name, []).append(chain[:6])
    return out


def main() -> None:
    out_path, module, *rest = sys.argv[1:]
    out = open(out_path, "ab")  # noqa: SIM115 - open for the process's life
    referrers = frozenset(filter(None, os.environ.get(REFERRERS_ENV, "").split(",")))
    gc.callbacks.insert(0, YoungCensus(out, referrers))
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
