"""The running requests' predicted ends over some endpoints' loads, in order: where the seat a request
waits for frees (SLO admission counts the requests queued ahead of it, `slo_feasibility`)."""

from __future__ import annotations

from operator import is_

import numpy as np
import numpy.typing as npt

from gateway.sched.predict import EndpointLoad


class SeatOrder:
    """The running requests' predicted ends over some loads (`seat_free`): the first k-th asked is found
    by a partition, and the ends are sorted once a second one is asked of the same loads (the requests
    admitted between two changes of the fleet each ask for another k-th of the same ends)."""

    __slots__ = ("_loads", "_owner", "_sizes", "_sorted", "_times")

    def __init__(self, loads: list[EndpointLoad]) -> None:
        self._loads = loads
        arrays = []
        for load in loads:
            arr = load.memo.get("seat-free")
            if arr is None:
                arr = load.memo["seat-free"] = np.asarray(load.seat_free, dtype=np.float64)
            arrays.append(arr)
        self._sizes = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        self._times = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.float64)
        self._sorted: tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]] | None = None
        self._owner: npt.NDArray[np.int64] | None = None

    def of(self, loads: list[EndpointLoad]) -> bool:
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
