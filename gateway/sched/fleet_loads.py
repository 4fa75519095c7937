"""The endpoints' loads as arrays, for placement over columns: a placement judges every busy endpoint at
once (`endangers`, `predict`, `meets`, `itl_ok` for one request over many loads) instead of one
`EndpointLoad` at a time.

`FleetLoads` keeps, per endpoint of a fleet's columns (`FleetColumns`, by place), the numbers a
placement reads from its load: the scalars `EndpointLoad.predict` and `join_delays` take (running
requests, seats, wait, pending prompts, context sum, prefill overhead, coefficients), and the harm terms
`gateway.sched.harms` derives for one `on_track` and `margin` (the least first-token bound, the least
inter-token bound, and per running request with a last-token target its prefilled flag, remaining
tokens and bound, as rows padded with +inf bounds). The loads themselves come from the plugin's
`LoadCache` under its reuse rules: a row is rewritten only when the cache hands out another load for its
endpoint, and the cache is not asked again about an endpoint already looked at for the same columns
and clock (the requests of one served queue, which mostly fit nowhere, are placed on one snapshot).

The arithmetic is `predict`'s and `harm`'s, operation by operation in the same order (numpy's float64
operations round as Python's do), so every verdict is the one the loads give one by one
(`tests/unit/test_sched_fleet_loads.py` checks both on random fleets and request sequences).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.core.types import EndpointId
from gateway.sched.harms import terms_of
from gateway.sched.loads import LoadCache
from gateway.sched.predict import EndpointLoad
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import FleetColumns
from gateway.sched.targets import time_left

# Columns of the scalar table, one row per endpoint.
_N, _SEATS, _WAIT, _PENDING, _CTX, _OVER, _K1, _C1, _K2, _C2, _C3, _TTFT_B, _ITL_B = range(13)
_WIDTH: Final = 13
_INF: Final = math.inf

_Floats = npt.NDArray[np.float64]
_Mask = npt.NDArray[np.bool_]


class FleetLoads:
    """The loads of a fleet's endpoints as arrays (see the module), for one `LoadCache` and one pair of
    harm settings (`on_track`, `margin`)."""

    __slots__ = (
        "_at",
        "_bound",
        "_cache",
        "_index",
        "_loads",
        "_looked",
        "_prefilled",
        "_remaining",
        "_table",
        "margin",
        "on_track",
    )

    def __init__(self, cache: LoadCache, *, on_track: float, margin: float) -> None:
        self._cache = cache
        self.on_track = on_track
        self.margin = margin
        self._index: Mapping[EndpointId, int] | None = None  # the columns' places the rows are kept by
        self._loads: list[EndpointLoad | None] = []  # the load each row was written from
        self._table: _Floats = np.zeros((0, _WIDTH))
        # last-token terms, one row per endpoint, padded with +inf bounds
        self._prefilled: _Mask = np.zeros((0, 0), dtype=np.bool_)
        self._remaining: _Floats = np.zeros((0, 0))
        self._bound: _Floats = np.zeros((0, 0))
        # (columns, clock) the rows were last brought up to date for, and which rows were looked at then
        self._at: tuple[FleetColumns, float] | None = None
        self._looked: _Mask = np.zeros(0, dtype=np.bool_)

    def _reset(self, cols: FleetColumns) -> None:
        n = len(cols.endpoints)
        self._index = cols.index
        self._loads = [None] * n
        self._table = np.zeros((n, _WIDTH))
        self._prefilled = np.zeros((n, 0), dtype=np.bool_)
        self._remaining = np.zeros((n, 0))
        self._bound = np.zeros((n, 0))

    def rows(self, cols: FleetColumns, which: _Mask, now: float) -> list[EndpointLoad]:
        """Bring the rows of the endpoints `which` (a mask in the columns' order) up to date as of `now`,
        and return the loads of those endpoints, in the columns' order."""
        if self._index is not cols.index or len(self._loads) != len(cols.endpoints):
            self._reset(cols)
        if self._at is None or self._at[0] is not cols or self._at[1] != now:
            self._at = (cols, now)
            self._looked = np.zeros(len(cols.endpoints), dtype=np.bool_)
        todo = which & ~self._looked
        views, kept, load_of = cols.endpoints, self._loads, self._cache.load
        for i in np.flatnonzero(todo).tolist():
            load = load_of(views[i], now)
            if kept[i] is not load:
                self._write(i, load)
        self._looked |= todo
        return [x for x in (kept[i] for i in np.flatnonzero(which).tolist()) if x is not None]

    def _write(self, i: int, load: EndpointLoad) -> None:
        c = load.coef
        terms = terms_of(load, self.on_track, self.margin)
        self._table[i] = (
            float(load.n),
            float(load.seats),
            load.wait_s,
            load.pending_prompt,
            load.ctx_sum,
            load.overhead,
            c.k1,
            c.c1,
            c.k2,
            c.c2,
            c.c3,
            _INF if terms.ttft is None else terms.ttft,
            _INF if terms.itl is None else terms.itl,
        )
        m = len(terms.e2e)
        width = self._bound.shape[1]
        if m > width:
            grow = max(m, 2 * width)
            rows = len(self._loads)
            self._prefilled = np.hstack((self._prefilled, np.zeros((rows, grow - width), dtype=np.bool_)))
            self._remaining = np.hstack((self._remaining, np.zeros((rows, grow - width))))
            self._bound = np.hstack((self._bound, np.full((rows, grow - width), _INF)))
        if m:
            pre, rem, bound = zip(*terms.e2e, strict=True)
            self._prefilled[i, :m] = pre
            self._remaining[i, :m] = rem
            self._bound[i, :m] = bound
        self._bound[i, m:] = _INF
        self._loads[i] = load

    def judge(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        which: _Mask,
        now: float,
        *,
        worst_case: bool,
    ) -> tuple[_Mask, _Mask]:
        """Per endpoint of `which` (their loads as of `now`, `rows`), in the columns' order: whether
        placing `req` there endangers none of its running requests (`not endangers(load, req, margin,
        on_track)`), and whether it keeps its own targets there (`meets(load.predict(req, worst_case),
        time_left, margin)` and `itl_ok`)."""
        got = self.numbers(req, cols, which, now, worst_case=worst_case)
        if got is None:
            empty = np.zeros(0, dtype=np.bool_)
            return empty, empty
        t, (first, _, per_iter, delay), (ttft, e2e, tpot) = got
        endangered = (first > t[:, _TTFT_B]) | (per_iter > t[:, _ITL_B])
        if delay.shape[1]:
            endangered |= (delay > self._bound[np.flatnonzero(which)]).any(axis=1)
        ok = np.ones(len(t), dtype=np.bool_)
        ttft_left, e2e_left = time_left(req, now)
        margin = self.margin
        if ttft_left is not None:
            ok &= ~(ttft > ttft_left * margin)
        if e2e_left is not None:
            ok &= ~(e2e > e2e_left * margin)
        itl = req.slo.itl_ms
        if itl is not None:
            ok &= tpot * 1000.0 <= itl
        return ~endangered, ok

    def numbers(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        which: _Mask,
        now: float,
        *,
        worst_case: bool,
    ) -> tuple[_Floats, tuple[_Floats, _Floats, _Floats, _Floats], tuple[_Floats, _Floats, _Floats]] | None:
        """What `judge` compares, per endpoint of `which` (None: none): their table rows; `join_delays`'
        first, pause and per-iteration cost with the delay each last-token term would suffer (one row
        per endpoint, one column per term, padded); and `predict`'s first token, last token and
        per-token time."""
        loads = self.rows(cols, which, now)
        if not loads:
            return None
        idx = np.flatnonzero(which)
        t = self._table[idx]
        n, seats, over = t[:, _N], t[:, _SEATS], t[:, _OVER]
        k1, c1, k2, c2, c3 = t[:, _K1], t[:, _C1], t[:, _K2], t[:, _C2], t[:, _C3]
        out = loads[0].output_tokens(req)  # (the same for every load of one cache)
        p = float(resume_prompt_tokens(req))
        fresh: _Floats | float = p
        if req.cached:
            fresh = np.array([float(prefill_tokens(req, load.view.id)) for load in loads])
        # `join_delays`, and the delay of each last-token term as `_any_over` computes it
        per_iter = (k2 * (p + 0.5 * out) + c2) * (1.0 + over)
        first = k1 * fresh
        pause = k1 * fresh + c1
        delay = np.where(self._prefilled[idx], pause[:, None], first[:, None])
        delay = delay + np.minimum(self._remaining[idx], out) * per_iter[:, None]
        # `predict`
        ttft = t[:, _WAIT] + (k1 * (fresh + t[:, _PENDING]) + c1)
        b = seats if worst_case else np.minimum(n + 1.0, seats)
        avg = (t[:, _CTX] + p + 0.5 * out) / (n + 1.0)
        tpot = ((k2 * avg + c2) * b + c3) * (1.0 + over)
        e2e = ttft + max(0.0, out - 1.0) * tpot
        return t, (first, pause, per_iter, delay), (ttft, e2e, tpot)
