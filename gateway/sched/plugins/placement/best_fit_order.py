"""Which endpoints best fit (`gateway.sched.plugins.placement.best_fit`) tries first for a request with
part of its prompt cached."""

from __future__ import annotations

from collections.abc import Iterator
from heapq import merge
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.sched.loads import LoadCache
from gateway.sched.predict import EndpointLoad
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetColumns


def holders_first(req: SchedRequest, order: list[EndpointLoad]) -> list[EndpointLoad]:
    """`order` with the endpoints holding part of the request's prompt in their prefix cache moved to
    the front, earliest predicted first token first, when their first token comes before the one on the
    endpoint the order would try first: waiting there costs less than the prefill the cache saves
    (both in the same prediction, `EndpointLoad.predict`). Without a cached prefix, `order` as it is."""
    if not order:
        return order
    head = order[0].predict(req).ttft_s
    ahead = []
    for load in order:
        if req.cached.get_tokens(load.view.id) > 0:
            ttft = load.predict(req).ttft_s
            if ttft < head:
                ahead.append((ttft, str(load.view.id), load))
    if not ahead:
        return order
    ahead.sort(key=lambda t: (t[0], t[1]))
    first = [t[2] for t in ahead]
    moved = {id(x) for x in first}
    return first + [x for x in order if id(x) not in moved]


class _Fit(Protocol):
    """What of best fit (`gateway.sched.plugins.placement.best_fit.BestFitFilter`) `few_busy` asks."""

    @property
    def rebalance(self) -> float: ...
    @property
    def packs(self) -> bool: ...
    def capacity_norm(self, load: EndpointLoad) -> float: ...
    def fits_both(self, load: EndpointLoad, req: SchedRequest) -> tuple[bool, bool]: ...


def few_busy(  # noqa: PLR0917 (best fit's columnar step's arguments)
    fit: _Fit,
    cache: LoadCache,
    req: SchedRequest,
    cols: FleetColumns,
    candidates: npt.NDArray[np.bool_],
    places: npt.NDArray[np.intp],
    now: float,
) -> npt.NDArray[np.bool_]:
    """`BestFitFilter.filter_columns` with few busy candidates (`places`) in a capacity_norm order
    (most or least loaded first): the busy ones' keys from their loads, the idle ones' known (not
    demoted, capacity_norm 0) and taken in id rank order as the tries reach them (`idle_first_order`),
    so the fleet is not sorted when an idle endpoint or one of the busy ones takes the request."""
    views, packs, rebalance = cols.endpoints, fit.packs, fit.rebalance
    rank = cols.id_rank
    loads: dict[int, EndpointLoad] = {}
    keys: list[tuple[bool, float, int, int]] = []
    for i in places.tolist():
        load = loads[i] = cache.load(views[i], now)
        norm = fit.capacity_norm(load)
        keys.append((load.running_long >= rebalance > 0, -norm if packs else norm, int(rank[i]), i))
    idle = candidates.copy()
    idle[places] = False
    loose: dict[int, bool] = {}
    for i in idle_first_order(list(keys), _idle_in_rank_order(rank, idle, -0.0 if packs else 0.0)):
        got = loads.get(i)
        if got is None:
            return only(candidates, i)  # nothing runs there: it fits
        strict, loose[i] = fit.fits_both(got, req)
        if strict:
            return only(candidates, i)
    # every candidate runs something and was tried: the least loaded that fits without the reserve
    for _, _, _, i in sorted(keys, key=_spread_of if packs else None):
        if loose[i]:
            return only(candidates, i)
    return np.zeros_like(candidates)


def _spread_of(key: tuple[bool, float, int, int]) -> tuple[bool, float, int]:
    """A packing order's key as the least loaded first (its capacity_norm negated back)."""
    return (key[0], -key[1], key[2])


def only(like: npt.NDArray[np.bool_], i: int) -> npt.NDArray[np.bool_]:
    """A mask like `like` with only `i` set."""
    out = np.zeros_like(like)
    out[i] = True
    return out


def idle_first_order(
    busy: list[tuple[bool, float, int, int]], idle: Iterator[tuple[bool, float, int, int]]
) -> Iterator[int]:
    """The column indexes of best fit's candidates in the order of one sort of their keys (demoted,
    load, id rank: `BestFitFilter.filter_columns`'s lexsort), from the busy candidates' keys (any
    order) and the idle candidates' keys in id rank order (their first two terms alike): merged lazily,
    so that a request placed on one of the first candidates tried does not sort the fleet. The id ranks
    are distinct, so the keys are a total order and the index never decides."""
    busy.sort()
    for _, _, _, i in merge(busy, idle):
        yield i


#: The last columns' id ranks and their column indexes in id rank order (kept while the ranks are the
#: same array: the fleet's membership did not change).
_BY_RANK: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]] = []


def _idle_in_rank_order(
    rank: npt.NDArray[np.int64], idle: npt.NDArray[np.bool_], key: float
) -> Iterator[tuple[bool, float, int, int]]:
    """The keys of the `idle` endpoints (not demoted, load `key`), in id rank order, made as they are
    asked for."""
    if not _BY_RANK or _BY_RANK[0][0] is not rank:
        _BY_RANK[:] = [(rank, np.argsort(rank))]
    by_rank = _BY_RANK[0][1]
    for k in by_rank[idle[by_rank]]:  # (not made a list: the first few are all most requests ask)
        i = int(k)
        yield (False, key, int(rank[i]), i)
