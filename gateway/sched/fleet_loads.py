"""The endpoints' loads as arrays, for placement over columns: a placement judges every busy endpoint at
once (`endangers`, `predict`, `meets`, `itl_ok` for one request over many loads; best fit's order keys
and sure misses) instead of one `EndpointLoad` at a time.

`FleetLoads` (one per `LoadCache`, shared by the plugins that share the cache) keeps, per endpoint of a
fleet's columns (`FleetColumns`, by place), the numbers a placement reads from its load: the scalars
`EndpointLoad.predict` and `join_delays` take (running requests, seats, wait, pending prompts, context
sum, prefill overhead, coefficients, ...), each running request's prefilled flag, context and remaining
tokens (padded rows), and the harm terms `gateway.sched.harms` derives for each (`on_track`, `margin`)
a plugin wants (the least first-token bound, the least inter-token bound, each running request's
last-token bound, +inf where none): a table of the scalars and least bounds, one row per endpoint, and
one array of the per-request matrices, so that a batch derived together is written in a few assignments
(`load_batch.rows_of` gives a numpy batch in that form; a small one is written row by row,
`load_batch_small.write_small`). The loads are the cache's, under its reuse rules
(`LoadCache.refs`): a row is derived again only when the cache has another load for its endpoint, those
derived together (`gateway.sched.load_batch`), and the cache is not asked again about an endpoint
already looked at for the same columns and clock (the requests of one served queue, which mostly fit
nowhere, are placed on one snapshot). Best fit's capacity norms are kept per row until it is written
again (`capacity_norms`: worked out as a row is written in Python floats).

The arithmetic is `predict`'s and `harm`'s, operation by operation in the same order (numpy's float64
operations round as Python's do), so every number is the one the loads give one by one
(`tests/unit/test_sched_fleet_loads.py` checks both on random fleets and request sequences).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.core.types import EndpointId
from gateway.sched.idle import output_bound
from gateway.sched.load_batch import Pending, derive_arrays, rows_of
from gateway.sched.load_batch_small import WRITE_SMALL, write_small
from gateway.sched.loads import LoadCache
from gateway.sched.predict import EndpointLoad
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView, FleetColumns
from gateway.sched.targets import time_left

#: Candidates from which a filter that judges each endpoint's load is placed over these arrays (a profile
#: takes the least its plugins name: `gateway.sched.profile.ColumnsFrom`). At 32, a 100-endpoint fleet
#: with most endpoints idle was cheaper over columns (`diag overhead-micro` fleet_100, `bench simscale`),
#: but on a full 100-endpoint fleet (`bench decisions --columns always` against the plain path, the same
#: decisions) a completion's placements, about 15 candidates each, came out dearer over columns: the
#: same as for the other plugins until that benchmark shows otherwise (docs/placement-over-columns.md).
COLUMNS_FROM_LOADS: Final = 128

#: Busy candidates from which a placement judges them over these arrays (below it, one load at a time:
#: numpy's fixed cost per call is more than the Python steps it saves; `diag overhead-micro` fleet_1000).
FLEET_LOADS_FROM: Final = 8

# Columns of the scalar table, one row per endpoint (then, per harm key, the least first-token and
# inter-token bounds: `_SCALARS + 2 * j` and the next, +inf where none) ...
_N, _SEATS, _WAIT, _PENDING, _CTX, _OVER, _TPOT, _LONG, _K1, _C1, _K2, _C2, _C3, _KV = range(14)
_NOW, _REMAINING, _BUDGET = 14, 15, 16
_SCALARS: Final = 17
# ... and the per-request matrices (one row per endpoint, one column per running request in the view's
# order, padding past them): prefilled, context, remaining tokens, then per harm key each running
# request's last-token bound (`_E2E + j`, +inf where none).
_PREFILLED, _CONTEXT, _REMAINING_R = 0, 1, 2
_E2E: Final = 3
_INF: Final = math.inf

_Floats = npt.NDArray[np.float64]
_Mask = npt.NDArray[np.bool_]
_HarmKey = tuple[float, float]


def fleet_loads(cache: LoadCache) -> FleetLoads:
    """The `FleetLoads` of `cache` (one per cache: the plugins that share a cache share its rows)."""
    got = cache.fleet
    if not isinstance(got, FleetLoads):
        got = cache.fleet = FleetLoads(cache)
    return got


class FleetLoads:
    """The loads of a fleet's endpoints as arrays (see the module), for one `LoadCache`."""

    __slots__ = (
        "_at",
        "_cache",
        "_entry_at",
        "_entry_reuse",
        "_fill",
        "_index",
        "_keys",
        "_looked",
        "_norms",
        "_per",
        "_refs",
        "_seen",
        "_synced",
        "_table",
        "_touched",
        "_used",
        "least",
    )

    def __init__(self, cache: LoadCache) -> None:
        self._cache = cache
        self.least = FLEET_LOADS_FROM  # busy candidates from which plugins judge them over the rows
        self._keys: list[_HarmKey] = []  # the (on_track, margin) pairs whose harm terms are kept
        self._index: Mapping[EndpointId, int] | None = None  # the columns' places the rows are kept by
        self._refs: list[EndpointLoad | Pending | None] = []  # what each row was derived from
        # per endpoint: its scalars, then per harm key the least first-token and inter-token bounds
        self._table: _Floats = np.zeros((0, _SCALARS))
        # the per-request matrices (`_PREFILLED`, 1.0 or 0.0, ...: one (endpoint, request) matrix each);
        # `_fill` their padding (0, 0, 0, +inf ...)
        self._per: _Floats = np.zeros((_E2E, 0, 0))
        self._fill: _Floats = np.zeros((_E2E, 1, 1))
        self._used: list[int] = []  # per row, the columns of `_per` its requests hold (padding past them)
        # per (gamma, tokens per seat) asked for (`capacity_norms`): each row's capacity norm, and
        # whether it is known (worked out when a row is written in Python floats; a numpy batch's rows
        # are not known until asked)
        self._norms: dict[tuple[float, float], tuple[_Floats, _Mask]] = {}
        # (columns, clock) the rows were last brought up to date for, and which rows were looked at then
        self._at: tuple[FleetColumns, float] | None = None
        self._looked: _Mask = np.zeros(0, dtype=np.bool_)
        # What the cache kept for each row's endpoint when last asked (`LoadCache.entry`): made at, reuse
        # time, the view it stood for; `_synced` false once the cache wrote that entry since
        # (`LoadCache.touched`). A row synced, of the same view and within its reuse time, is not asked
        # about again: the cache would hand out the load it was derived from.
        # (one watcher per cache: `fleet_loads` makes one per cache; another would ask every time)
        self._touched: set[EndpointId] | None = None
        if cache.touched is None:
            self._touched = cache.touched = set()
        # (Python lists: a placement reads a few dozen of them, one by one)
        self._synced: list[bool] = []
        self._entry_at: list[float] = []
        self._entry_reuse: list[float] = []
        self._seen: list[EndpointView | None] = []

    def want(self, on_track: float, margin: float) -> None:
        """Keep the harm terms for this `on_track` and `margin` too (`judge` asks for them)."""
        if (on_track, margin) not in self._keys:
            self._keys.append((on_track, margin))
            self._index = None  # every row derived again, with these terms

    def _reset(self, cols: FleetColumns) -> None:
        n = len(cols.endpoints)
        if self._index is not None and len(self._refs) == n and self._index == cols.index:
            # columns made whole again for the same endpoints in the same places (`Fleet.columns`
            # when many changed): the rows stand for the same endpoints, kept
            self._index = cols.index
            self._at = None
            return
        self._index = cols.index
        self._refs = [None] * n
        h = len(self._keys)
        self._table = np.zeros((n, _SCALARS + 2 * h))
        self._per = np.zeros((_E2E + h, n, 0))
        self._fill = np.zeros((_E2E + h, 1, 1))
        self._fill[_E2E:] = _INF
        self._used = [0] * n
        self._norms = {}
        self._at = None
        self._synced = [False] * n
        self._entry_at = [0.0] * n
        self._entry_reuse = [0.0] * n
        self._seen = [None] * n

    def rows(self, cols: FleetColumns, which: _Mask, now: float) -> None:
        """Bring the rows of the endpoints `which` (a mask in the columns' order) up to date as of
        `now`: each the numbers of the load the cache has for its endpoint now (`LoadCache.refs`),
        those that changed derived together (`load_batch.derive`)."""
        if self._index is not cols.index or len(self._refs) != len(cols.endpoints):
            self._reset(cols)
        if self._at is None or self._at[0] is not cols or self._at[1] != now:
            self._at = (cols, now)
            self._looked = np.zeros(len(cols.endpoints), dtype=np.bool_)
        todo = which > self._looked  # (`which` and not looked at)
        self._looked |= todo
        at = np.flatnonzero(todo)
        if not len(at):
            return
        self._untouch(cols.index)
        views, kept, seen = cols.endpoints, self._refs, self._seen
        # rows whose cache entry is as last asked, for the same view, within its reuse time
        # (`LoadCache._ref`'s test, the same float operations): the cache would hand out their kept load
        if self._touched is not None:
            synced, made_at, reuse = self._synced, self._entry_at, self._entry_reuse
            idx = [
                i
                for i in at.tolist()
                if not (synced[i] and views[i] is seen[i] and abs(made_at[i] - now) <= reuse[i])
            ]
        else:
            idx = at.tolist()
        if not idx:
            return
        asked = [views[i] for i in idx]
        refs = self._cache.refs(asked, now)
        self._untouch(cols.index)  # (the entries just written: synced below)
        entry = self._cache.entry
        for i, v, r in zip(idx, asked, refs, strict=True):
            got = entry(v.id)
            if got is None or got[0] is not r:  # (the cache was cleared meanwhile)
                continue
            self._entry_at[i] = got[2]
            self._entry_reuse[i] = got[1]
            seen[i] = got[3]
            self._synced[i] = True
        stale = [(i, r) for i, r in zip(idx, refs, strict=True) if kept[i] is not r]
        if stale:
            self._write(stale)

    def _untouch(self, index: Mapping[EndpointId, int]) -> None:
        """Rows whose cache entry was written since they were synced are synced no more."""
        touched = self._touched
        if touched:  # (None: not watching; nothing is synced then)
            synced = self._synced
            for eid in touched:
                i = index.get(eid)
                if i is not None:
                    synced[i] = False
            touched.clear()

    def _write(self, stale: list[tuple[int, EndpointLoad | Pending]]) -> None:
        loads = [(r.view, r.now, r.pace) for _, r in stale]
        counts = [len(v.running) for v, _, _ in loads]
        m = max(counts)
        width = self._per.shape[2]
        if m > width:
            self._grow(max(m, 2 * width))
        at = [i for i, _ in stale]
        params = self._cache.params
        kept = self._norms
        if sum(counts) < WRITE_SMALL:  # in Python floats, each row written in place
            keys = list(kept)
            made = write_small(
                loads,
                at,
                self._table,
                self._per,
                self._used,
                params.gamma,
                self._keys,
                token_gammas=[g for g, _ in keys],
            )
            for j, (g, per_seat) in enumerate(keys):
                norm, known = kept[(g, per_seat)]
                for i, (s, tokens) in zip(at, made, strict=True):
                    kv = s[_KV]
                    scale = s[_SEATS] * per_seat if math.isnan(kv) or kv == 0.0 else kv
                    norm[i] = math.hypot(s[_N] / s[_SEATS], tokens[j] / scale)
                    known[i] = True
        else:
            table, per = rows_of(derive_arrays(loads, params, self._keys), self._keys)
            rows = np.array(at, dtype=np.int64)
            self._table[rows] = table
            self._per[:, rows] = self._fill
            self._per[:, rows, :m] = per
            used = self._used
            for i, count in zip(at, counts, strict=True):
                used[i] = count
            for _, known in kept.values():
                known[rows] = False
        refs = self._refs
        for i, r in stale:
            refs[i] = r

    def _grow(self, width: int) -> None:
        kinds, rows, more = self._per.shape[0], self._per.shape[1], width - self._per.shape[2]
        self._per = np.concatenate((self._per, np.broadcast_to(self._fill, (kinds, rows, more))), axis=2)

    def capacity(
        self, idx: npt.NDArray[np.intp], gamma: float
    ) -> tuple[_Floats, _Floats, _Floats, _Floats, _Floats]:
        """Per endpoint at `idx` (rows up to date: `rows`): running requests, seats, KV capacity (NaN:
        unknown), Σ(context + γ·remaining) over its running requests summed in their order (best fit's
        `_tokens`), and how far they run long (`running_long`)."""
        t = self._table[idx]
        per_request = self._per[_CONTEXT][idx] + gamma * self._per[_REMAINING_R][idx]
        tokens = np.cumsum(per_request, axis=1)[:, -1] if per_request.shape[1] else np.zeros(len(idx))
        return t[:, _N], t[:, _SEATS], t[:, _KV], tokens, t[:, _LONG]

    def capacity_norms(self, idx: npt.NDArray[np.intp], gamma: float, per_seat: float) -> _Floats:
        """Best fit's capacity norm of each endpoint at `idx` (rows up to date: `rows`): the L2 norm of
        (running / seats, Σ(context + γ·remaining) / KV capacity, or seats × `per_seat` where the capacity
        is unknown or 0), by `math.hypot` as `BestFitFilter.capacity_norm` takes it. Kept per row for
        (`gamma`, `per_seat`): worked out when the row is written in Python floats (`_write`: the same
        operations on the same floats), else here for the rows written since the last ask (a numpy
        batch's, or all of them the first time a pair is asked for)."""
        key = (gamma, per_seat)
        got = self._norms.get(key)
        if got is None:
            rows = len(self._refs)
            got = self._norms[key] = (np.zeros(rows), np.zeros(rows, dtype=np.bool_))
        norm, known = got
        todo = idx[~known[idx]]
        if len(todo):
            n, seats, kv, tokens, _ = self.capacity(todo, gamma)
            scale = np.where(np.isnan(kv) | (kv == 0.0), seats * per_seat, kv)
            shares = zip((n / seats).tolist(), (tokens / scale).tolist(), strict=True)
            norm[todo] = [math.hypot(a, b) for a, b in shares]
            known[todo] = True
        got_norms: _Floats = norm[idx]
        return got_norms

    def best_fit_rows(self, idx: npt.NDArray[np.intp], gamma: float) -> _Floats:
        """The rows best fit's sure misses read (`best_fit_bounds._row`'s columns) of the endpoints at
        `idx` (rows up to date: `rows`)."""
        t = self._table[idx]
        n, seats = t[:, _N], t[:, _SEATS]
        open_ = (n > 0) & (n < seats)
        tokens = np.where(open_, t[:, _CTX] + gamma * t[:, _REMAINING], np.nan)
        budget = np.where(open_, t[:, _BUDGET], np.nan)
        cols = (_N, _SEATS, _WAIT, _PENDING, _CTX, _OVER, _NOW, _K1, _C1, _K2, _C2, _C3)
        return np.column_stack((t[:, cols], tokens, budget))

    def running_long(self, idx: npt.NDArray[np.intp]) -> _Floats:
        """How far the running requests of the endpoints at `idx` run long (`running_long`; rows up to
        date: `rows`)."""
        got: _Floats = self._table[idx, _LONG]
        return got

    def judge(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        which: _Mask,
        now: float,
        *,
        worst_case: bool,
        on_track: float,
        margin: float,
    ) -> tuple[_Mask, _Mask]:
        """Per endpoint of `which` (their loads as of `now`, `rows`), in the columns' order: whether
        placing `req` there endangers none of its running requests (`not endangers(load, req,
        margin=margin, on_track=on_track)`: the pair must be wanted, `want`), and whether it keeps its
        own targets there (`meets(load.predict(req, worst_case=worst_case), time_left, margin)` and
        `itl_ok`)."""
        self.rows(cols, which, now)
        idx = np.flatnonzero(which)
        numbers, (t, per) = self._numbers(req, idx, worst_case=worst_case)
        (first, _, per_iter, delay), (ttft, e2e, tpot) = numbers
        j = self._keys.index((on_track, margin))
        endangered = (first > t[:, _SCALARS + 2 * j]) | (per_iter > t[:, _SCALARS + 2 * j + 1])
        if delay.shape[1]:
            endangered |= (delay > per[_E2E + j]).any(axis=1)
        ttft_left, e2e_left = time_left(req, now)
        itl = req.slo.itl_ms
        bad: _Mask | None = None  # (missing one of its own targets)
        if ttft_left is not None:
            bad = ttft > ttft_left * margin
        if e2e_left is not None:
            late = e2e > e2e_left * margin
            bad = late if bad is None else bad | late
        if itl is not None:
            slow = ~(tpot * 1000.0 <= itl)
            bad = slow if bad is None else bad | slow
        return ~endangered, np.ones(len(idx), dtype=np.bool_) if bad is None else ~bad

    def numbers(
        self, req: SchedRequest, cols: FleetColumns, which: _Mask, now: float, *, worst_case: bool
    ) -> tuple[tuple[_Floats, _Floats, _Floats, _Floats], tuple[_Floats, _Floats, _Floats]]:
        """What `judge` compares, per endpoint of `which` (rows brought up to date first: `rows`):
        `join_delays`' first, pause and per-iteration cost of `req`, with the delay each running request
        would suffer as a last-token harm (`_any_over`'s; one row per endpoint, one column per running
        request, padded); and `predict`'s first token, last token and per-token time."""
        self.rows(cols, which, now)
        return self._numbers(req, np.flatnonzero(which), worst_case=worst_case)[0]

    def _numbers(
        self, req: SchedRequest, idx: npt.NDArray[np.intp], *, worst_case: bool
    ) -> tuple[
        tuple[tuple[_Floats, _Floats, _Floats, _Floats], tuple[_Floats, _Floats, _Floats]],
        tuple[_Floats, _Floats],
    ]:
        """`numbers` of the rows at `idx`, and those rows as read: their scalars and per-request
        matrices (one gather each)."""
        t = self._table[idx]
        per = self._per[:, idx]
        n, seats, over = t[:, _N], t[:, _SEATS], 1.0 + t[:, _OVER]
        k1, c1, k2, c2, c3 = t[:, _K1], t[:, _C1], t[:, _K2], t[:, _C2], t[:, _C3]
        out = output_bound(req, self._cache.params.gamma)
        p = float(resume_prompt_tokens(req))
        fresh: _Floats | float = p
        if req.cached:
            refs = self._refs
            fresh = np.array([float(prefill_tokens(req, _view_id(refs[i]))) for i in idx.tolist()])
        # `join_delays`, and `_any_over`'s delay of each running request
        per_iter = (k2 * (p + 0.5 * out) + c2) * over
        first = k1 * fresh
        pause = first + c1
        delay = np.where(per[_PREFILLED], pause[:, None], first[:, None])
        delay += np.minimum(per[_REMAINING_R], out) * per_iter[:, None]
        # `predict`
        ttft = t[:, _WAIT] + (k1 * (fresh + t[:, _PENDING]) + c1)
        b = seats if worst_case else np.minimum(n + 1.0, seats)
        tpot = ((k2 * ((t[:, _CTX] + p + 0.5 * out) / (n + 1.0)) + c2) * b + c3) * over
        e2e = ttft + max(0.0, out - 1.0) * tpot
        return ((first, pause, per_iter, delay), (ttft, e2e, tpot)), (t, per)


def _view_id(ref: EndpointLoad | Pending | None) -> EndpointId:
    assert ref is not None  # (rows up to date)
    return ref.view.id
