"""Best fit's sure misses, for a whole fleet at once.

Best fit (`gateway.sched.plugins.placement.best_fit`) tries its constraints endpoint by endpoint until
one fits; when none does (most of a long queue, on a busy fleet) it has tried every candidate, a few
microseconds of Python each. The cheap part of those tries is arithmetic on a few numbers per endpoint:
whether its seats are taken, the request's own prediction there against its time left, and the ATGT
batch bound (b). `sure_misses` does that arithmetic for every candidate in one pass over arrays (each
endpoint's numbers kept on its load, `EndpointLoad.memo`) and names the endpoints where the request
surely fits in neither form (`BestFitFilter.fits_both` would answer (False, False) there), and the KV
constraint (e) at the request's first iteration, where every running request and it hold their context
(the peak is at least that: a request that fits nowhere in a batch backlog is mostly over it): the filter,
once the first few endpoints in its order did not take the request, skips those and tries the others
one by one as before.

The choice is the same as trying every endpoint: an endpoint is named only when its test fails by more
than a rounding margin (`_TOL`, relative; the arrays' arithmetic may round differently from the Python
path's), so a test that is near its bound, or a request whose own targets count on one side of a bound
and not on the other, is left to the exact test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from gateway.sched.fleet_loads import FleetLoads
from gateway.sched.idle import output_bound
from gateway.sched.loads import LoadCache
from gateway.sched.perf import default_prior
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView, FleetColumns
from gateway.sched.targets import time_left


class _Strictness(Protocol):
    @property
    def gamma(self) -> float: ...
    @property
    def theta(self) -> float: ...


class BestFit(Protocol):
    """What of best fit (`gateway.sched.plugins.placement.best_fit.BestFitFilter`) the bounds read."""

    @property
    def params(self) -> _Strictness: ...
    @property
    def load_params(self) -> PredictParams: ...
    @property
    def numbers(self) -> KeptNumbers: ...


#: Candidates below this many are tried one by one (the arrays cost more than they save) ...
MIN_CANDIDATES: Final = 24
#: ... and so are the first this many in the filter's order (on a fleet with room one of them fits).
EAGER_TRIES: Final = 4
#: Rounding margin: a test counts as failed only by more than this share of its bound (plus as much
#: absolute), so the arrays' rounding never names an endpoint the exact test would keep.
_TOL: Final = 1e-9

# Columns of an endpoint's row (`_row`; `gateway.sched.fleet_loads.FleetLoads.best_fit_rows` too).
_N, _SEATS, _WAIT, _PENDING, _CTX, _OVER, _NOW, _K1, _C1, _K2, _C2, _C3, _TOKENS, _BUDGET = range(14)
_NAN: Final = float("nan")
_PRIOR: Final = default_prior()


def _row(fit: BestFit, load: EndpointLoad) -> tuple[float, ...]:
    """A load's numbers for `sure_misses` (kept on the load: it stands for its endpoint for a while).
    The running requests' token sum (best fit's `_tokens`, summed in another order: within the
    rounding margin) and tightest ITL budget (its `_running_terms`) are derived only where
    a seat is free (a full endpoint is a miss whatever they are), without the load's running states."""
    gamma = fit.params.gamma
    key = ("best-fit-row", gamma)
    got: tuple[float, ...] | None = load.memo.get(key)
    if got is None:
        c = load.coef
        tokens, budget = _NAN, _NAN
        if 0 < load.n < load.seats:
            tokens = load.ctx_sum + gamma * load.remaining_total()
            budgets = [r.itl_s for r in load.view.running if r.itl_s is not None and not r.best_effort]
            if budgets:
                budget = min(budgets)
        got = (
            float(load.n),
            float(load.seats),
            load.wait_s,
            load.pending_prompt,
            load.ctx_sum,
            load.overhead,
            load.now,
            c.k1,
            c.c1,
            c.k2,
            c.c2,
            c.c3,
            tokens,
            budget,
        )
        load.memo[key] = got
    return got


def _over(value: npt.NDArray[np.float64], bound: npt.NDArray[np.float64] | float) -> npt.NDArray[np.bool_]:
    """`value > bound` by more than the rounding margin (False where either is NaN)."""
    return value > bound + _TOL * (1.0 + np.abs(bound))


def _margins(
    deadline: float | None, now: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64] | None, npt.NDArray[np.float64] | None]:
    """The time left to `deadline` from each `now`, less and plus its rounding margin: `value <= lo` is
    `value` within it with the margin to spare, `value > hi` over it by more than the margin (`_over`);
    (None, None) without a deadline."""
    if deadline is None:
        return None, None
    left = deadline - now
    margin = _TOL * (1.0 + np.abs(left))
    return left - margin, left + margin


def sure_misses(fit: BestFit, loads: Sequence[EndpointLoad], req: SchedRequest) -> list[bool]:
    """Per load, True where `BestFitFilter.fits_both(load, req)` is surely (False, False): every seat
    taken, or (with free seats and something running) the ATGT bound (b) broken, or the request's own
    targets counting there and its predicted last or first token past its time left. False: not known
    (the exact test decides)."""
    return sure_misses_of_loads(fit, loads, req)[0]


def sure_misses_of_loads(
    fit: BestFit, loads: Sequence[EndpointLoad], req: SchedRequest
) -> tuple[list[bool], list[bool]]:
    """`sure_misses`, and per load whether the request surely does not fit there with the θ reserve
    (`sure_misses_both`)."""
    rows, kv = _numbers(fit, loads)
    fresh: npt.NDArray[np.float64] | float = float(resume_prompt_tokens(req))
    if req.cached:
        fresh = np.array([float(prefill_tokens(req, load.view.id)) for load in loads], dtype=np.float64)
    return sure_misses_both(fit, rows, req, fresh, kv)


class KeptNumbers:
    """`_numbers`' last answer for one best fit (`BestFit.numbers`): the loads it was for (by identity),
    and their rows and KV terms."""

    __slots__ = ("kv", "loads", "rows")

    def __init__(self) -> None:
        self.loads: Sequence[EndpointLoad] = ()
        self.rows: npt.NDArray[np.float64] = np.zeros((0, 14))
        self.kv: npt.NDArray[np.float64] = np.zeros((0, 3))


def _numbers(
    fit: BestFit, loads: Sequence[EndpointLoad]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The loads' rows (`_row`) and KV terms (`_kv`) as arrays, one row per load. A load's numbers never
    change, and the requests tried in one serve look at mostly the same loads: the last answer is given
    again for the same loads, and brought up to date at the places where a few loads are new (never
    written to: the arrays of an earlier answer stay as they were)."""
    last = fit.numbers
    old = last.loads
    if len(old) == len(loads):
        changed = [i for i, (a, b) in enumerate(zip(loads, old, strict=True)) if a is not b]
        if not changed:
            return last.rows, last.kv
        if len(changed) <= len(loads) // 4:
            rows, kv = last.rows.copy(), last.kv.copy()
            for i in changed:
                rows[i] = _row(fit, loads[i])
                kv[i] = _kv(loads[i])
            last.loads, last.rows, last.kv = list(loads), rows, kv
            return rows, kv
    rows = np.array([_row(fit, load) for load in loads], dtype=np.float64).reshape(len(loads), 14)
    kv = np.array([_kv(load) for load in loads], dtype=np.float64).reshape(len(loads), 3)
    last.loads, last.rows, last.kv = list(loads), rows, kv
    return rows, kv


def _kv(load: EndpointLoad) -> tuple[float, float, float]:
    """What (e)'s bound takes from a load: its KV coefficients h and j, and its KV capacity (NaN:
    unknown, never over)."""
    c, cap = load.coef, load.kv_capacity
    return c.h, c.j, _NAN if cap is None else float(cap)


def _kv_of_view(view: EndpointView) -> tuple[float, float, float]:
    """`_kv` of a load of `view` (a load takes its coefficients and KV capacity from its view)."""
    c, cap = view.perf or _PRIOR, view.kv_capacity_tokens
    return c.h, c.j, _NAN if cap is None else float(cap)


#: Best fit names its sure misses to the filter before it (`RejectGate`) while its last look at them
#: named at least this share of the candidates: on a fleet with room the first endpoint tried fits and
#: naming them up front is only a cost (more than the overflow guard's judgement of the same endpoints
#: when all their loads are kept); in a batch backlog nearly all are named.
SET_ASIDE_FROM: Final = 0.25


class RejectGate:
    """Whether best fit names its sure misses up front (`SureRejects`): for a request with nothing
    cached (with a cached prefix the order the candidates are tried in takes the first-ordered one's
    prediction: dropping that one could change it), from `MIN_CANDIDATES` candidates on, while the
    last look at the sure misses of a whole candidate list named at least `SET_ASIDE_FROM` of them.
    A cost rule only: the choice is the same either way. When it says no, the filter's own look (after
    its first tries) is what it learns from; when it says yes, its own."""

    __slots__ = ("_named", "_skipped", "share")

    def __init__(self) -> None:
        self.share = 1.0  # of the candidates named at the last look
        self._skipped: SchedRequest | None = None  # the last request not named up front
        self._named: SchedRequest | None = None  # the last request named up front

    def named(self, req: SchedRequest) -> bool:
        """Whether `req`'s sure misses were the last named up front (what the filter is then handed
        holds none: it need not look for them again)."""
        return self._named is req

    def ask(self, req: SchedRequest, candidates: int) -> bool:
        self._named = None  # (until named for this placement)
        if req.cached or candidates < MIN_CANDIDATES:
            return False
        if self.share >= SET_ASIDE_FROM:
            return True
        self._skipped = req
        return False

    def seen(self, req: SchedRequest, named: Sequence[bool], *, up_front: bool = False) -> None:
        """Learn from a look at `req`'s sure misses: one up front, or the filter's own after its first
        tries for a request not named up front (its candidates then all those of the placement)."""
        if up_front:
            self._named = req
        if named and (up_front or self._skipped is req):
            self.share = sum(named) / len(named)


def sure_rejects(
    fit: BestFit,
    cache: LoadCache,
    gate: RejectGate,
    req: SchedRequest,
    candidates: Sequence[EndpointView],
    *,
    now: float,
) -> list[bool]:
    """Best fit's sure misses named up front (`RejectGate`), on the loads of the cache it shares with
    the filter before (made as that filter would make them)."""
    if not gate.ask(req, len(candidates)):
        return [False] * len(candidates)
    named = sure_misses(fit, cache.loads(candidates, now, keep=False), req)
    gate.seen(req, named, up_front=True)
    return named


def sure_rejects_columns(  # noqa: PLR0917 (the columnar step's arguments, with best fit's own)
    fit: BestFit,
    fleet: FleetLoads,
    gate: RejectGate,
    req: SchedRequest,
    cols: FleetColumns,
    candidates: npt.NDArray[np.bool_],
    *,
    now: float,
) -> npt.NDArray[np.bool_]:
    """Best fit's sure misses named up front over columns, as a mask (`RejectGate`): the busy
    candidates' rows brought up to date (`FleetLoads.rows`, as the filter before would) and judged
    over the arrays with (e)'s bound; an idle endpoint always fits."""
    named = np.zeros_like(candidates)
    if not gate.ask(req, int(np.count_nonzero(candidates))):
        return named
    which = candidates & (cols.busy > 0)
    places = which.nonzero()[0]
    if len(places) == 0:
        gate.seen(req, [False], up_front=True)
        return named
    fleet.rows(cols, which, now)
    views = cols.endpoints
    kv = np.array([_kv_of_view(views[i]) for i in places.tolist()], dtype=np.float64).reshape(len(places), 3)
    rows = fleet.best_fit_rows(places, fit.params.gamma)
    named[places] = sure_misses_of(fit, rows, req, float(resume_prompt_tokens(req)), kv)
    gate.seen(req, named[candidates].tolist(), up_front=True)
    return named


def sure_misses_of(
    fit: BestFit,
    rows: npt.NDArray[np.float64],
    req: SchedRequest,
    fresh: npt.NDArray[np.float64] | float,
    kv: npt.NDArray[np.float64] | None = None,
) -> list[bool]:
    """`sure_misses` over the loads' numbers (one row each, `_row`'s columns; the running requests'
    token sum and ITL budget may be NaN where the endpoint is idle or full), `fresh` the prompt tokens
    the request's prefill computes on each (or on all); `kv`: each load's (h, j, KV capacity) (`_kv`),
    for (e)'s bound (None: not asked)."""
    return sure_misses_both(fit, rows, req, fresh, kv)[0]


def sure_misses_both(
    fit: BestFit,
    rows: npt.NDArray[np.float64],
    req: SchedRequest,
    fresh: npt.NDArray[np.float64] | float,
    kv: npt.NDArray[np.float64] | None = None,
) -> tuple[list[bool], list[bool]]:
    """`sure_misses_of`, and per row whether the request surely does not fit with the θ reserve
    (`fits_both`'s first answer False): a sure miss, or its own targets surely counting and its
    predicted last or first token past θ of its time left by more than the rounding margin."""
    n, seats = rows[:, _N], rows[:, _SEATS]
    full = n >= seats
    open_ = (n > 0) & ~full
    if not np.count_nonzero(open_):
        only_full: list[bool] = full.tolist()
        return only_full, only_full
    p = fit.params
    gamma = fit.load_params.gamma
    out = output_bound(req, gamma)
    prompt = float(resume_prompt_tokens(req))
    k1, c1, k2, c2, c3 = rows[:, _K1], rows[:, _C1], rows[:, _K2], rows[:, _C2], rows[:, _C3]
    steps = max(0.0, out - 1.0)
    # The request's own prediction (`EndpointLoad.predict`) and its idle service (`idle_service`).
    # (each term taken once where several tests read it, with the same operations in the same order)
    n1, over1 = n + 1.0, 1.0 + rows[:, _OVER]
    ttft = rows[:, _WAIT] + (k1 * (fresh + rows[:, _PENDING]) + c1)
    batch = np.minimum(n1, seats)
    avg = (rows[:, _CTX] + prompt + 0.5 * out) / n1
    e2e = ttft + steps * (((k2 * avg + c2) * batch + c3) * over1)
    idle_ttft = k1 * fresh + c1
    idle_e2e = idle_ttft + steps * (
        ((k2 * (prompt + 0.5 * out) + c2) * 1.0 + c3) * (1.0 + fit.load_params.prefill_overhead)
    )
    # Whether its own targets surely count (`own`) or surely do not; neither: near a bound.
    now = rows[:, _NOW]
    ttft_dl, e2e_dl = time_left(req, 0.0)  # deadlines on the clock; each load's time left from its `now`
    # each time left less and plus its rounding margin (`_margins`)
    ttft_lo, ttft_hi = _margins(ttft_dl, now)
    e2e_lo, e2e_hi = _margins(e2e_dl, now)
    own_yes = np.full(len(rows), not req.best_effort)
    own_no = np.full(len(rows), req.best_effort)
    if not req.best_effort:
        for lo, hi, idle in ((ttft_lo, ttft_hi, idle_ttft), (e2e_lo, e2e_hi, idle_e2e)):
            if lo is not None and hi is not None:
                own_yes &= idle <= lo
                own_no |= idle > hi
    misses = own_yes & (
        (e2e > e2e_hi if e2e_hi is not None else False) | (ttft > ttft_hi if ttft_hi is not None else False)
    )
    # (b): the running requests' tightest ITL budget, with the request's own when its targets count.
    total = rows[:, _TOKENS] + (req.prompt_tokens + p.gamma * out)
    lhs = k2 * total
    theta = p.theta

    c2n = c2 * n1

    def atgt(budget: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        t_dec = budget / over1
        return _over(lhs, theta * (t_dec - c2n - c3))

    running_budget = rows[:, _BUDGET]
    itl_ms = req.slo.itl_ms
    if itl_ms is None or req.best_effort:
        misses |= atgt(running_budget)
    else:
        mine = itl_ms / 1000.0
        with_mine = atgt(np.fmin(running_budget, mine))
        without = atgt(running_budget)
        misses |= (own_yes & with_mine) | (own_no & without) | (with_mine & without)
    if kv is not None:
        # (e): `EndpointLoad.peak_kv` with the request is at least its first iteration's footprint,
        # every running request and this one holding h·context + j (`KvPeak.with_extra`'s last term)
        start = kv[:, 0] * (rows[:, _CTX] + float(req.prompt_tokens)) + n1 * kv[:, 1]
        misses |= _over(start, kv[:, 2])
    named: list[bool] = (full | (open_ & misses)).tolist()
    # the θ reserve on its own deadlines (`fits_both`: `pred > θ · time left`, its targets counting)
    strict = misses.copy()
    for deadline, value in ((e2e_dl, e2e), (ttft_dl, ttft)):
        if deadline is not None:
            strict |= own_yes & _over(value, theta * (deadline - now))
    return named, (full | (open_ & strict)).tolist()


def per_candidate(busy: npt.NDArray[np.bool_], named: Sequence[bool]) -> list[bool]:
    """`named` (one per busy candidate, in order) per candidate: False where nothing runs."""
    out = np.zeros(len(busy), dtype=np.bool_)
    out[busy] = named
    got: list[bool] = out.tolist()
    return got
