"""A small batch of loads derived in Python floats: `gateway.sched.load_batch.derive`'s numbers for a few
loads with few running requests between them, where numpy's fixed cost per call (a batch is about a
hundred calls, some 100 µs) is more than a Python step per running request. Placement over columns
has a small batch's numbers written straight into its rows, one load at a time (`write_small`).

The arithmetic is `derive`'s, operation by operation in the same order (numpy's float64 operations round
as Python's do); each running request's state and the sums over a load's are `EndpointLoad`'s own
(`gateway.sched.predict.running_states`), taken one after another as `derive`'s cumulative sums along a
padded row are (starting from 0.0 and padded with 0.0 can only turn a -0.0 into 0.0: equal either
way). `tests/unit/test_sched_load_batch_small.py` pins both paths to the same numbers on random fleets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.sched.load_terms import Pace
from gateway.sched.perf import default_prior
from gateway.sched.predict import running_states, seats_of
from gateway.sched.snapshot import EndpointView

_PRIOR: Final = default_prior()
_NAN: Final = math.nan
_INF: Final = math.inf

#: Per load (17): running requests, seats, wait for a seat, pending prompt, context sum, prefill
#: overhead, per-token time, running long, k1, c1, k2, c2, c3, KV capacity (NaN: unknown), its time,
#: remaining tokens summed, least ITL target of those not best effort (NaN: none).
Scalars = tuple[float, ...]

#: Running requests in a batch below which placement over columns writes its loads' rows in Python floats
#: (`write_small`), else from numpy's batch (`load_batch.derive_arrays`): written straight into the rows,
#: the Python floats cost less than numpy's batch up to about 130 running requests (the batches of a
#: 200-endpoint what-if run derived again both ways, µs of CPU per batch: 64-95 requests 174 against 263,
#: 96-127 244 against 288, 128-159 313 against 325, 160-191 385 against 347).
WRITE_SMALL: Final = 128


class SmallBatch:
    """`derive`'s numbers of a batch as Python lists: `scalars` one tuple per load; per running request
    (one list per load, in its view's order) prefilled, context, remaining and predicted end
    (`finish`); per harm key the least first-token and inter-token bounds per load and each running
    request's last-token bound (+inf: none)."""

    __slots__ = ("context", "finish", "harms", "prefilled", "remaining", "scalars")

    def __init__(self) -> None:
        self.scalars: list[Scalars] = []
        self.prefilled: list[list[bool]] = []
        self.context: list[list[float]] = []
        self.remaining: list[list[float]] = []
        self.finish: list[list[float]] = []
        self.harms: list[tuple[list[float], list[float], list[list[float]]]] = []


def derive_small(
    loads: Sequence[tuple[EndpointView, float, Pace]], gamma: float, harm_keys: Sequence[tuple[float, float]]
) -> SmallBatch:
    """`derive`'s numbers of `loads` (see the module), for the harm keys `harm_keys`."""
    out = SmallBatch()
    harms = out.harms
    for _ in harm_keys:
        harms.append(([], [], []))
    for view, now, pace in loads:
        scalars, pre_l, ctx_l, rem_l, fin_l, bounds = _load_numbers(view, now, pace, gamma, harm_keys)
        out.scalars.append(scalars)
        out.prefilled.append([p == 1.0 for p in pre_l])
        out.context.append(ctx_l)
        out.remaining.append(rem_l)
        out.finish.append(fin_l)
        for (ttft_b, itl_b, e2e_b), (least_ttft, least_itl, e2e) in zip(harms, bounds, strict=True):
            ttft_b.append(least_ttft)
            itl_b.append(least_itl)
            e2e_b.append(e2e)
    return out


def write_small(  # noqa: PLR0917 (the rows' arrays and what is derived into them)
    loads: Sequence[tuple[EndpointView, float, Pace]],
    places: Sequence[int],
    table: npt.NDArray[np.float64],
    per: npt.NDArray[np.float64],
    used: list[int],
    gamma: float,
    harm_keys: Sequence[tuple[float, float]],
    *,
    token_gammas: Sequence[float] = (),
) -> list[tuple[Scalars, list[float]]]:
    """`derive_small`'s numbers of `loads` written straight into the rows at `places`: `table[place]`
    its scalars then per harm key the least first-token and inter-token bounds, `per[:, place]` its
    running requests' prefilled (1.0 or 0.0), context, remaining tokens and per harm key last-token
    bounds (the layout `SmallBatch.rows` gives), one row at a time. `used[place]`: how many columns of
    `per` the row held (past them it is padding, 0, 0, 0, +inf ...): the ones it holds no more are
    padded again, and it is set to the new count. `per` must be wide enough for every load's running
    requests. Returns each load's scalars and, per γ of `token_gammas`, Σ(context + γ·remaining) over its
    running requests added one after another from 0.0 (best fit's `_tokens`: a cumulative sum's last
    value along the row)."""
    out: list[tuple[Scalars, list[float]]] = []
    for (view, now, pace), place in zip(loads, places, strict=True):
        scalars, pre_l, ctx_l, rem_l, _, bounds = _load_numbers(view, now, pace, gamma, harm_keys)
        row = list(scalars)
        for least_ttft, least_itl, _ in bounds:
            row.append(least_ttft)
            row.append(least_itl)
        table[place] = row
        count = len(pre_l)
        if count:
            per[:, place, :count] = [pre_l, ctx_l, rem_l, *[e2e for _, _, e2e in bounds]]
        was = used[place]
        if was > count:
            per[:3, place, count:was] = 0.0
            per[3:, place, count:was] = _INF
        used[place] = count
        sums: list[float] = []
        for g in token_gammas:
            tokens = 0.0
            for ctx, rem in zip(ctx_l, rem_l, strict=True):
                tokens += ctx + g * rem
            sums.append(tokens)
        out.append((scalars, sums))
    return out


_Bounds = tuple[float, float, list[float]]


def _load_numbers(
    view: EndpointView, now: float, pace: Pace, gamma: float, harm_keys: Sequence[tuple[float, float]]
) -> tuple[Scalars, list[float], list[float], list[float], list[float], list[_Bounds]]:
    """One load's numbers (`derive_small`): its scalars; per running request (in its view's order)
    prefilled (1.0 or 0.0), context, remaining tokens and predicted end; per harm key the least
    first-token and inter-token bounds and each running request's last-token bound (+inf: none)."""
    inf = _INF
    c = view.perf or _PRIOR
    k1, c1, k2, c2, c3 = c.k1, c.c1, c.k2, c.c2, c.c3
    g = pace.guess
    kv = view.kv_capacity_tokens
    running = view.running
    count = len(running)
    n = float(count)
    seats = float(seats_of(view))
    # per running request (prefilled, produced, remaining, first token from now, long) and the sums
    # over them, `EndpointLoad`'s own (Python floats, one after another from 0.0: a cumulative sum's
    # last value)
    states, pending, ctx_sum, running_long = running_states(
        running, pace.fresh, now, guess=g, k1=k1, c1=c1, gamma=gamma
    )
    over = 1.0 + pace.overhead
    tpot = ((k2 * (ctx_sum / n) + c2) * n + c3) * over if count > 0 else 0.0
    prefill_pending = k1 * pending + c1 if pending != 0.0 else 0.0
    pre_l: list[float] = []
    ctx_l: list[float] = []
    rem_l: list[float] = []
    fin_l: list[float] = []
    remaining_total = 0.0  # (added one after another, not `sum`: its compensated sum is not a cumsum's)
    budget = _NAN
    for r, st in zip(running, states, strict=True):
        p, produced, rem = st[0], st[1], st[2]
        pre_l.append(1.0 if p else 0.0)
        ctx_l.append(r.prompt_tokens + produced)
        rem_l.append(rem)
        remaining_total += rem
        fin_l.append(rem * tpot + (0.0 if p else prefill_pending))
        itl = r.itl_s
        if itl is not None and not r.best_effort and not itl >= budget:
            budget = itl
    bounds: list[_Bounds] = []
    for on_track, margin in harm_keys:
        least_ttft = least_itl = inf
        e2e: list[float] = []
        for r, st, fin in zip(running, states, fin_l, strict=True):
            p = st[0]
            if r.best_effort:
                e2e.append(inf)
                continue
            dl = r.ttft_deadline
            if dl is not None and not p:
                left = dl - now
                saved = left - st[3]
                if saved >= on_track * left and saved >= 0:
                    b = saved * margin
                    least_ttft = min(least_ttft, b)
            itl = r.itl_s
            if itl is not None and p:
                saved = itl - tpot
                if saved >= on_track * itl and saved >= 0:
                    b = saved * margin
                    least_itl = min(least_itl, b)
            dl = r.e2e_deadline
            if dl is not None:
                left = dl - now
                saved = left - fin
                e2e.append(saved * margin if saved >= on_track * left and saved >= 0 else inf)
            else:
                e2e.append(inf)
        bounds.append((least_ttft, least_itl, e2e))
    wait_s = 0.5 * tpot
    if count >= seats:
        wait_s = sorted(fin_l)[count - int(seats)] + 0.5 * tpot
    scalars = (
        n,
        seats,
        wait_s,
        pending,
        ctx_sum,
        pace.overhead,
        tpot,
        running_long,
        k1,
        c1,
        k2,
        c2,
        c3,
        _NAN if kv is None else float(kv),
        now,
        remaining_total,
        budget,
    )
    return scalars, pre_l, ctx_l, rem_l, fin_l, bounds
