"""A small batch of loads derived in Python floats: `gateway.sched.load_batch.derive`'s numbers for a few
loads with few running requests between them, where numpy's fixed cost per call (a batch is about a
hundred calls, some 100 µs) is more than a Python step per running request.

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

    def rows(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """These numbers as `gateway.sched.load_batch.rows_of` gives a batch's (the table's rows and the
        per-request rows `gateway.sched.fleet_loads.FleetLoads` keeps), in two array constructions."""
        harms = self.harms
        table = []
        for i, s in enumerate(self.scalars):
            row = list(s)
            for ttft, itl, _ in harms:
                row.append(ttft[i])
                row.append(itl[i])
            table.append(row)
        k, m = len(table), max(map(len, self.context), default=0)
        pads = [m - len(ctx) for ctx in self.context]
        zeros = [[0.0] * pad for pad in pads]
        per = [
            [[1.0 if p else 0.0 for p in pre] + z for pre, z in zip(self.prefilled, zeros, strict=True)],
            [ctx + z for ctx, z in zip(self.context, zeros, strict=True)],
            [rem + z for rem, z in zip(self.remaining, zeros, strict=True)],
        ]
        for _, _, e2e in harms:
            per.append([bounds + [_INF] * pad for bounds, pad in zip(e2e, pads, strict=True)])
        width = 17 + 2 * len(harms)
        return (
            np.array(table, dtype=np.float64).reshape(k, width),
            np.array(per, dtype=np.float64).reshape(3 + len(harms), k, m),
        )


def derive_small(
    loads: Sequence[tuple[EndpointView, float, Pace]], gamma: float, harm_keys: Sequence[tuple[float, float]]
) -> SmallBatch:
    """`derive`'s numbers of `loads` (see the module), for the harm keys `harm_keys`."""
    out = SmallBatch()
    harms = out.harms
    for _ in harm_keys:
        harms.append(([], [], []))
    inf = _INF
    for view, now, pace in loads:
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
        pre_l = [st[0] for st in states]
        rem_l = [st[2] for st in states]
        ctx_l = [r.prompt_tokens + st[1] for r, st in zip(running, states, strict=True)]
        remaining_total = 0.0
        for rem in rem_l:  # (not `sum`: its compensated float sum is not a cumulative sum's)
            remaining_total += rem
        over = 1.0 + pace.overhead
        tpot = ((k2 * (ctx_sum / n) + c2) * n + c3) * over if count > 0 else 0.0
        prefill_pending = k1 * pending + c1 if pending != 0.0 else 0.0
        fin_l = [rem * tpot + (0.0 if p else prefill_pending) for p, rem in zip(pre_l, rem_l, strict=True)]
        budget = _NAN
        for r in running:
            itl = r.itl_s
            if itl is not None and not r.best_effort and not itl >= budget:
                budget = itl
        for (on_track, margin), (ttft_b, itl_b, e2e_b) in zip(harm_keys, harms, strict=True):
            least_ttft = least_itl = inf
            bounds: list[float] = []
            for r, st, fin in zip(running, states, fin_l, strict=True):
                p = st[0]
                if r.best_effort:
                    bounds.append(inf)
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
                    bounds.append(saved * margin if saved >= on_track * left and saved >= 0 else inf)
                else:
                    bounds.append(inf)
            ttft_b.append(least_ttft)
            itl_b.append(least_itl)
            e2e_b.append(bounds)
        wait_s = 0.5 * tpot
        if count >= seats:
            wait_s = sorted(fin_l)[count - int(seats)] + 0.5 * tpot
        out.scalars.append(
            (
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
        )
        out.prefilled.append(pre_l)
        out.context.append(ctx_l)
        out.remaining.append(rem_l)
        out.finish.append(fin_l)
    return out
