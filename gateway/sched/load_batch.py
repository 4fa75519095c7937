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
predicted end is read from each row sorted (`tests/unit/test_sched_fleet_loads.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.sched.load_terms import Pace
from gateway.sched.perf import default_prior
from gateway.sched.predict import LONG_GROWTH, EndpointLoad, PredictParams, seats_of
from gateway.sched.snapshot import EndpointView

_PRIOR: Final = default_prior()
_NAN: Final = math.nan
_INF: Final = math.inf

_Floats = npt.NDArray[np.float64]
_Mask = npt.NDArray[np.bool_]

# Columns of a running request's kept fields (`_kept`).
_DISPATCHED, _MAX, _MEAN, _STD, _PROMPT, _FRESH, _TTFT_DL, _E2E_DL, _ITL, _BEST_EFFORT = range(10)


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


def _kept(view: EndpointView, pace: Pace) -> _Floats:
    """The running requests' fields that do not change while they run, one row each (kept on the pace:
    the same for every view with the same inputs). Absent targets are NaN, no max_tokens +inf."""
    got = pace.arrays
    if isinstance(got, np.ndarray):
        return got
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
        )
        for r, f in zip(view.running, pace.fresh, strict=True)
    ]
    arr = np.array(rows, dtype=np.float64).reshape(len(rows), 10)
    pace.arrays = arr
    return arr


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


def derive(
    loads: Sequence[tuple[EndpointView, float, Pace]],
    params: PredictParams,
    harm_keys: Sequence[tuple[float, float]],
) -> Derived:
    """The numbers of `EndpointLoad(view, now, params, pace=pace)` for each (view, now, pace) of
    `loads`, and their harm terms for each (on_track, margin) of `harm_keys` (`harms.terms_of`)."""
    k = len(loads)
    # per load: running requests, seats, KV capacity, prefill overhead, pace, time, coefficients
    meta = np.array(
        [
            (
                len(v.running),
                seats_of(v),
                _NAN if v.kv_capacity_tokens is None else v.kv_capacity_tokens,
                p.overhead,
                p.guess,
                t,
                c.k1,
                c.c1,
                c.k2,
                c.c2,
                c.c3,
            )
            for v, t, p in loads
            for c in (v.perf or _PRIOR,)
        ],
        dtype=np.float64,
    ).reshape(k, 11)
    counts = meta[:, 0].astype(np.int64)
    m = int(counts.max()) if k else 0
    seats, kv, overhead, guess_e, now_e = meta[:, 1], meta[:, 2], meta[:, 3], meta[:, 4], meta[:, 5]
    coef = meta[:, 6:11]
    k1, c1, k2, c2, c3 = (coef[:, j] for j in range(5))
    n = counts.astype(np.float64)
    seg = np.repeat(np.arange(k), counts)
    starts = np.cumsum(counts) - counts
    pos = np.arange(len(seg)) - np.repeat(starts, counts)
    kept = (
        np.concatenate([_kept(v, p) for v, _, p in loads if v.running])
        if len(seg)
        else np.zeros((0, 10), dtype=np.float64)
    )
    prog = np.array(
        [
            _NAN if x is None else x
            for v, _, _ in loads
            for r in v.running
            for x in (r.produced, r.reported_at, r.first_token_at)
        ],
        dtype=np.float64,
    ).reshape(len(seg), 3)
    now = now_e[seg]
    g = guess_e[seg]
    f = kept[:, _FRESH]
    gamma = params.gamma
    with np.errstate(divide="ignore", invalid="ignore"):
        reported = ~np.isnan(prog).any(axis=1)
        first_at = np.where(reported, prog[:, 2], kept[:, _DISPATCHED] + k1[seg] * f + c1[seg] + 0.5 * g)
        prefilled = reported | (now >= first_at)
        since = np.where(g > 0, (now - prog[:, 1]) / g, 0.0)
        est = np.where(prefilled & (g > 0), (now - first_at) / g + 1.0, 0.0)
        produced = np.where(reported, prog[:, 0] + since, est)
        cap = kept[:, _MAX]
        produced = np.where(cap < produced, cap, produced)
        om = kept[:, _MEAN]
        mean = om + gamma * kept[:, _STD]
        short = produced < mean
        grown = LONG_GROWTH * produced
        remaining = np.where(short, mean - produced, np.where(grown > 1.0, grown, 1.0))
        long = np.where(short, 0.0, (produced - om) / np.where(om > 1.0, om, 1.0))
        capped = cap < _INF
        room = cap - produced
        remaining = np.where(capped & (room < remaining), room, remaining)
        remaining = np.where(capped & ~(remaining > 0.0), 0.0, remaining)
    context = kept[:, _PROMPT] + produced

    def padded(values: _Floats, fill: float) -> _Floats:
        out = np.full((k, m), fill)
        out[seg, pos] = values
        return out

    def sums(values: _Floats) -> _Floats:
        """Per load, its requests' `values` added one after another (Python's order)."""
        if not m:
            return np.zeros(k)
        return np.cumsum(padded(values, 0.0), axis=1)[:, -1]

    pending = sums(np.where(prefilled, 0.0, f))
    ctx_sum = sums(context)
    running_long = sums(long)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(counts > 0, ((k2 * (ctx_sum / n) + c2) * n + c3) * (1.0 + overhead), 0.0)
    prefill_pending = np.where(pending != 0.0, k1 * pending + c1, 0.0)
    finish = remaining * tpot[seg] + np.where(prefilled, 0.0, prefill_pending[seg])
    wait_s = 0.5 * tpot
    ends_all = padded(finish, _INF)
    full = np.flatnonzero(counts >= seats)
    if len(full):
        ends = np.sort(ends_all[full], axis=1)
        kth = (counts[full] - seats[full].astype(np.int64)).astype(np.int64)
        wait_s[full] = ends[np.arange(len(full)), kth] + 0.5 * tpot[full]
    harms: dict[tuple[float, float], tuple[_Floats, _Floats, _Floats]] = {}
    active = kept[:, _BEST_EFFORT] == 0.0
    with np.errstate(invalid="ignore"):
        budgets = padded(np.where(active, kept[:, _ITL], _NAN), _NAN)
        itl_budget = np.fmin.reduce(budgets, axis=1) if m else np.full(k, _NAN)
    first_s = first_at - now
    for on_track, margin in harm_keys:
        with np.errstate(invalid="ignore"):
            left = kept[:, _TTFT_DL] - now
            saved = left - first_s
            ok = active & ~prefilled & (saved >= on_track * left) & (saved >= 0)
            ttft_b = padded(np.where(ok, saved * margin, _INF), _INF)
            left = kept[:, _E2E_DL] - now
            saved = left - finish
            ok = active & (saved >= on_track * left) & (saved >= 0)
            e2e_b = padded(np.where(ok, saved * margin, _INF), _INF)
            itl = kept[:, _ITL]
            saved = itl - tpot[seg]
            ok = active & prefilled & (saved >= on_track * itl) & (saved >= 0)
            itl_b = padded(np.where(ok, saved * margin, _INF), _INF)
        least = (ttft_b.min(axis=1), itl_b.min(axis=1)) if m else (np.full(k, _INF), np.full(k, _INF))
        harms[(on_track, margin)] = (least[0], least[1], e2e_b)
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
        remaining_total=sums(remaining),
        itl_budget=itl_budget,
        prefilled=padded(prefilled.astype(np.float64), 0.0) > 0.0,
        context=padded(context, 0.0),
        remaining=padded(remaining, 0.0),
        finish=ends_all,
        harms=harms,
    )
