"""The running requests' predicted ends over some endpoints' loads, in order: where the seat a request
waits for frees (SLO admission counts the requests queued ahead of it, `slo_feasibility`). The loads
may be ones the load cache has decided to make and not made yet (`Pending`, `LoadCache.refs`): their
ends are derived together as arrays (`gateway.sched.load_batch.derive`, bit-equal to `EndpointLoad`'s
`seat_free`), and no `EndpointLoad` is made for them."""

from __future__ import annotations

from collections.abc import Sequence
from operator import is_
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.sched.load_batch import Pending, derive
from gateway.sched.predict import EndpointLoad

_Floats = npt.NDArray[np.float64]
_EMPTY: _Floats = np.zeros(0, dtype=np.float64)

#: Pending loads with running requests from which their ends are derived together as arrays; below it
#: each is made as an `EndpointLoad` (numpy's fixed cost per batch is more than the Python steps it
#: saves: at 100 endpoints with 1,000 queued, the 15-20 loads remade per decision, about 15 running
#: requests each, were cheaper made one by one; a batch wins only when most of the fleet is remade at
#: once, as after a refresh of every endpoint's view).
SEAT_ENDS_FROM: Final = 64


def _seat_frees(loads: Sequence[EndpointLoad | Pending], batch_from: int) -> list[_Floats]:
    """Each load's running requests' predicted ends (any order within a load): a made load's
    `seat_free`, kept in its memo as an array; those of the pending ones with running requests derived
    together (one cache's loads: the same parameters) and kept on them when there are `batch_from` or
    more, else made."""
    arrays: list[_Floats] = []
    todo: list[tuple[int, Pending]] = []
    for ref in loads:
        load: EndpointLoad
        if isinstance(ref, Pending):
            if ref.made is None:
                got = ref.seat_free
                if got is None:
                    if not ref.n:
                        got = ref.seat_free = _EMPTY
                    else:
                        todo.append((len(arrays), ref))
                        got = _EMPTY
                arrays.append(got)
                continue
            load = ref.made
        else:
            load = ref
        arrays.append(_memo(load))
    if todo and len(todo) < batch_from:
        for i, p in todo:
            arrays[i] = _memo(p.load())
    elif todo:
        params = todo[0][1].params
        finish = derive([(p.view, p.now, p.pace) for _, p in todo], params, ()).finish
        for row, (i, p) in enumerate(todo):
            arrays[i] = p.seat_free = finish[row, : p.n]
    return arrays


def _memo(load: EndpointLoad) -> _Floats:
    """`load.seat_free` as an array, kept in its memo."""
    arr: _Floats | None = load.memo.get("seat-free")
    if arr is None:
        arr = load.memo["seat-free"] = np.asarray(load.seat_free, dtype=np.float64)
    return arr


class SeatOrder:
    """The running requests' predicted ends over some loads (`seat_free`): the first k-th asked is found
    by a partition, and the ends are sorted once a second one is asked of the same loads (the requests
    admitted between two changes of the fleet each ask for another k-th of the same ends)."""

    __slots__ = ("_loads", "_owner", "_sizes", "_sorted", "_times")

    def __init__(self, loads: Sequence[EndpointLoad | Pending], batch_from: int = SEAT_ENDS_FROM) -> None:
        """`batch_from`: pending loads from which their ends are derived as arrays (`SEAT_ENDS_FROM`)."""
        self._loads = loads
        arrays = _seat_frees(loads, batch_from)
        self._sizes = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        self._times = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.float64)
        self._sorted: tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]] | None = None
        self._owner: npt.NDArray[np.int64] | None = None

    def of(self, loads: Sequence[EndpointLoad | Pending]) -> bool:
        """Whether it is the order of exactly these loads."""
        kept = self._loads
        return kept is loads or (len(kept) == len(loads) and all(map(is_, kept, loads)))

    def kth(self, k: int) -> tuple[float, int] | None:
        """`kth_free` of its loads."""
        times = self._times
        if k >= len(times):
            return None
        got = self._sorted
        if got is not None:
            return float(got[0][k]), int(got[1][k])
        owner = self._owner
        if owner is None:
            # the first question: a partition (ties at t go by load index, as the concatenation is in
            # load order); kept to sort at the second
            self._owner = np.repeat(np.arange(len(self._sizes), dtype=np.int64), self._sizes)
            t = float(np.partition(times, k)[k])
            nth = k - int(np.count_nonzero(times < t))
            at = int(np.flatnonzero(times == t)[nth])
            return t, int(self._owner[at])
        order = np.argsort(times, kind="stable")  # stable: ties keep the loads' order
        got = self._sorted = (times[order], owner[order])
        return float(got[0][k]), int(got[1][k])


def kth_free(loads: list[EndpointLoad], k: int) -> tuple[float, int] | None:
    """The `k`-th (from 0) of the running requests' predicted ends over `loads` (`seat_free`), as (time,
    index of its load): `sorted((t, i) for i, load in enumerate(loads) for t in load.seat_free)[k]`;
    None when there are not that many."""
    return SeatOrder(loads).kth(k)
