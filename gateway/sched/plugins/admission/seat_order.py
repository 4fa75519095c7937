"""The running requests' predicted ends over some endpoints' loads, in order: where the seat a request
waits for frees (SLO admission counts the requests queued ahead of it, `slo_feasibility`). The loads
may be ones the load cache has decided to make and not made yet (`Pending`, `LoadCache.refs`): their
ends are derived together as arrays (`gateway.sched.load_batch.derive`, bit-equal to `EndpointLoad`'s
`seat_free`), and no `EndpointLoad` is made for them."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, compress
from operator import is_not, sub
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.sched.load_batch import Pending
from gateway.sched.plugins.admission.seat_ends import ends
from gateway.sched.predict import EndpointLoad

_Floats = npt.NDArray[np.float64]
_EMPTY: _Floats = np.zeros(0, dtype=np.float64)

#: Pending loads with running requests from which their ends are derived together as arrays
#: (`seat_ends.ends`); below it each is made as an `EndpointLoad`. Measured on the same loads inside a
#: decisions run (`berth-loadgen diag seat-ends`, docs/submit-cost.md): a load made costs about 15-20 µs
#: (about 16 running requests); a batch about 135 µs, plus about 5 µs a load whose rows are kept on its
#: pace (`Pace.arrays`: a batch makes them; a load remade for its age alone, or for new coefficients
#: with the same running requests, takes them over) and about 26 µs a load whose rows are made first. A
#: batch pays from about 13 loads with rows kept, and once a batch made the rows nearly every load
#: admission remakes has them (they stay while the endpoint's running requests do).
SEAT_ENDS_FROM: Final = 16


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
        for (i, p), got in zip(todo, ends([p for _, p in todo]), strict=True):
            arrays[i] = p.seat_free = got
    return arrays


def cached_ends(ref: EndpointLoad | Pending) -> _Floats | None:
    """The load's running requests' predicted ends when known without deriving anything (a batch's, or
    a made load's, kept or from its states), else None."""
    if type(ref) is Pending:
        if ref.seat_free is not None:
            return ref.seat_free
        made = ref.made
        if made is None:
            return None
        return _memo(made)
    return _memo(ref)  # type: ignore[arg-type]


def _memo(load: EndpointLoad) -> _Floats:
    """`load.seat_free` as an array, kept in its memo."""
    arr: _Floats | None = load.memo.get("seat-free")
    if arr is None:
        arr = load.memo["seat-free"] = np.asarray(load.seat_free, dtype=np.float64)
    return arr


#: Running requests' ends up to which a first question sorts them all; past it the first question is
#: answered by a partition (and the two scans that find one k-th among ties), and a second one sorts.
#: Inside a decisions run (1,000 queued, about 1,600 running requests' ends, each order asked once) a
#: stable argsort costs about 75 µs and the partition with its scans about 45 (a sort timed again and
#: again on the same array is far cheaper than on fresh ends: docs/submit-cost.md), so every first
#: question partitions.
SORT_UP_TO: Final = 0
#: A new list of loads of which at most this share are other objects than the last one's renews the
#: order (`SeatOrder.renewed`: only their ends are replaced); more, and it is made anew.
RENEW_SHARE: Final = 0.25


class SeatOrder:
    """The running requests' predicted ends over some loads (`seat_free`), concatenated in the loads'
    order: a k-th is read from their stable sort, or for many ends (`SORT_UP_TO`) the first one asked
    by a partition. The requests admitted between two changes of the fleet each ask for another k-th of
    the same ends, and a change of the fleet remakes a few of the loads only: `renewed` replaces their
    ends and keeps the others'."""

    __slots__ = ("_asked", "_batch_from", "_loads", "_sorted", "_starts", "_times")

    def __init__(self, loads: Sequence[EndpointLoad | Pending], batch_from: int = SEAT_ENDS_FROM) -> None:
        """`batch_from`: pending loads from which their ends are derived as arrays (`SEAT_ENDS_FROM`)."""
        arrays = _seat_frees(loads, batch_from)
        self._set(loads, batch_from, [0, *accumulate(len(a) for a in arrays)], _joined(arrays))

    def _set(
        self, loads: Sequence[EndpointLoad | Pending], batch_from: int, starts: list[int], times: _Floats
    ) -> None:
        self._loads = loads
        self._batch_from = batch_from
        self._starts = starts  # where each load's ends start in `_times`, and their count at the end
        self._times = times
        self._sorted: npt.NDArray[np.int64] | None = None  # `_times`' stable argsort, once asked
        self._asked = False  # a first question was answered by a partition

    def renewed(self, loads: Sequence[EndpointLoad | Pending], share: float = RENEW_SHARE) -> SeatOrder:
        """The order of `loads`: this one when they are its loads; when as many loads of which at most
        `share` are other objects, a new order with only those loads' ends replaced; else made anew."""
        kept = self._loads
        if kept is loads:
            return self
        if len(kept) != len(loads):
            return SeatOrder(loads, self._batch_from)
        # the places whose load is another object (map and compress: no Python step per load)
        changed = list(compress(range(len(loads)), map(is_not, kept, loads)))
        if not changed:
            self._loads = loads  # (the same objects: the next question finds the list itself)
            return self
        if len(changed) > share * len(loads):
            return SeatOrder(loads, self._batch_from)
        arrays = _seat_frees([loads[i] for i in changed], self._batch_from)
        starts, times = self._starts, self._times
        pieces: list[_Floats] = []
        sizes = list(map(sub, starts[1:], starts))  # each load's ends
        prev = 0
        for i, arr in zip(changed, arrays, strict=True):
            pieces += (times[prev : starts[i]], arr)
            prev = starts[i + 1]
            sizes[i] = len(arr)
        pieces.append(times[prev:])
        out = SeatOrder.__new__(SeatOrder)
        out._set(loads, self._batch_from, [0, *accumulate(sizes)], np.concatenate(pieces))
        return out

    def known_at_most(self, loads: Sequence[EndpointLoad | Pending], t: float) -> tuple[int, list[int]]:
        """How many of `loads`' running requests' ends this order knows to be at most `t` (those of the
        loads at the places where they are the same objects as its own), and the other places (as many
        loads, else none is known and every place is another)."""
        kept = self._loads
        if len(kept) != len(loads):
            return 0, list(range(len(loads)))
        within = self._times <= t
        count = int(np.count_nonzero(within))
        if kept is loads:
            return count, []
        changed = list(compress(range(len(loads)), map(is_not, kept, loads)))
        if not changed or not count:
            return count, changed
        # less the ends of the changed places (a cumulative count read at their bounds)
        starts = np.asarray(self._starts)
        upto = np.concatenate(([0], np.cumsum(within)))
        at = np.asarray(changed)
        return count - int((upto[starts[at + 1]] - upto[starts[at]]).sum()), changed

    def kth(self, k: int) -> tuple[float, int] | None:
        """`kth_free` of its loads."""
        times = self._times
        if k >= len(times):
            return None
        order = self._sorted
        if order is None:
            if len(times) > SORT_UP_TO and not self._asked:
                self._asked = True
                # the first question over many ends: a partition (ties at t go by load index, as the
                # concatenation is in load order)
                t = float(np.partition(times, k)[k])
                nth = k - int(np.count_nonzero(times < t))
                at = int(np.flatnonzero(times == t)[nth])
                return float(times[at]), self._owner(at)  # (the end itself: a zero's sign too)
            order = self._sorted = np.argsort(times, kind="stable")  # stable: ties keep the loads' order
        at = int(order[k])
        return float(times[at]), self._owner(at)

    def _owner(self, at: int) -> int:
        """The index of the load whose ends hold place `at` (an empty load's start is its next one's)."""
        return bisect_right(self._starts, at) - 1


def _joined(arrays: list[_Floats]) -> _Floats:
    return np.concatenate(arrays) if arrays else _EMPTY


def kth_free(loads: list[EndpointLoad], k: int) -> tuple[float, int] | None:
    """The `k`-th (from 0) of the running requests' predicted ends over `loads` (`seat_free`), as (time,
    index of its load): `sorted((t, i) for i, load in enumerate(loads) for t in load.seat_free)[k]`;
    None when there are not that many."""
    return SeatOrder(loads).kth(k)
