"""The in-process half of `diag gc-counts`: run a module as `python -m MODULE ARGS` would, with the `gc`
functions the daemon's collector schedule (`gateway.core.heap`) calls wrapped to time them, one JSON
line per call to a file.

    python -m loadgen.diag.gc_counts_hook OUT TRUTH_EVERY_S MODULE ARGS...

Recorded: each walk of the frozen objects (`gc.get_freeze_count`: objects, seconds), each list of the
young generation (`gc.get_objects(0)`: objects, seconds), each collection (generation, the net count
`gc.get_count()[0]` before it, the cyclic garbage found, seconds) and each freeze (the net count before
it). Every `TRUTH_EVERY_S` seconds (0: never) a freeze is followed by a walk of the frozen objects of
the hook's own (`truth`), which `diag gc-counts` compares with an estimate kept from the net counts;
those walks hold the loop too, so a run's lag figures are not the daemon's.
"""

from __future__ import annotations

import gc
import runpy
import sys
import time
from typing import IO, Any

import orjson


class GcCalls:
    """The wrappers, writing to `out`; `install` puts them in the `gc` module."""

    def __init__(self, out: IO[bytes], truth_every_s: float) -> None:
        self.out = out
        self.truth_every_s = truth_every_s
        self._truth_at = -1e18
        self._freeze_count = gc.get_freeze_count
        self._get_objects = gc.get_objects
        self._collect = gc.collect
        self._freeze = gc.freeze

    def _write(self, **rec: Any) -> None:
        rec["at"] = time.monotonic()
        self.out.write(orjson.dumps(rec) + b"\n")
        self.out.flush()

    def freeze_count(self) -> int:
        t0 = time.perf_counter()
        n = self._freeze_count()
        self._write(k="frozen", n=n, s=time.perf_counter() - t0)
        return n

    def get_objects(self, generation: int | None = None) -> list[Any]:
        t0 = time.perf_counter()
        objects = self._get_objects(generation)
        if generation == 0:
            self._write(k="young", n=len(objects), s=time.perf_counter() - t0)
        return objects

    def collect(self, generation: int = 2) -> int:
        net = gc.get_count()[0]
        t0 = time.perf_counter()
        garbage = self._collect(generation)
        self._write(k="collect", gen=generation, net=net, garbage=garbage, s=time.perf_counter() - t0)
        return garbage

    def freeze(self) -> None:
        net = gc.get_count()[0]
        self._freeze()
        self._write(k="freeze", net=net)
        now = time.monotonic()
        if self.truth_every_s > 0 and now - self._truth_at >= self.truth_every_s:
            self._truth_at = now
            t0 = time.perf_counter()
            n = self._freeze_count()
            self._write(k="truth", n=n, s=time.perf_counter() - t0)

    def install(self) -> None:
        gc.get_freeze_count = self.freeze_count
        gc.get_objects = self.get_objects
        gc.collect = self.collect
        gc.freeze = self.freeze


def main() -> None:
    out_path, truth_every, module, *rest = sys.argv[1:]
    out = open(out_path, "ab")  # noqa: SIM115 - open for the process's life
    GcCalls(out, float(truth_every)).install()
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
