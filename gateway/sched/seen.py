"""`SeenRequests`: the requests a plugin has counted, each counted once, the oldest forgotten first once a
bound is passed. Demand-split and sub-cluster placement count a request's work or its SLO mix the first
time it is placed and not when it is tried again from the queue.

A set beside a deque of the same ids in the order they were counted: a plain dict in insertion order
would find its oldest key by scanning over the entries deleted before it (some 9 µs a request once
16,384 were counted)."""

from __future__ import annotations

from collections import deque
from typing import Final

from gateway.core.types import RequestId

#: Requests remembered by default: a request is seen again only while it waits in the queue, so this
#: bounds memory without counting one twice in practice.
SEEN_MAX: Final = 16384


class SeenRequests:
    """Request ids seen, at most `limit` of them (the oldest forgotten first)."""

    __slots__ = ("_ids", "_order", "limit")

    def __init__(self, limit: int = SEEN_MAX) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self._ids: set[RequestId] = set()
        self._order: deque[RequestId] = deque()

    def first(self, rid: RequestId) -> bool:
        """True the first time `rid` is seen (it is remembered then); False while it is remembered."""
        ids = self._ids
        if rid in ids:
            return False
        ids.add(rid)
        order = self._order
        order.append(rid)
        if len(order) > self.limit:
            ids.discard(order.popleft())
        return True

    def __contains__(self, rid: object) -> bool:
        return rid in self._ids

    def __len__(self) -> int:
        return len(self._ids)
