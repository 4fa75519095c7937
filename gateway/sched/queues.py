"""The requests waiting for a place: one queue per model, and the order a queue is served in.

The next request of a queue is the one with the smallest ordering key (`Ordering.key`, asked again each
time the queue is served, since keys such as slack move with time); ties go in arrival order.
"""

from __future__ import annotations

from collections.abc import ItemsView, Sequence
from dataclasses import dataclass, field
from itertools import count

from gateway.core.types import EndpointId, ModelName, RequestId
from gateway.sched.interfaces import Ordering, OrderKey
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


@dataclass(slots=True)
class Queued:
    req: SchedRequest
    seq: int  # arrival order among every queued request
    exclude: frozenset[EndpointId] = field(default_factory=frozenset)  # endpoints a retry avoids
    # Clock time it (last) joined the queue: its arrival, or when it was preempted and requeued (the
    # queue's wait limit counts from here).
    queued_at: float = 0.0


class OrderingFault(Exception):
    """The ordering plugin raised on the queued request at `index`."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


def first(ordering: Ordering, queue: Sequence[Queued], snap: FleetSnapshot, skipped: set[int]) -> int | None:
    """The index of the queued request to place next: the smallest ordering key (ties: arrival order),
    leaving out `skipped` (by `seq`); None when every one is skipped. Raises OrderingFault when a key
    cannot be made."""
    key = ordering.key
    best: tuple[OrderKey, int, int] | None = None
    for i, q in enumerate(queue):
        if q.seq in skipped:
            continue
        try:
            k = key(q.req, snap)
        except Exception as e:
            raise OrderingFault(i, e) from None
        if best is None or (k, q.seq) < (best[0], best[1]):
            best = (k, q.seq, i)
    return None if best is None else best[2]


class Queues:
    """The queue of every model that has had one (a drained queue stays, empty)."""

    __slots__ = ("_by_model", "_seq")

    def __init__(self) -> None:
        self._by_model: dict[ModelName, list[Queued]] = {}
        self._seq = count()

    def get(self, model: ModelName) -> list[Queued] | None:
        return self._by_model.get(model)

    def of(self, model: ModelName) -> list[Queued]:
        """The queue of `model`, made empty when it has none yet."""
        return self._by_model.setdefault(model, [])

    def push(
        self,
        queue: list[Queued],
        req: SchedRequest,
        exclude: frozenset[EndpointId],
        *,
        seq: int | None = None,
        queued_at: float | None = None,
    ) -> int:
        """Append `req`; `seq` keeps the place in arrival order of a request queued before (a preempted
        one). Its sequence number."""
        n = next(self._seq) if seq is None else seq
        queue.append(Queued(req, n, exclude, req.arrival if queued_at is None else queued_at))
        return n

    def cancel(self, req_id: RequestId) -> bool:
        """Drop a queued request; True if it was queued."""
        for queue in self._by_model.values():
            for i, item in enumerate(queue):
                if item.req.id == req_id:
                    del queue[i]
                    return True
        return False

    def items(self) -> ItemsView[ModelName, list[Queued]]:
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
        """Queued requests per model and SLO class (walks every queue)."""
        out: dict[ModelName, dict[str, int]] = {}
        for model, queue in self._by_model.items():
            if queue:
                counts = out[model] = {}
                for item in queue:
                    cls = item.req.slo.slo_class
                    counts[cls] = counts.get(cls, 0) + 1
        return out
