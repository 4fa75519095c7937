"""Bounded memos by request that forget their oldest entries a few at a time.

A memo kept per request (what a plugin worked out for a queued request, asked again serve after serve)
must not grow without bound: requests come and go. Emptying it whole when it reaches its bound frees
every entry in one call, and an entry holds its request, often the last reference to it: with a few
thousand entries that is thousands of objects freed inside one scheduler call (4-5 ms for 4,096
requests under the standing queue, `docs/standing-queue.md`), a stall of every stream the gateway
relays. `make_room` forgets the oldest entries (insertion order) in small batches instead, so the cost
is spread over the insertions, and an entry still wanted is forgotten only after every entry made
before it.
"""

from __future__ import annotations

from itertools import islice
from typing import Final, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: Entries forgotten at a time by `make_room`.
BATCH: Final = 32


def make_room(memo: dict[K, V], bound: int, batch: int = BATCH) -> None:
    """Before an insertion: when `memo` holds `bound` entries or more, forget its `batch` oldest."""
    if len(memo) < bound:
        return
    for key in list(islice(memo, batch)):
        del memo[key]
