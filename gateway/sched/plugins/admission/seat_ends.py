"""Many pending loads' running requests' predicted ends at once, as arrays: what SLO admission's seat order
reads of a load (`EndpointLoad.seat_free`, in the view's order), and nothing else.

`gateway.sched.load_batch.derive` makes every number of a load (its wait, its harm terms, the padded
matrices placement reads); the seat order needs each running request's end only: its progress as of the
load's time, its remaining tokens, and the two sums over the load's requests that the per-token time and
the pending prefill are made of. `ends` derives those alone, from the same rows (`load_batch`'s rows
kept on a load's pace), with the same operations in the same order as `derive` and `EndpointLoad`, so
each end is bit-equal to its load's (`tests/unit/test_admission_seat_ends.py`); about half the numpy
operations of `derive`, so a batch pays from fewer loads (`SEAT_ENDS_FROM` in `seat_order`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.sched.load_batch import Pending
from gateway.sched.load_batch import _rows as rows_of  # the rows `derive` keeps on a pace
from gateway.sched.predict import LONG_GROWTH

_Floats = npt.NDArray[np.float64]

# Columns of a running request's row (`load_batch`'s rows): the ones read here ...
_DISPATCHED, _MAX, _MEAN, _STD, _PROMPT, _FRESH = 0, 1, 2, 3, 4, 5
_PRODUCED, _REPORTED, _FIRST = 10, 11, 12
# ... and of a load's scalars (`meta`), with its time appended.
_N, _OVERHEAD, _GUESS, _K1, _C1, _K2, _C2, _C3, _NOW = 0, 3, 4, 5, 6, 7, 8, 9, 10
_INF: Final = np.inf


def ends(todo: Sequence[Pending]) -> list[_Floats]:
    """Each of `todo`'s (pending loads with running requests, one cache's: the same parameters) running
    requests' predicted ends, in its view's order: `EndpointLoad(p.view, p.now, p.params,
    pace=p.pace).seat_free` unsorted, bit for bit."""
    k = len(todo)
    kept = [rows_of(p.view, p.pace) for p in todo]
    meta = np.array([(*r.meta, p.now) for r, p in zip(kept, todo, strict=True)], dtype=np.float64)
    per = np.concatenate([r.of(p.view) for r, p in zip(kept, todo, strict=True)])
    counts = meta[:, _N].astype(np.int64)
    m = int(counts.max())
    seg = np.repeat(np.arange(k), counts)
    starts = np.cumsum(counts) - counts
    at = meta[seg]  # each running request's load's scalars
    now, g = at[:, _NOW], at[:, _GUESS]
    f = per[:, _FRESH]
    prog = per[:, _PRODUCED:]
    gamma = todo[0].params.gamma
    with np.errstate(divide="ignore", invalid="ignore"):
        reported = ~np.isnan(prog).any(axis=1)
        first_at = np.where(reported, prog[:, 2], per[:, _DISPATCHED] + at[:, _K1] * f + at[:, _C1] + 0.5 * g)
        prefilled = reported | (now >= first_at)
        since = np.where(g > 0, (now - prog[:, 1]) / g, 0.0)
        est = np.where(prefilled & (g > 0), (now - first_at) / g + 1.0, 0.0)
        produced = np.where(reported, prog[:, 0] + since, est)
        cap = per[:, _MAX]
        produced = np.where(cap < produced, cap, produced)
        mean = per[:, _MEAN] + gamma * per[:, _STD]
        grown = LONG_GROWTH * produced
        remaining = np.where(produced < mean, mean - produced, np.where(grown > 1.0, grown, 1.0))
        capped = cap < _INF
        room = cap - produced
        remaining = np.where(capped & (room < remaining), room, remaining)
        remaining = np.where(capped & ~(remaining > 0.0), 0.0, remaining)
    # Per load, its requests' pending prompts and contexts added one after another (Python's order): a
    # cumulative sum along each row of a padded matrix (0 past its requests).
    by_load = np.zeros((2, k * m))
    flat = seg * m + (np.arange(len(seg)) - starts[seg])
    by_load[:, flat] = (np.where(prefilled, 0.0, f), per[:, _PROMPT] + produced)
    pending, ctx_sum = np.cumsum(by_load.reshape(2, k, m), axis=2)[:, :, -1]
    n, k1, c1 = meta[:, _N], meta[:, _K1], meta[:, _C1]
    tpot = ((meta[:, _K2] * (ctx_sum / n) + meta[:, _C2]) * n + meta[:, _C3]) * (1.0 + meta[:, _OVERHEAD])
    prefill_pending = np.where(pending != 0.0, k1 * pending + c1, 0.0)
    finish = remaining * tpot[seg] + np.where(prefilled, 0.0, prefill_pending[seg])
    out: list[_Floats] = []
    start = 0
    for p in todo:  # (slices: `np.split` costs more than several of the steps above)
        out.append(finish[start : start + p.n])
        start += p.n
    return out
