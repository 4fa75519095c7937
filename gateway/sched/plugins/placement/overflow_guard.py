"""MaaSO's overflow protection as a filter.

An endpoint is dropped when placing the request there would push a running request past its deadline
(its prefill pauses their decoding, its joining slows every later token), or when the request itself
would miss its deadlines there with worst-case throughput (every seat taken). A request that can meet
its deadlines nowhere is not held for that (unless `hold_infeasible`): it may go to any endpoint where it
harms no one, and admission decides what happens to such requests. Requests with nothing left to
protect (no targets, already late, best-effort) are not protected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Final

import numpy as np
import numpy.typing as npt
from msgspec import Meta

from gateway.sched.fleet_loads import COLUMNS_FROM_LOADS, fleet_loads
from gateway.sched.harms import Sparing
from gateway.sched.idle import output_bound
from gateway.sched.loads import LoadCache
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.plugins.placement.guard_shortlist import ShortlistRank
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.running import resume_prompt_tokens
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot
from gateway.sched.targets import time_left


class OverflowGuardParams(PredictionParams, frozen=True, kw_only=True):
    worst_case: bool = True  # the request's own completion at a full batch (else the batch it joins)
    margin: Annotated[float, Meta(gt=0.0, le=2.0)] = 1.0  # < 1 demands room to spare
    hold_infeasible: bool = False  # keep a request that meets its deadline nowhere queued
    # Protect a running request only while its time in hand is at least this share of its time left.
    on_track: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    # 0: judge every candidate. N: over columns (from `columns_from` candidates), judge the idle
    # candidates and the busy ones N at a time, least loaded first by an estimate of best fit's
    # capacity norm from the load last judged there (`guard_shortlist.ShortlistRank`), and stop at the
    # first N where one keeps the request's targets: a cheaper rule, not the same choices (a request
    # goes to one of those when an endpoint ranked later had the smaller norm now).
    shortlist: Annotated[int, Meta(ge=0)] = 0


class OverflowGuardFilter:
    name = "overflow-guard"
    # Its plain form derives each candidate's load: over columns it pays from this many candidates
    # (`gateway.sched.profile.ColumnsFrom`).
    columns_from = COLUMNS_FROM_LOADS

    def __init__(self, params: OverflowGuardParams, loads: LoadCache | None = None) -> None:
        self.params = params
        self._cache = loads or LoadCache(params.predict_params())
        self._fleet = fleet_loads(self._cache)
        self._fleet.want(params.on_track, params.margin)
        self._rank = ShortlistRank()  # the shortlist's rank of busy candidates
        # where a shortlist acted over columns, its answer as views (`filter_columns_few`); off, as a mask
        self.hand_over = True
        # the coefficients last judged and their distinct rows (`_rows`)
        self._kept_rows: (
            tuple[npt.NDArray[np.float64], tuple[list[_Coef], npt.NDArray[np.intp]] | None] | None
        ) = None

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        harmless, meeting, _ = self._judge(req, candidates, snap)
        if req.best_effort:
            return harmless
        if meeting or self.params.hold_infeasible:
            return meeting
        return harmless

    def filter_aside(
        self,
        req: SchedRequest,
        kept: Sequence[EndpointView],
        aside: Sequence[EndpointView],
        snap: FleetSnapshot,
    ) -> Sequence[EndpointView]:
        """What `filter` over `kept` and `aside` keeps of `kept` (`SetAsideFilter`): the endpoints set
        aside are judged only when none of `kept` meets the request's targets and some harm no one, for
        whether one of them does (then `filter` would keep those, none of `kept`)."""
        harmless, meeting, sparing = self._judge(req, kept, snap)
        if req.best_effort or not harmless:
            return harmless
        if meeting or self.params.hold_infeasible:
            return meeting
        load_of, now = self._cache.load, snap.now
        for e in aside:
            load = load_of(e, now)
            if sparing.spares(load) and sparing.keeps(load):
                return []
        return harmless

    def _judge(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> tuple[list[EndpointView], list[EndpointView], Sparing]:
        """The candidates where the request harms no one, those of them where it also meets its own
        targets (none for a best-effort request), and the judge (for more candidates). Every candidate
        is judged (a shortlist acts over columns only: a placement with fewer candidates than
        `columns_from` judges them all)."""
        p = self.params
        now = snap.now
        sparing = Sparing(
            req, margin=p.margin, on_track=p.on_track, left=time_left(req, now), worst_case=p.worst_case
        )
        harmless, meeting = sparing.judge(
            candidates, self._cache.loads(candidates, now, keep=False), own=not req.best_effort
        )
        return harmless, meeting, sparing

    def filter_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]:
        harmless, meeting = self._judge_columns(req, cols, candidates, snap)
        return self._kept(req, harmless, meeting)

    def _kept(
        self, req: SchedRequest, harmless: npt.NDArray[np.bool_], meeting: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.bool_]:
        """What `filter_columns` keeps of the candidates judged into `harmless` and `meeting`."""
        return meeting if self._answers_meeting(req, meeting) else harmless

    def _answers_meeting(
        self, req: SchedRequest, meeting: npt.NDArray[np.bool_], kept: list[EndpointView] | None = None
    ) -> bool:
        """Whether the guard keeps the candidates where the request also meets its targets (`meeting`,
        and `kept`: the busy ones of them a shortlist judged), rather than all those where it harms no
        one: not for a best-effort request; else when it holds infeasible requests or any meets them."""
        if req.best_effort:
            return False
        return self.params.hold_infeasible or bool(kept) or bool(np.count_nonzero(meeting))

    def filter_columns_few(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_] | list[EndpointView]:
        """`filter_columns`' answer, as views where a shortlist acted (`ColumnarFewFilter`): its blocks'
        loads are judged one at a time (`_judged`), so the plain forms of the plugins after it cost
        less over the few it keeps than their columnar forms, which would bring those loads' rows up
        to date first."""
        if not self.hand_over:
            return self.filter_columns(req, cols, candidates, snap)
        harmless, meeting, spared, kept = self._judged(req, cols, candidates, snap)
        if spared is None or kept is None:
            return self._kept(req, harmless, meeting)
        idle, busy = (meeting, kept) if self._answers_meeting(req, meeting, kept) else (harmless, spared)
        views = cols.endpoints
        return [views[i] for i in np.flatnonzero(idle).tolist()] + busy

    def filter_columns_aside(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        kept: npt.NDArray[np.bool_],
        aside: npt.NDArray[np.bool_],
        snap: FleetSnapshot,
    ) -> npt.NDArray[np.bool_]:
        """`filter_aside` over columns (`ColumnarSetAsideFilter`)."""
        harmless, meeting = self._judge_columns(req, cols, kept, snap)
        if req.best_effort or not np.count_nonzero(harmless):
            return harmless
        if self.params.hold_infeasible or np.count_nonzero(meeting):
            return meeting
        _, meeting_aside = self._judge_columns(req, cols, aside, snap)
        return np.zeros_like(kept) if np.count_nonzero(meeting_aside) else harmless

    def _judge_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """The columnar form of `_judge` (the candidates where the request harms no one, and of those
        the ones where it meets its own targets), as masks (`_judged`)."""
        harmless, meeting, spared, kept = self._judged(req, cols, candidates, snap)
        if spared is not None and kept is not None:
            index = cols.index
            harmless[[index[v.id] for v in spared]] = True
            meeting[[index[v.id] for v in kept]] = True
        return harmless, meeting

    def _judged(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> tuple[
        npt.NDArray[np.bool_], npt.NDArray[np.bool_], list[EndpointView] | None, list[EndpointView] | None
    ]:
        """`_judge_columns`' verdicts: on an endpoint with nothing running the request harms no one and
        is predicted from the endpoint's coefficients alone, for all such endpoints at once (`predict`'s
        arithmetic for an empty load, in its order); the endpoints that run something, or hold part of
        its prompt, are judged over their loads' arrays (`FleetLoads`: `endangers`, `predict`, `meets`
        and `itl_ok` for all of them at once, the loads those of `filter`), or one by one when they are
        fewer than `FleetLoads.least`. With more busy candidates than a `shortlist`, those `shortlist`
        at a time in `shortlist_order`, each load judged in turn as `filter` judges it (`Sparing`: no
        rows written), up to the first `shortlist` where one keeps the request's targets (or, best
        effort, where it harms no one on one). Masks of the candidates where it harms no one and of
        those where it also meets its targets, and where a shortlist acted the busy ones of those as
        views apart (else None: the masks hold them)."""
        p = self.params
        busy = _busy(req, cols, candidates)
        idle = candidates & ~busy
        harmless = idle.copy()
        meeting = np.zeros_like(candidates)
        left = time_left(req, snap.now)
        if not req.best_effort and np.count_nonzero(idle):
            meeting = idle & self._meets_idle(req, cols, left)
        size = p.shortlist
        places = busy.nonzero()[0]
        if not size or len(places) <= size:
            self._judge_busy(req, cols, busy, harmless, meeting, snap, left)
            return harmless, meeting, None, None
        order = self.shortlist_order(req, cols, places)
        listed = order.tolist()
        views, now = cols.endpoints, snap.now
        sparing = Sparing(req, margin=p.margin, on_track=p.on_track, left=left, worst_case=p.worst_case)
        own = not req.best_effort
        answered = np.count_nonzero(meeting if own else harmless) > 0  # (an idle one)
        spared: list[EndpointView] = []
        kept: list[EndpointView] = []
        loads_of, rank = self._cache.loads, self._rank
        for k in range(0, len(listed), size):
            block_views = [views[i] for i in listed[k : k + size]]
            loads = loads_of(block_views, now, keep=False)
            harms_none, keeps = sparing.judge(block_views, loads, own=own)
            rank.saw(cols, order[k : k + size], loads)
            spared += harms_none
            kept += keeps
            if answered or (keeps if own else harms_none):
                break
        return harmless, meeting, spared, kept

    def shortlist_order(
        self, req: SchedRequest, cols: FleetColumns, places: npt.NDArray[np.intp]
    ) -> npt.NDArray[np.intp]:
        """The busy candidates at `places` in the order the shortlist judges them: those holding part of
        the request's prompt first (best fit tries them first: `holders_first`), then the rank's order
        (`ShortlistRank`)."""
        places = self._rank.order(cols, places)
        if req.cached:
            index = cols.index
            held = np.zeros(len(cols.endpoints), dtype=np.bool_)
            for eid in req.cached:
                i = index.get(eid)
                if i is not None:
                    held[i] = True
            first = held[places]
            if first.any():
                places = np.concatenate((places[first], places[~first]))
        return places

    def _judge_busy(  # noqa: PLR0917 (`_judged`'s step over the busy candidates)
        self,
        req: SchedRequest,
        cols: FleetColumns,
        busy: npt.NDArray[np.bool_],
        harmless: npt.NDArray[np.bool_],
        meeting: npt.NDArray[np.bool_],
        snap: FleetSnapshot,
        left: tuple[float | None, float | None],
    ) -> None:
        """The `busy` candidates judged into `harmless` and `meeting` (in place, at their places only):
        over their loads' rows from `FleetLoads.least` of them, else one load at a time."""
        p = self.params
        now = snap.now
        places = busy.nonzero()[0]
        if len(places) >= self._fleet.least:
            spared, keeps = self._fleet.judge(
                req, cols, busy, now, worst_case=p.worst_case, on_track=p.on_track, margin=p.margin
            )
            harmless[busy] = spared
            if not req.best_effort:
                meeting[busy] = spared & keeps
        elif len(places):  # a few: one by one, as `filter` judges them (`Sparing`)
            views = cols.endpoints
            sparing = Sparing(req, margin=p.margin, on_track=p.on_track, left=left, worst_case=p.worst_case)
            own = not req.best_effort
            load_of = self._cache.load
            for i in places.tolist():
                load = load_of(views[i], now)
                if not sparing.spares(load):
                    continue
                harmless[i] = True
                if own and sparing.keeps(load):
                    meeting[i] = True

    def _meets_idle(
        self, req: SchedRequest, cols: FleetColumns, left: tuple[float | None, float | None]
    ) -> npt.NDArray[np.bool_]:
        """Per endpoint, whether `req` alone there (nothing running, nothing cached) keeps its targets:
        `EndpointLoad.predict` of an empty load, with `meets` and `itl_ok`. Without `worst_case` that
        depends on the endpoint's coefficients alone: a fleet's endpoints share a few rows of them
        (`_rows`), each judged once in Python floats, the same arithmetic."""
        p = self.params
        params = self._cache.params
        out = output_bound(req, params.gamma)
        prompt = float(resume_prompt_tokens(req))
        over = max(params.prefill_overhead, 0.0)  # no running prefills: the configured floor
        ttft_left, e2e_left = left
        margin = p.margin
        ttft_bound = None if ttft_left is None else ttft_left * margin
        e2e_bound = None if e2e_left is None else e2e_left * margin
        itl = req.slo.itl_ms
        rows = None if p.worst_case else self._rows(cols.coef)
        if rows is not None:
            kinds, of = rows
            steps = max(0.0, out - 1.0)
            oks = [
                _keeps_alone(k, prompt, out, over, steps, bounds=(ttft_bound, e2e_bound, itl)) for k in kinds
            ]
            return np.array(oks, dtype=np.bool_)[of]
        k1, c1, k2, c2, c3 = (cols.coef[:, j] for j in range(5))
        # (`predict` adds a zero wait to the first token and multiplies by one seat when not worst_case:
        # left out, they change no comparison)
        ttft = k1 * prompt + c1  # no wait, no pending prompts
        avg = (0.0 + prompt + 0.5 * out) / 1
        per_seat = k2 * avg + c2
        if p.worst_case:
            per_seat *= cols.seats
        tpot = (per_seat + c3) * (1.0 + over)
        bad = np.zeros(len(cols.endpoints), dtype=np.bool_)
        if ttft_bound is not None:
            bad |= ttft > ttft_bound
        if e2e_bound is not None:
            bad |= ttft + max(0.0, out - 1.0) * tpot > e2e_bound
        if itl is not None:
            bad |= ~(tpot * 1000.0 <= itl)
        return ~bad

    def _rows(self, coef: npt.NDArray[np.float64]) -> tuple[list[_Coef], npt.NDArray[np.intp]] | None:
        """The distinct rows of the columns' coefficients and each endpoint's row among them (None: more
        than `_FEW_ROWS`), kept while the coefficients are the same (a refit changes them)."""
        kept = self._kept_rows
        if kept is not None:
            seen, rows = kept
            if seen is coef or (seen.shape == coef.shape and np.array_equal(seen, coef)):
                self._kept_rows = (coef, rows)
                return rows
        kinds, of = np.unique(coef, axis=0, return_inverse=True)
        found = None
        if len(kinds) <= _FEW_ROWS:
            found = ([(k1, c1, k2, c2, c3) for k1, c1, k2, c2, c3 in kinds.tolist()], of.reshape(-1))
        self._kept_rows = (coef, found)
        return found


def _busy(req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """The candidates that run something, or hold part of the request's prompt."""
    busy = candidates & (cols.busy > 0)
    if req.cached:
        for eid in req.cached:
            i = cols.index.get(eid)
            if i is not None and candidates[i]:
                busy[i] = True
    return busy


#: A row of the coefficients (k1, c1, k2, c2, c3).
_Coef = tuple[float, float, float, float, float]
#: The most distinct rows of coefficients judged one by one (`OverflowGuardFilter._rows`).
_FEW_ROWS: Final = 16


def _keeps_alone(
    coef: _Coef,
    prompt: float,
    out: float,
    over: float,
    steps: float,
    *,
    bounds: tuple[float | None, float | None, float | None],
) -> bool:
    """`OverflowGuardFilter._meets_idle` of one endpoint with coefficients `coef` (not worst_case), in
    Python floats (the same operations in the same order: the same answer)."""
    k1, c1, k2, c2, c3 = coef
    ttft_bound, e2e_bound, itl = bounds
    ttft = k1 * prompt + c1
    if ttft_bound is not None and ttft > ttft_bound:
        return False
    tpot = (k2 * ((0.0 + prompt + 0.5 * out) / 1) + c2 + c3) * (1.0 + over)
    if e2e_bound is not None and ttft + steps * tpot > e2e_bound:
        return False
    return itl is None or tpot * 1000.0 <= itl


SPEC = PluginSpec(
    PluginKind.FILTER,
    "overflow-guard",
    OverflowGuardParams,
    lambda p, ctx: OverflowGuardFilter(p, ctx.loads.get(p.predict_params())),
    "MaaSO: drop endpoints where the request or a running one would miss its deadline",
)
