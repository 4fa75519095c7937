"""When each queued request of a queue next needs a look on a scheduler tick.

A tick expires the requests that waited too long and lets admission look at the queued ones again. Both
have a time before which nothing can happen to a request: its queue time plus the wait limit, and (for
an admitter that can say so, `RecheckFrom`) the time before which its recheck is sure to admit it. The
queue keeps those times in a heap (`DueChecks`), so a tick looks only at the requests whose time has
come instead of walking a queue of thousands; the tick still decides each of them exactly as before
(`gateway.sched.ticks`).

A time is asked once per request (`when`), again when its request changes or the epoch the caller passes
changes (the wait limit, the admitter's bound after a refit). A request a tick looked at and kept is put
back at a time the tick gives (`again`: the admitter's tighter promise), which holds while a second
epoch stays the same; when that one changes, every such request is due at once.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Generic, Protocol, TypeVar


class _Item(Protocol):
    @property
    def token(self) -> int: ...


Item = TypeVar("Item", bound=_Item)


class DueChecks(Generic[Item]):
    """Per token of a queue: when it is next due a look (a heap with lazily dropped entries)."""

    __slots__ = ("_again", "_again_epoch", "_at", "_epoch", "_heap", "_new")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._at: dict[int, float] = {}  # token -> the time of its live heap entry
        self._new: list[int] = []  # tokens without a time yet
        self._epoch: Hashable = None
        self._again: set[int] = set()  # tokens put back by `again`: their time holds in `_again_epoch`
        self._again_epoch: Hashable = None

    def add(self, token: int) -> None:
        """A request joined (or its request changed): its time is asked at the next `due`."""
        self._at.pop(token, None)
        self._again.discard(token)
        self._new.append(token)

    def discard(self, token: int) -> None:
        self._at.pop(token, None)  # its heap entry and any place in `_new` are dropped when met
        self._again.discard(token)

    def clear(self) -> None:
        self._heap = []
        self._at.clear()
        self._new = []
        self._again.clear()

    def due(
        self,
        items: Mapping[int, Item],
        now: float,
        epoch: Hashable,
        when: Callable[[Item], float],
        again_epoch: Hashable = None,
    ) -> list[Item]:
        """The requests of `items` (the queue, by token) whose time is `now` or earlier, in queue order;
        they leave the schedule (`again` puts one back). Every request's time is asked again when
        `epoch` differs from the last call's; those `again` put back are due now when `again_epoch`
        differs from the last call's."""
        at = self._at
        heap = self._heap
        again = self._again
        if again_epoch != self._again_epoch:
            self._again_epoch = again_epoch
            for tok in again:
                if tok in at:
                    at[tok] = -math.inf
                    heapq.heappush(heap, (-math.inf, tok))
            again.clear()
        if epoch != self._epoch:
            self._epoch = epoch
            at.clear()
            heap.clear()
            again.clear()
            for tok, item in items.items():
                t = at[tok] = when(item)
                heap.append((t, tok))
            heapq.heapify(heap)
            self._new = []
        if self._new:
            for tok in self._new:
                got = items.get(tok)
                if got is None or tok in at:
                    continue
                t = at[tok] = when(got)
                heapq.heappush(heap, (t, tok))
            self._new = []
        out: list[Item] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, tok = heapq.heappop(heap)
            if at.get(tok) == t:
                del at[tok]
                again.discard(tok)
                out.append(items[tok])
        if len(heap) > 2 * len(at) + 64:
            self._heap = [e for e in heap if at.get(e[1]) == e[0]]
            heapq.heapify(self._heap)
        out.sort(key=lambda q: q.token)
        return out

    def again(self, item: Item, t: float) -> None:
        """Put `item` back on the schedule at `t`, a time that holds while the `again_epoch` of the
        last `due` does."""
        self._at[item.token] = t
        self._again.add(item.token)
        heapq.heappush(self._heap, (t, item.token))
