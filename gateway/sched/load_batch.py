"""Many endpoints' loads derived at once, as arrays: what `EndpointLoad.__init__` derives for one endpoint
(each running request's progress, remaining tokens and predicted end; the context and pending-prompt
sums, the per-token time, the wait for a seat) and what `gateway.sched.harms` keeps per load (the
least first-token and inter-token bounds, the last-token bounds), for every load of a batch in a few
numpy operations over all their running requests.

A `Pending` is a load the `LoadCache` decided to make (its view, its time, its pace) that nobody has
asked to see as an `EndpointLoad` yet: placement over columns (`gateway.sched.fleet_loads`) reads its
numbers from a batch, and `LoadCache.load` makes the object when a plain plugin asks for it.

Every number is the one `EndpointLoad` computes, bit for bit: the per-request arithmetic is the same
operations in the same order (numpy's float64 operations round as Python's do), and the sums over a
load's running requests, which Python takes one after another, are taken the same way (a cumulative sum
along each load's row of a padded matrix: sequential, unlike numpy's pairwise `sum`); the k-th smallest
predicted end is read from each row sorted (`tests/unit/test_sched_fleet_loads.py`,
`tests/unit/test_sched_load_runs.py`). A batch of few running requests is derived in Python floats
instead (`gateway.sched.load_batch_small`), with the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.sched.load_batch_small import SmallBatch, derive_small
from gateway.sched.load_terms import Pace
from gateway.sched.perf import default_prior
from gateway.sched.predict import LONG_GROWTH, EndpointLoad, PredictParams, seats_of
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointView

_PRIOR: Final = default_prior()
_NAN: Final = math.nan
_INF: Final = math.inf

_Floats = npt.NDArray[np.float64]
_Mask = npt.NDArray[np.bool_]

#: Running requests in a batch below which its loads are derived in Python floats (`derive_small`):
#: numpy's fixed cost per batch (about a hundred calls) is more than a Python step per running request.
SMALL_BATCH: Final = 64

# Columns of a running request's row (`_Rows.per`): the fields kept while it runs ...
_DISPATCHED, _MAX, _MEAN, _STD, _PROMPT, _FRESH, _TTFT_DL, _E2E_DL, _ITL, _BEST_EFFORT = range(10)
# ... and of its progress (`_progress`).
_PRODUCED, _REPORTED, _FIRST = 10, 11, 12
_WIDTH: Final = 13


class Pending:
    """A load decided on and not made yet: `EndpointLoad(view, now, params, pace=pace)` when asked for
    (`made`). `seat_free`: its running requests' predicted ends (`EndpointLoad.seat_free`, in the
    view's order, not sorted) once a batch derived them (SLO admission's seat order)."""

    __slots__ = ("made", "n", "now", "pace", "params", "seat_free", "view")

    def __init__(self, view: EndpointView, now: float, params: PredictParams, pace: Pace) -> None:
        self.view = view
        self.now = now
        self.params = params
        self.pace = pace
        self.n = len(view.running)
        self.made: EndpointLoad | None = None
        self.seat_free: _Floats | None = None

    def load(self) -> EndpointLoad:
        got = self.made
        if got is None:
            got = self.made = EndpointLoad(self.view, self.now, self.params, pace=self.pace)
        return got


class _Rows:
    """What a batch reads of one load besides its time, kept on its pace (`Pace.arrays`: the same for
    every view with the same inputs, `same_inputs`) so that a load remade for its age alone costs no
    Python step per running request: the load's scalars (`meta`: running requests, seats, KV capacity,
    prefill overhead, pace, coefficients) and one row per running request (`per`) of the fields that do
    not change while it runs (`_DISPATCHED`..`_BEST_EFFORT`: absent targets NaN, no max_tokens +inf)
    and of its progress (`_PRODUCED`, `_REPORTED`, `_FIRST`: NaN when not reported), the latter those of
    `running`, the view's requests it was last brought up to date for (a later view of the endpoint
    differs from it at most in some requests' progress reports: only those rows are rewritten)."""

    __slots__ = ("meta", "per", "running")

    def __init__(self, view: EndpointView, pace: Pace) -> None:
        running = view.running
        self.meta = _Rows.meta_of(view, pace)
        rows = [
            (
                r.dispatched_at,
                _INF if r.max_tokens is None else float(r.max_tokens),
                r.output_mean,
                r.output_std,
                float(r.prompt_tokens),
                float(f),
                _NAN if r.ttft_deadline is None else r.ttft_deadline,
                _NAN if r.e2e_deadline is None else r.e2e_deadline,
                _NAN if r.itl_s is None else r.itl_s,
                1.0 if r.best_effort else 0.0,
                *_progress(r),
            )
            for r, f in zip(running, pace.fresh, strict=True)
        ]
        self.per: _Floats = np.array(rows, dtype=np.float64).reshape(len(rows), _WIDTH)
        self.running = running

    @staticmethod
    def meta_of(view: EndpointView, pace: Pace) -> tuple[float, ...]:
        """The load's scalars (`meta`)."""
        c = view.perf or _PRIOR
        kv = view.kv_capacity_tokens
        return (
            float(len(view.running)),
            float(seats_of(view)),
            _NAN if kv is None else float(kv),
            pace.overhead,
            pace.guess,
            c.k1,
            c.c1,
            c.k2,
            c.c2,
            c.c3,
        )

    def of(self, view: EndpointView) -> _Floats:
        """`per`, its progress that of `view`'s running requests (the same requests as `running`'s)."""
        running = view.running
        last = self.running
        if running is not last:
            per = self.per
            for j, (r, o) in enumerate(zip(running, last, strict=True)):
                if r is not o:
                    per[j, _PRODUCED:] = _progress(r)
            self.running = running
        return self.per


def _progress(r: RunningRequest) -> tuple[float, float, float]:
    """A running request's reported progress (produced, reported at, first token at), NaN when not
    reported (`EndpointLoad` estimates from the clock unless all three are known)."""
    produced, at, first = r.produced, r.reported_at, r.first_token_at
    return (
        _NAN if produced is None else float(produced),
        _NAN if at is None else at,
        _NAN if first is None else first,
    )


def carry_rows(old: Pace, view: EndpointView, pace: Pace) -> None:
    """Keep on `pace` (a view's new pace: new coefficients, KV capacity or cap after a refit) the rows
    kept on `old`, the pace of an earlier view of the same endpoint with the same running requests apart
    from their progress (`same_requests`): a running request's row does not depend on the coefficients,
    only the load's scalars do, and those are made again."""
    got = old.arrays
    if type(got) is not _Rows or pace.arrays is not None:
        return
    made = _Rows.__new__(_Rows)
    made.meta = _Rows.meta_of(view, pace)
    made.per = got.per.copy()
    made.running = got.running
    pace.arrays = made


def _rows(view: EndpointView, pace: Pace) -> _Rows:
    got = pace.arrays
    if type(got) is _Rows:
        return got
    made = _Rows(view, pace)
    pace.arrays = made
    return made


@dataclass(frozen=True, slots=True)
class Derived:
    """A batch of loads' numbers, one row per load (in the order given), the running requests' in
    padded matrices (one column per running request in its view's order; past a load's requests,
    padding)."""

    n: _Floats
    seats: _Floats
    wait_s: _Floats
    pending_prompt: _Floats
    ctx_sum: _Floats
    overhead: _Floats
    tpot_now: _Floats
    running_long: _Floats
    coef: _Floats  # k1, c1, k2, c2, c3 per load
    kv_capacity: _Floats  # NaN: unknown
    now: _Floats  # the time each load is of
    remaining_total: _Floats  # the running requests' remaining tokens summed in their order
    itl_budget: _Floats  # the least ITL target of the running requests not best effort (NaN: none)
    prefilled: _Mask
    context: _Floats  # prompt + produced (0 in padding)
    remaining: _Floats  # (0 in padding)
    finish: _Floats  # each running request's predicted end (`seat_free`, unsorted; +inf in padding)
    # per (on_track, margin) asked for: the least first-token bound, the least inter-token bound
    # (+inf: none), and each running request's last-token bound (+inf: not a last-token harm)
    harms: dict[tuple[float, float], tuple[_Floats, _Floats, _Floats]]
    # the scalars above (n .. itl_budget, coef's five in its place) as one row per load, when made so
    table: _Floats | None = None

    def scalars(self) -> _Floats:
        """n, seats, wait_s, pending_prompt, ctx_sum, overhead, tpot_now, running_long, coef (5),
        kv_capacity, now, remaining_total and itl_budget: one row per load."""
        if self.table is not None:
            return self.table
        return np.column_stack(
            (
                self.n,
                self.seats,
                self.wait_s,
                self.pending_prompt,
                self.ctx_sum,
                self.overhead,
                self.tpot_now,
                self.running_long,
                self.coef,
                self.kv_capacity,
                self.now,
                self.remaining_total,
                self.itl_budget,
            )
        )


def derive(
    loads: Sequence[tuple[EndpointView, float, Pace]],
    params: PredictParams,
    harm_keys: Sequence[tuple[float, float]],
) -> Derived:
    """The numbers of `EndpointLoad(view, now, params, pace=pace)` for each (view, now, pace) of
    `loads` (distinct endpoints), and their harm terms for each (on_track, margin) of `harm_keys`
    (`harms.terms_of`). A batch of fewer than `SMALL_BATCH` running requests is derived in Python floats
    (`derive_small`: the same numbers)."""
    if sum([len(v.running) for v, _, _ in loads]) < SMALL_BATCH:
        return derived_from(derive_small(loads, params.gamma, harm_keys), harm_keys)
    return derive_arrays(loads, params, harm_keys)


def rows_of(got: Derived, harm_keys: Sequence[tuple[float, float]]) -> tuple[_Floats, _Floats]:
    """A batch's numbers as the rows `gateway.sched.fleet_loads.FleetLoads` keeps: per load, its
    scalars (`Derived.scalars`' 17) then per harm key the least first-token and inter-token bounds; and
    its running requests' prefilled (1.0 or 0.0), context, remaining tokens and, per harm key, last-token
    bounds: one (load, request) matrix each (padded past a load's requests with 0, 0, 0, +inf)."""
    harms = [got.harms[key] for key in harm_keys]
    table = np.column_stack((got.scalars(), *[b for h in harms for b in h[:2]]))
    per = np.stack((got.prefilled, got.context, got.remaining, *[h[2] for h in harms]))
    return table, per


def derived_from(got: SmallBatch, harm_keys: Sequence[tuple[float, float]]) -> Derived:
    """`got`, a batch derived in Python floats, as a `Derived` (per-request lists padded to the longest)."""
    k = len(got.scalars)
    table = np.array(got.scalars, dtype=np.float64).reshape(k, 17)
    m = max(map(len, got.context), default=0)

    def padded(rows: list[list[float]], fill: float) -> _Floats:
        return np.array([row + [fill] * (m - len(row)) for row in rows], dtype=np.float64).reshape(k, m)

    pre = np.array([row + [False] * (m - len(row)) for row in got.prefilled], dtype=np.bool_).reshape(k, m)
    return Derived(
        n=table[:, 0],
        seats=table[:, 1],
        wait_s=table[:, 2],
        pending_prompt=table[:, 3],
        ctx_sum=table[:, 4],
        overhead=table[:, 5],
        tpot_now=table[:, 6],
        running_long=table[:, 7],
        coef=table[:, 8:13],
        kv_capacity=table[:, 13],
        now=table[:, 14],
        remaining_total=table[:, 15],
        itl_budget=table[:, 16],
        prefilled=pre,
        context=padded(got.context, 0.0),
        remaining=padded(got.remaining, 0.0),
        finish=padded(got.finish, _INF),
        harms={
            key: (np.array(ttft, dtype=np.float64), np.array(itl, dtype=np.float64), padded(e2e, _INF))
            for key, (ttft, itl, e2e) in zip(harm_keys, got.harms, strict=True)
        },
        table=table,
    )


def progress(
    per: _Floats, now: _Floats, g: _Floats, k1: _Floats, c1: _Floats, *, gamma: float
) -> tuple[_Floats, _Mask, _Floats, _Floats, _Mask]:
    """`EndpointLoad`'s running states as arrays, from running requests' rows (`per`) and, per request,
    its load's time, pace and prefill coefficients: each one's first token's time, whether it is
    prefilled, its tokens produced and remaining, and whether it is within its predicted length."""
    f = per[:, _FRESH]
    prog = per[:, _PRODUCED:]
    with np.errstate(divide="ignore", invalid="ignore"):
        reported = ~np.isnan(prog).any(axis=1)
        first_at = np.where(reported, prog[:, 2], per[:, _DISPATCHED] + k1 * f + c1 + 0.5 * g)
        prefilled = reported | (now >= first_at)
        since = np.where(g > 0, (now - prog[:, 1]) / g, 0.0)
        est = np.where(prefilled & (g > 0), (now - first_at) / g + 1.0, 0.0)
        produced = np.where(reported, prog[:, 0] + since, est)
        cap = per[:, _MAX]
        produced = np.where(cap < produced, cap, produced)
        mean = per[:, _MEAN] + gamma * per[:, _STD]
        short = produced < mean
        grown = LONG_GROWTH * produced
        remaining = np.where(short, mean - produced, np.where(grown > 1.0, grown, 1.0))
        capped = cap < _INF
        room = cap - produced
        remaining = np.where(capped & (room < remaining), room, remaining)
        remaining = np.where(capped & ~(remaining > 0.0), 0.0, remaining)
    return first_at, prefilled, produced, remaining, short


def derive_arrays(
    loads: Sequence[tuple[EndpointView, float, Pace]],
    params: PredictParams,
    harm_keys: Sequence[tuple[float, float]],
) -> Derived:
    """`derive` over numpy arrays, whatever the batch's size."""
    k = len(loads)
    kept = [_rows(v, p) for v, _, p in loads]
    # per load: running requests, seats, KV capacity, prefill overhead, pace, coefficients; its time
    meta = np.array([r.meta for r in kept], dtype=np.float64).reshape(k, 10)
    now_e = np.array([t for _, t, _ in loads], dtype=np.float64)
    per = (
        np.concatenate([r.of(v) for r, (v, _, _) in zip(kept, loads, strict=True)])
        if k
        else np.zeros((0, _WIDTH), dtype=np.float64)
    )
    counts = meta[:, 0].astype(np.int64)
    m = int(counts.max()) if k else 0
    seats, kv, overhead, guess_e = meta[:, 1], meta[:, 2], meta[:, 3], meta[:, 4]
    coef = meta[:, 5:10]
    k1, c1, k2, c2, c3 = (coef[:, j] for j in range(5))
    n = meta[:, 0]
    seg = np.repeat(np.arange(k), counts)
    starts = np.cumsum(counts) - counts
    # each running request's place in a (load, request) matrix, flattened
    flat = seg * m + (np.arange(len(seg)) - starts[seg])
    now = now_e[seg]
    g = guess_e[seg]
    f = per[:, _FRESH]
    first_at, prefilled, produced, remaining, short = progress(
        per, now, g, k1[seg], c1[seg], gamma=params.gamma
    )
    om = per[:, _MEAN]
    with np.errstate(divide="ignore", invalid="ignore"):
        long = np.where(short, 0.0, (produced - om) / np.where(om > 1.0, om, 1.0))
    context = per[:, _PROMPT] + produced

    def padded(values: list[npt.NDArray[Any]], fill: float) -> _Floats:
        """`values` (each one per running request) in (load, request) matrices, `fill` past a load's
        requests: one per value."""
        out = np.full((len(values), k * m), fill)
        out[:, flat] = values
        return out.reshape(len(values), k, m)

    # Per load, its requests' values added one after another (Python's order): a cumulative sum along
    # each row of the padded matrices (0 past its requests).
    by_load = padded([np.where(prefilled, 0.0, f), context, long, remaining, prefilled], 0.0)
    sums = np.cumsum(by_load[:4], axis=2)[:, :, -1] if m else np.zeros((4, k))
    pending, ctx_sum, running_long, remaining_total = sums
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(counts > 0, ((k2 * (ctx_sum / n) + c2) * n + c3) * (1.0 + overhead), 0.0)
    prefill_pending = np.where(pending != 0.0, k1 * pending + c1, 0.0)
    tpot_r = tpot[seg]
    finish = remaining * tpot_r + np.where(prefilled, 0.0, prefill_pending[seg])
    active = per[:, _BEST_EFFORT] == 0.0
    # per (on_track, margin): each running request's first-token, inter-token and last-token bound
    bounds: list[_Floats] = [finish]
    first_s = first_at - now
    ttft_left = per[:, _TTFT_DL] - now
    e2e_left = per[:, _E2E_DL] - now
    itl = per[:, _ITL]
    itl_saved = itl - tpot_r
    ttft_saved = ttft_left - first_s
    e2e_saved = e2e_left - finish
    with np.errstate(invalid="ignore"):
        for on_track, margin in harm_keys:
            ok = active & ~prefilled & (ttft_saved >= on_track * ttft_left) & (ttft_saved >= 0)
            bounds.append(np.where(ok, ttft_saved * margin, _INF))
            ok = active & prefilled & (itl_saved >= on_track * itl) & (itl_saved >= 0)
            bounds.append(np.where(ok, itl_saved * margin, _INF))
            ok = active & (e2e_saved >= on_track * e2e_left) & (e2e_saved >= 0)
            bounds.append(np.where(ok, e2e_saved * margin, _INF))
        by_bound = padded(bounds, _INF)
        least = by_bound.min(axis=2) if m else np.full((len(bounds), k), _INF)
        budgets = padded([np.where(active, itl, _NAN)], _NAN)[0]
        itl_budget = np.fmin.reduce(budgets, axis=1) if m else np.full(k, _NAN)
    ends_all = by_bound[0]
    wait_s = 0.5 * tpot
    full = np.flatnonzero(counts >= seats)
    if len(full):
        ends = np.sort(ends_all[full], axis=1)
        kth = counts[full] - seats[full].astype(np.int64)
        wait_s[full] = ends[np.arange(len(full)), kth] + 0.5 * tpot[full]
    harms = {
        key: (least[1 + 3 * j], least[2 + 3 * j], by_bound[3 + 3 * j]) for j, key in enumerate(harm_keys)
    }
    return Derived(
        n=n,
        seats=seats,
        wait_s=wait_s,
        pending_prompt=pending,
        ctx_sum=ctx_sum,
        overhead=overhead,
        tpot_now=tpot,
        running_long=running_long,
        coef=coef,
        kv_capacity=kv,
        now=now_e,
        remaining_total=remaining_total,
        itl_budget=itl_budget,
        prefilled=by_load[4] > 0.0,
        context=by_load[1],
        remaining=by_load[3],
        finish=ends_all,
        harms=harms,
    )
