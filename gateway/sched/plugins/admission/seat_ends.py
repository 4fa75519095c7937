"""Many pending loads' running requests' predicted ends at once, as arrays: what SLO admission's seat order
reads of a load (`EndpointLoad.seat_free`, in the view's order), and nothing else.

`gateway.sched.load_batch.derive` makes every number of a load (its wait, its harm terms, the padded
matrices placement reads); the seat order needs each running request's end only: its progress as of the
load's time, its remaining tokens, and the two sums over the load's requests that the per-token time and
the pending prefill are made of. `ends` derives those alone, from the same rows (`load_batch`'s rows
kept on a load's pace), the progress by `derive`'s own `load_batch.progress` and the rest with the same
operations in the same order as `derive` and `EndpointLoad`, so each end is bit-equal to its load's
(`tests/unit/test_admission_seat_ends.py`); about half the numpy operations of `derive`, so a batch
pays from fewer loads (`SEAT_ENDS_FROM` in `seat_order`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gateway.sched.load_batch import Pending, progress
from gateway.sched.load_batch import _rows as rows_of  # the rows `derive` keeps on a pace

_Floats = npt.NDArray[np.float64]

# Columns of a running request's row (`load_batch`'s rows): the ones read here ...
_PROMPT, _FRESH = 4, 5
# ... and of a load's scalars (`meta`), with its time appended.
_N, _OVERHEAD, _GUESS, _K1, _C1, _K2, _C2, _C3, _NOW = 0, 3, 4, 5, 6, 7, 8, 9, 10


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
    _, prefilled, produced, remaining, _ = progress(
        per, now, g, at[:, _K1], at[:, _C1], gamma=todo[0].params.gamma
    )
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
