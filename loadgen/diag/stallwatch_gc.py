"""The stall watcher's view of the garbage collector: its pauses per generation (`GcPauses`, on
`gc.callbacks`) and, on SIGUSR1, a census of its tracked objects by type and generation (`Census`).
"""

from __future__ import annotations

import gc
import time
import types
from collections import Counter
from typing import Any

from loadgen.diag.stallwatch_stalls import _frame, _short


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
