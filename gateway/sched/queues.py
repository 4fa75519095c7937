"""The requests waiting for a place: one queue per model, and the order a queue is served in.

The next request of a queue is the one with the smallest ordering key (`Ordering.key`); ties go in
arrival order. A key that moves with time (slack) is asked again for every queued request each time the
queue is served (`first`). An ordering that declares its keys stable (`stable_keys`, see
`gateway.sched.interfaces.Ordering`) has each request's key asked once, when the queue is first served
after the request joined it, and kept in a heap: the next request is found without a walk of the queue,
which with thousands of batch requests waiting is most of what a submit or a completion would cost.
Both ways pick the same request. An ordering that keeps its queue ranked (`ranks`, see
`gateway.sched.interfaces.RankedOrdering`: the slack ordering) has each request ranked once, when the
queue is first served after it joined (every request again when the ordering's rank epoch moves), and
picks from the ranks (`gateway.sched.ranked.RankIndex`) in a few binary searches.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, ItemsView, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import count

from gateway.core.types import EndpointId, ModelName, RequestId
from gateway.sched.checks import DueChecks
from gateway.sched.interfaces import Ordering, OrderKey, RankedOrdering
from gateway.sched.ranked import RankIndex
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot
from gateway.sched.unfit import Unfit


@dataclass(slots=True)
class Queued:
    req: SchedRequest
    seq: int  # arrival order among every queued request
    exclude: frozenset[EndpointId] = field(default_factory=frozenset)  # endpoints a retry avoids
    # Clock time it (last) joined the queue: its arrival, or when it was preempted and requeued (the
    # queue's wait limit counts from here).
    queued_at: float = 0.0
    token: int = 0  # its place in its queue's order (unique within the queue; set by ModelQueue.push)
    # Where it last fit nowhere, when it did (gateway.sched.unfit): the next serve tries it only on the
    # endpoints that changed since.
    unfit: Unfit | None = None


class OrderingFault(Exception):
    """The ordering plugin raised on the queued request `item`."""

    def __init__(self, item: Queued, error: Exception) -> None:
        super().__init__(item.req.id, error)
        self.item = item
        self.error = error


def stable_keys(ordering: Ordering) -> bool:
    """Whether `ordering` declares that a waiting request's key does not move (its optional
    `stable_keys` attribute; without one, keys are taken to move with time)."""
    return getattr(ordering, "stable_keys", False) is True


def ranked(ordering: Ordering) -> RankedOrdering | None:
    """`ordering` when it declares that it keeps its queue ranked (its optional `ranks` attribute)."""
    if getattr(ordering, "ranks", False) is True:
        return ordering  # type: ignore[return-value]  # declared by the attribute, as stable_keys
    return None


def first(
    ordering: Ordering, queue: Iterable[Queued], snap: FleetSnapshot, skipped: set[int]
) -> Queued | None:
    """The queued request to place next, asking every key: the smallest ordering key (ties: arrival
    order), leaving out `skipped` (by `seq`); None when every one is skipped. Raises OrderingFault when a
    key cannot be made."""
    key = ordering.key
    best: tuple[OrderKey, int] | None = None
    found: Queued | None = None
    for q in queue:
        if q.seq in skipped:
            continue
        try:
            k = key(q.req, snap)
        except Exception as e:
            raise OrderingFault(q, e) from None
        if best is None or (k, q.seq) < best:
            best = (k, q.seq)
            found = q
    return found


#: Heap entry of a stable key: (key, seq, entry number, token); live while the token's entry is it.
_Entry = tuple[OrderKey, int, int, int]


class ModelQueue:
    """One model's waiting requests in the order they joined, with counts per SLO class kept as they
    come and go, and (while served under an ordering with stable keys) their keys in a heap.

    Iterating gives the requests in queue order. Change a queued request's `req` only through `set_req`
    (its class count and key follow)."""

    __slots__ = (
        "_classes",
        "_entries",
        "_entry",
        "_heap",
        "_items",
        "_ordering",
        "_passed",
        "_passed_for",
        "_pending",
        "_ranks",
        "_tokens",
        "checks",
    )

    def __init__(self) -> None:
        self._items: dict[int, Queued] = {}  # by token, in queue order
        self._classes: dict[str, int] = {}
        self._tokens = count()
        # The stable ordering the heap was built for (None: no heap kept); tokens without a key yet, in
        # queue order; each keyed token's live entry number (older entries of it are dead).
        self._ordering: Ordering | None = None
        self._heap: list[_Entry] = []
        self._pending: list[int] = []
        self._entry: dict[int, int] = {}
        self._entries = count()
        # Heap entries of skipped requests taken out by `first` while one serve passes over them: the
        # serve's `skipped` set (the same object, call after call, only growing) and the entries.
        self._passed_for: set[int] | None = None
        self._passed: list[_Entry] = []
        # While served under a ranked ordering (`_ordering` then is it): the ranks given so far (tokens
        # without one wait in `_pending`).
        self._ranks: RankIndex | None = None
        # When each request next needs a look on a tick (gateway.sched.ticks).
        self.checks: DueChecks[Queued] = DueChecks()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Queued]:
        return iter(self._items.values())

    def head(self) -> Queued:
        """The request that joined first (the queue must not be empty)."""
        return next(iter(self._items.values()))

    def due(
        self, now: float, epoch: Hashable, when: Callable[[Queued], float], again_epoch: Hashable = None
    ) -> list[Queued]:
        """The queued requests due a look on a tick at `now` (`DueChecks.due`), in queue order."""
        return self.checks.due(self._items, now, epoch, when, again_epoch)

    def in_class(self, slo_class: str) -> int:
        return self._classes.get(slo_class, 0)

    def classes(self) -> dict[str, int]:
        """Queued requests per SLO class (classes with none left out)."""
        return {c: n for c, n in self._classes.items() if n}

    def push(self, req: SchedRequest, seq: int, exclude: frozenset[EndpointId], queued_at: float) -> Queued:
        item = Queued(req, seq, exclude, queued_at, next(self._tokens))
        self._items[item.token] = item
        classes, cls = self._classes, req.slo.slo_class
        classes[cls] = classes.get(cls, 0) + 1
        self.checks.add(item.token)
        if self._ordering is not None:
            self._pending.append(item.token)  # tokens only grow: the list stays in queue order
        return item

    def remove(self, item: Queued) -> None:
        tok = item.token
        del self._items[tok]
        self._classes[item.req.slo.slo_class] -= 1
        self.checks.discard(tok)
        if self._ordering is None:
            return
        ranks = self._ranks
        if ranks is not None:
            if not ranks.discard(tok):
                pending = self._pending
                del pending[bisect_left(pending, tok)]
        elif self._entry.pop(tok, None) is None:
            pending = self._pending
            del pending[bisect_left(pending, tok)]
        elif len(self._heap) > 2 * len(self._entry) + 64:
            self._compact()

    def set_req(self, item: Queued, req: SchedRequest) -> None:
        """Replace a queued request's request (admission demoted it): its key is asked again."""
        if req is item.req:
            return
        self._count(item.req.slo.slo_class, -1)
        self._count(req.slo.slo_class, 1)
        item.req = req
        self.checks.add(item.token)
        if self._ordering is None:
            return
        ranks = self._ranks
        tok = item.token
        if ranks.discard(tok) if ranks is not None else self._entry.pop(tok, None) is not None:
            insort(self._pending, item.token)

    def clear(self) -> None:
        self._items.clear()
        self._classes.clear()
        self.checks.clear()
        self._drop_keys()

    def first(self, ordering: Ordering, snap: FleetSnapshot, skipped: set[int]) -> Queued | None:
        """What module-level `first` picks, from the heap when `ordering` has stable keys; what a ranked
        ordering picks from the ranks when it keeps its queue ranked."""
        by_rank = ranked(ordering)
        if by_rank is not None:
            return self._first_ranked(by_rank, snap, skipped)
        if not stable_keys(ordering):
            if self._ordering is not None:
                self._drop_keys()
            return first(ordering, self._items.values(), snap, skipped)
        if ordering is not self._ordering or self._ranks is not None:
            self._drop_keys()
            self._ordering = ordering
            self._pending = list(self._items)
        self._key_pending(ordering, snap)
        if skipped is not self._passed_for or not all(e[1] in skipped for e in self._passed):
            self._restore()
            self._passed_for = skipped
        heap, entry, items, passed = self._heap, self._entry, self._items, self._passed
        while heap:
            top = heap[0]
            if entry.get(top[3]) != top[2]:
                heapq.heappop(heap)  # its request left the queue or was keyed again
            elif top[1] in skipped:
                # kept aside while this serve passes over it (`_restore` puts it back): the serve's
                # next call does not take it out again
                passed.append(heapq.heappop(heap))
            else:
                return items[top[3]]
        return None

    def _restore(self) -> None:
        """Put the entries a serve passed over back on the heap (the dead ones are dropped)."""
        passed, entry, heap = self._passed, self._entry, self._heap
        for e in passed:
            if entry.get(e[3]) == e[2]:
                heapq.heappush(heap, e)
        self._passed = []
        self._passed_for = None

    def _first_ranked(
        self, ordering: RankedOrdering, snap: FleetSnapshot, skipped: set[int]
    ) -> Queued | None:
        items = self._items
        if not items:
            return None
        model = self.head().req.model
        try:
            epoch = ordering.rank_epoch(model, snap)
        except Exception as e:
            raise OrderingFault(self.head(), e) from None
        ranks = self._ranks
        if ranks is None or ranks.ordering is not ordering or ranks.epoch != epoch:
            self._drop_keys()
            self._ordering = ordering
            self._ranks = ranks = RankIndex(ordering, epoch)
            self._pending = list(items)
        pending = self._pending
        if pending:
            rank = ordering.rank
            for i, tok in enumerate(pending):
                item = items[tok]
                try:
                    r = rank(item.req, snap)
                except Exception as e:
                    del pending[:i]  # the ones before it have their ranks; it and those after it wait
                    raise OrderingFault(item, e) from None
                ranks.add(tok, item.seq, r)
            pending.clear()
        try:
            chosen = ordering.pick(ranks, model, snap, skipped)
        except Exception as e:
            raise OrderingFault(self.head(), e) from None
        return None if chosen is None else items[chosen]

    def _key_pending(self, ordering: Ordering, snap: FleetSnapshot) -> None:
        pending = self._pending
        if not pending:
            return
        key, items, heap, entry, entries = ordering.key, self._items, self._heap, self._entry, self._entries
        for i, tok in enumerate(pending):
            item = items[tok]
            try:
                k = key(item.req, snap)
            except Exception as e:
                del pending[:i]  # the ones before it have their keys; it and those after it wait
                raise OrderingFault(item, e) from None
            n = next(entries)
            entry[tok] = n
            heapq.heappush(heap, (k, item.seq, n, tok))
        pending.clear()

    def _drop_keys(self) -> None:
        self._passed = []
        self._passed_for = None
        self._ordering = None
        self._ranks = None
        self._heap = []
        self._pending = []
        self._entry.clear()

    def _compact(self) -> None:
        """Rebuild the heap from its live entries (dead ones outnumber them)."""
        self._restore()
        entry = self._entry
        self._heap = heap = [e for e in self._heap if entry.get(e[3]) == e[2]]
        heapq.heapify(heap)

    def _count(self, slo_class: str, n: int) -> None:
        self._classes[slo_class] = self._classes.get(slo_class, 0) + n


class Queues:
    """The queue of every model that has had one (a drained queue stays, empty)."""

    __slots__ = ("_by_model", "_seq")

    def __init__(self) -> None:
        self._by_model: dict[ModelName, ModelQueue] = {}
        self._seq = count()

    def get(self, model: ModelName) -> ModelQueue | None:
        return self._by_model.get(model)

    def of(self, model: ModelName) -> ModelQueue:
        """The queue of `model`, made empty when it has none yet."""
        queue = self._by_model.get(model)
        if queue is None:
            queue = self._by_model[model] = ModelQueue()
        return queue

    def next_seq(self) -> int:
        """A place in arrival order for a request placed without being queued (`Scheduler.submit`)."""
        return next(self._seq)

    def push(
        self,
        queue: ModelQueue,
        req: SchedRequest,
        exclude: frozenset[EndpointId],
        *,
        seq: int | None = None,
        queued_at: float | None = None,
    ) -> int:
        """Append `req`; `seq` keeps the place in arrival order of a request queued before (a preempted
        one). Its sequence number."""
        n = next(self._seq) if seq is None else seq
        queue.push(req, n, exclude, req.arrival if queued_at is None else queued_at)
        return n

    def cancel(self, req_id: RequestId) -> bool:
        """Drop a queued request; True if it was queued."""
        for queue in self._by_model.values():
            for item in queue:
                if item.req.id == req_id:
                    queue.remove(item)
                    return True
        return False

    def items(self) -> ItemsView[ModelName, ModelQueue]:
        return self._by_model.items()

    def models(self) -> list[ModelName]:
        return list(self._by_model)

    def any_waiting(self) -> bool:
        return any(self._by_model.values())

    def depth(self, model: ModelName) -> int:
        return len(self._by_model.get(model, ()))

    def depths(self) -> dict[ModelName, int]:
        """Every model's queue length (drained ones included, as 0)."""
        return {m: len(q) for m, q in self._by_model.items()}

    def waiting(self) -> dict[ModelName, int]:
        """Queue lengths of the models with requests waiting (what a snapshot carries)."""
        return {m: len(q) for m, q in self._by_model.items() if q}

    def by_class(self) -> dict[ModelName, dict[str, int]]:
        """Queued requests per model and SLO class (counted as requests come and go)."""
        return {model: queue.classes() for model, queue in self._by_model.items() if queue}
