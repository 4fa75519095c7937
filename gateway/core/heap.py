"""Settings of CPython's cyclic garbage collector for the long-running daemon.

CPython collects its youngest generation each time the container objects allocated since the last
collection, less those freed, pass 700. A proxy allocates and frees hundreds of them per request
(frames, futures, headers, parsed JSON), so with tens of requests in flight that count passes 700
dozens of times a second although almost nothing is cyclic garbage: every collection walks the young
objects, the ones of the requests in flight survive into older generations, and the oldest grows until
a full collection walks every object the process has, tens of milliseconds during which no request
moves. On the overhead benchmark (64 clients) the collector took about 8% of berth's CPU, and its full
collections were the slowest requests.

`settle()` runs once, when the daemon has built what it keeps for its lifetime (modules, config,
plugins, metric families, the app): it collects, freezes the survivors so that no collection walks
them again, and raises the young threshold so that a collection runs when objects really accumulate.
Memory stays bounded: a collection still runs every YOUNG_THRESHOLD net allocations.
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_THRESHOLD: Final = 10_000


def settle() -> None:
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
