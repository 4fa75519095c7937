"""A sure admission without the seat order. When the requests queued ahead take every free seat, SLO
admission admits a request once it meets its SLO starting at the k-th seat to free up, on the endpoint
where that seat frees (`SloFeasibilityAdmitter._after`, `SeatOrder`). The exact answer needs every
ready endpoint's running requests' predicted ends, and between two submits a change of the fleet
remakes 10-20 endpoints' loads (more after a refit), whose ends were most of a submit's cost. With a
standing queue nearly every request is admitted with room to spare, and that can be shown without them:

- the seat's time is at most `t` once `k + 1` running requests surely end by `t`. Each running
  request's end is at most its max_tokens at its batch's per-token time with every context at its
  bound, plus the prefill of the prompts not yet prefilled (`pace_bounds`: a time-free bound, made once
  per pace, i.e. per set of running requests and coefficients, and valid while the load's time is at
  or past its view's progress reports, `reports_behind`); failing that, the ends the last seat order
  knows (`SeatOrder.known_at_most`) count too;
- what the prediction adds to the seat's time on whichever endpoint owns it (the prefill, and the
  decode at a full batch) is at most the same formula at the coefficients' maxima over the ready
  endpoints (`IdleBound`, slowest) and at each endpoint's seats, prefill share and largest mean context
  (`LoadBounds.tpot`).

`LoadBounds` keeps the per-load terms for the last list of loads, renewed at the places whose load is
another object. Every bound is made with the prediction's own floating-point operations in the same
order, on operands at least as large, and rounding is monotone, so the prediction on the owning
endpoint is at most the bound bit for bit: a request shown surely admitted is one the exact computation
admits too (`tests/unit/test_admission_seat_bound.py`). Otherwise the seat order answers, as before."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate, compress
from operator import is_not
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.sched.idle import IdleBound
from gateway.sched.load_batch import Pending
from gateway.sched.load_terms import Pace
from gateway.sched.perf import default_prior
from gateway.sched.plugins.admission.seat_order import SeatOrder, cached_ends
from gateway.sched.predict import EndpointLoad
from gateway.sched.prediction import seats_of
from gateway.sched.request import SchedRequest
from gateway.sched.running import resume_prompt_tokens
from gateway.sched.snapshot import EndpointView

_Floats = npt.NDArray[np.float64]
_PRIOR: Final = default_prior()

_NONE: _Floats = np.zeros(0)
#: Times the latest seat time within the limits is taken a little earlier when rounding put it past them,
#: and by how much (relative, and absolute seconds).
_NUDGES: Final = 3
_NUDGE: Final = 1e-12


def _floor(x: float) -> float:
    """`x`, at least 0.0 (infinite for NaN: a bound no limit keeps)."""
    return x if x >= 0.0 else 0.0 if x < 0.0 else math.inf


def pace_bounds(view: EndpointView, pace: Pace) -> tuple[float, _Floats]:
    """(context, ends) of a load of `view` on `pace` at any time: its running requests' contexts added up
    as `EndpointLoad` adds them (`ctx_sum`: prompt plus produced, one after another from 0.0), each at
    its largest (produced is capped at max_tokens; infinite without one); and, sorted, a time each
    running request's predicted end (`seat_free`) does not exceed while none has a negative progress
    (`reports_behind`): its remaining tokens are at most its max_tokens, at the batch's per-token time
    with the contexts at their bound, plus the prefill of every prompt not yet prefilled."""
    running = view.running
    ctx = 0.0
    inf = math.inf
    caps = []
    for r in running:
        mt = r.max_tokens
        cap = inf if mt is None else float(mt)
        ctx += r.prompt_tokens + cap
        caps.append(cap)
    n = len(running)
    c = view.perf or _PRIOR
    over = 1.0 + pace.overhead
    if not n or c.k1 < 0.0 or c.k2 < 0.0 or not over >= 0.0:
        return ctx, np.full(n, inf)
    # `EndpointLoad.tpot_now` and `_ends`, at the bounds
    tpot = _floor(_floor(_floor(c.k2 * _floor(ctx / n) + c.c2) * n + c.c3) * over)
    fresh = 0.0
    for f in pace.fresh:
        fresh += f
    pre = _floor(c.k1 * fresh + c.c1)
    if 0.0 < tpot < inf and pre < inf:
        # the same float operations one by one (no NaN: each cap is finite or infinite, tpot positive
        # and finite, pre finite), sorted: a few running requests cost less than the arrays' fixed cost
        return ctx, np.array(sorted([(cap if cap > 0.0 else 0.0) * tpot + pre for cap in caps]))
    with np.errstate(invalid="ignore"):
        ends = np.maximum(np.array(caps), 0.0) * tpot + pre
    ends.sort()  # (NaN last)
    return ctx, ends


def reports_behind(view: EndpointView) -> tuple[float, bool]:
    """The latest time `view`'s running requests' progress reports were taken (-inf without any), and
    whether every reported count is 0 or more: a load of `view` at that time or later estimates each
    running request's progress at 0 or more."""
    latest = -math.inf
    counts = True
    for r in view.running:
        at = r.reported_at
        if at is not None:
            latest = at if at > latest else latest
            if r.produced is not None and r.produced < 0:
                counts = False
    return latest, counts


#: What `LoadBounds` keeps of a pace: (context bound, running requests, seats, 1 + prefill share, the
#: running requests' ends' bounds sorted).
_Terms = tuple[float, int, int, float, _Floats]


class LoadBounds:
    """Per load of the last list asked about, renewed at the places whose load is another object: the
    terms of its pace (`pace_bounds`: its contexts and its running requests' ends; its running requests,
    seats and 1 + prefill share), and whether its time is at or past its view's progress reports
    (`reports_behind`: else its ends' bounds do not hold). A place's terms are made again only when its
    new load has another pace, its reports only for another view (nothing is kept beyond the loads
    asked about: their views hold running requests' records). `total`: the running requests over the
    loads."""

    __slots__ = ("_columns", "_flat", "_late", "_loads", "_places", "_rows", "_starts", "_terms", "total")

    def __init__(self) -> None:
        self._loads: Sequence[EndpointLoad | Pending] = ()
        self._terms: list[_Terms] = []  # per place
        # per place: the pace its terms are of, the view its reports were read from, and theirs
        self._places: list[tuple[Pace | None, EndpointView | None, tuple[float, bool]]] = []
        self._flat: _Floats = _NONE  # the places' ends' bounds concatenated
        self._starts: list[int] = [0]  # where each place's ends start in `_flat`, and their count at the end
        self._late: set[int] = set()  # the places whose load's time is before a progress report
        # The terms' scalars, a row per place (`_rows`, once asked for) and as columns (`_columns`)
        self._rows: _Floats | None = None
        self._columns: _Floats | None = None
        self.total = 0

    def renew(self, loads: Sequence[EndpointLoad | Pending]) -> None:
        """Take `loads` as the loads asked about (their terms made for the places that changed). The
        ends and scalars of the places whose terms stayed are kept: only those of the places whose pace
        changed are replaced (between two submits most remade loads keep their pace)."""
        kept = self._loads
        if kept is loads:
            return
        size = len(loads)
        whole = len(kept) != size
        if whole:
            places: Sequence[int] = range(size)
            terms: list[_Terms] = [(0.0, 0, 0, 0.0, _NONE)] * size
            seen: list[tuple[Pace | None, EndpointView | None, tuple[float, bool]]] = [
                (None, None, (0.0, True))
            ] * size
            self._late = set()
        else:
            places = list(compress(range(size), map(is_not, kept, loads)))
            terms = self._terms.copy()
            seen = self._places.copy()
        late = self._late
        moved: list[int] = []  # the places whose terms were made again
        for i in places:
            ref = loads[i]
            view, pace = ref.view, ref.pace
            was_pace, was_view, reports = seen[i]
            if pace is not was_pace:
                ctx, ends = pace_bounds(view, pace)
                terms[i] = (ctx, len(view.running), seats_of(view), 1.0 + pace.overhead, ends)
                moved.append(i)
            if view is not was_view:
                reports = reports_behind(view)
            seen[i] = (pace, view, reports)
            latest, counts = reports
            if latest <= ref.now and counts:
                late.discard(i)
            else:
                late.add(i)
        self._loads = loads
        self._terms = terms
        self._places = seen
        if whole:
            self._rows = self._columns = None
            self._flat = np.concatenate([t[4] for t in terms]) if size else _NONE
            self._starts = [0, *accumulate(len(t[4]) for t in terms)]
        elif moved:
            self._replace(moved)
        self.total = len(self._flat)

    def _replace(self, moved: list[int]) -> None:
        """Bring `_flat`, `_starts` and the scalars' rows up to date at the places `moved` (in order),
        whose terms were made again: the same arrays as made whole from the terms."""
        terms, starts, flat = self._terms, self._starts, self._flat
        pieces: list[_Floats] = []
        prev = 0
        grew = False
        for i in moved:
            ends = terms[i][4]
            pieces += (flat[prev : starts[i]], ends)
            prev = starts[i + 1]
            grew = grew or len(ends) != prev - starts[i]
        pieces.append(flat[prev:])
        self._flat = np.concatenate(pieces)
        if grew:
            self._starts = [0, *accumulate(len(t[4]) for t in terms)]
        rows = self._rows
        if rows is not None:
            rows = rows.copy()  # (the columns handed out before stay those of their loads)
            for i in moved:
                rows[i] = terms[i][:4]
            self._rows = rows
            self._columns = rows.T

    def within(self, t: float) -> int:
        """How many of the loads' running requests surely end at `t` or before, by their bounds."""
        count = int(np.count_nonzero(self._flat <= t))
        for i in self._late:
            count -= int(np.searchsorted(self._terms[i][4], t, side="right"))
        return count

    def bound_within(self, place: int, t: float) -> int:
        """`within` for the load at `place` alone."""
        if place in self._late:
            return 0
        return int(np.searchsorted(self._terms[place][4], t, side="right"))

    def tpot(self, slowest: IdleBound, p: float, half_out: float) -> float:
        """At least the per-token time `predict_after` gives a request of `p` prompt tokens (resumed) and
        `half_out` half its output on any of the loads (at a full batch), at the coefficients'
        maxima."""
        cols = self._columns
        if cols is None:
            rows = self._rows = np.array([t[:4] for t in self._terms], dtype=np.float64).reshape(-1, 4)
            cols = self._columns = rows.T
        ctx, n, seats, over = cols
        if not len(ctx) or not float(over.min()) >= 0.0:
            return math.inf
        with np.errstate(invalid="ignore"):
            a = np.maximum((((ctx + p) + half_out) / (n + 1.0)), 0.0)
            q = np.maximum(slowest.k2 * a + slowest.c2, 0.0)
            d = np.maximum(q * seats + slowest.c3, 0.0)
            return _floor(float((d * over).max()))


class SureAdmission:
    """`admits`: whether a request surely meets its SLO at the `k`-th seat to free up (the module's
    docstring), with the loads' bounds kept from one question to the next (`LoadBounds`)."""

    __slots__ = ("loads",)

    def __init__(self) -> None:
        self.loads = LoadBounds()

    def admits(
        self,
        req: SchedRequest,
        loads: Sequence[EndpointLoad | Pending],
        k: int,
        *,
        order: SeatOrder | None,
        bounds: tuple[IdleBound | None, IdleBound | None],
        limits: tuple[float | None, float | None, float | None],
        out: float,
    ) -> bool:
        """Whether `req` meets `limits` (first token, last token, per-token time: the SLO's times left
        with the admission's margin, in seconds and for the last ms) starting at the `k`-th (from 0) seat
        to free up over `loads`, on the endpoint where it frees, as `SloFeasibilityAdmitter._after`
        predicts it, shown from the ends' bounds and those `order` (the last seat order, if any) knows;
        False when it cannot be shown. `bounds`: the slowest and the fastest coefficients of the loads'
        endpoints (`IdleBound`); `out`: the output the request is planned for
        (`EndpointLoad.output_tokens`)."""
        slowest, fastest = bounds
        if slowest is None or fastest is None or fastest.k1 < 0.0 or fastest.k2 < 0.0:
            return False
        kept = self.loads
        kept.renew(loads)
        if k >= kept.total:
            return False  # fewer running requests than seats it waits for: no seat frees for it
        lt, le, li = limits
        p = float(resume_prompt_tokens(req))
        pre = slowest.k1 * p + slowest.c1  # at least any endpoint's prefill (fewer tokens where cached)
        steps = max(0.0, out - 1.0)
        decode = 0.0
        if le is not None or li is not None:
            tpot = kept.tpot(slowest, p, 0.5 * out)
            if li is not None and not tpot * 1000.0 <= li:
                return False
            decode = steps * tpot
        t = math.inf
        if lt is not None:
            t = lt - pre
        if le is not None:
            t = min(t, le - (pre + decode))
        # the same operations as the prediction, at the bounds: kept within the limits? (rounded the
        # other way, a time a few units in the last place less)
        for _ in range(_NUDGES):
            ttft = t + pre
            if (lt is None or ttft <= lt) and (le is None or ttft + decode <= le):
                break
            t -= _NUDGE * abs(t) + _NUDGE
        else:
            return False
        if kept.within(t) > k:
            return True
        if order is None:
            return False
        # the ends the last order knows, and for the loads remade since, theirs when made already, else
        # their bounds
        known, changed = order.known_at_most(loads, t)
        for i in changed:
            if known > k:
                break
            arr = cached_ends(loads[i])
            known += int(np.count_nonzero(arr <= t)) if arr is not None else kept.bound_within(i, t)
        return known > k
