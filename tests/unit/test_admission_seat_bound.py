"""SLO admission's sure admission (`seat_bound`) admits only what the exact seat order admits, and the
admitter decides as one without it (hypothesis: random fleets of up to 40 endpoints with running
requests that have progress reports, some taken after the loads' time, max_tokens or none, two kinds of
hardware and the generic prior; the clock moving within and past the loads' reuse time, dispatches,
completions and progress reports; requests with every kind of target over a wide range, queued counts
on both sides of the free seats and of the running requests). And the bounds themselves: every running
request's predicted end and every load's context sum are at most their pace's bounds (`pace_bounds`)
while the load's time is at or past its view's reports."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import ModelName
from gateway.sched.columns import columns_of
from gateway.sched.idle import fleet_bound, output_bound
from gateway.sched.load_batch import Pending
from gateway.sched.loads import LoadCache
from gateway.sched.perf import default_prior
from gateway.sched.plugins.admission.seat_bound import LoadBounds, SureAdmission, pace_bounds, reports_behind
from gateway.sched.plugins.admission.seat_order import SeatOrder
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.predict import EndpointLoad
from gateway.sched.running import with_progress
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot
from gateway.sched.targets import time_left
from tests.unit.fleet_steps import advance, changed
from tests.unit.test_admission_seat_columns import SLO, Endpoint, _endpoint, _step, _view, step_request

NOW = 10.0
#: Targets scaled by these: most requests surely admitted at the widest, few at the narrowest.
_SCALES = (1.0, 30.0, 1000.0)


def _ahead(v: EndpointView, every: int, by_s: float, *, capped: bool = False) -> EndpointView:
    """`v` with every `every`-th running request's progress report taken `by_s` after `NOW` (0: none);
    `capped`: every running request with a max_tokens (400 where it had none)."""
    runs = tuple(
        with_progress(r, r.produced or 0, r.first_token_at or NOW, NOW + by_s)
        if every and j % every == 0
        else r
        for j, r in enumerate(v.running)
    )
    if capped:
        runs = tuple(r if r.max_tokens is not None else dataclasses.replace(r, max_tokens=400) for r in runs)
    return dataclasses.replace(v, running=runs)


def _plain_after(loads: Sequence[EndpointLoad | Pending], k: int) -> tuple[float, EndpointLoad] | None:
    made = [load.load() if isinstance(load, Pending) else load for load in loads]
    ordered = sorted((t, i) for i, load in enumerate(made) for t in load.seat_free)
    if k >= len(ordered):
        return None
    t, i = ordered[k]
    return t, made[i]


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=40),
    steps=st.lists(_step, min_size=1, max_size=10),
    scale=st.sampled_from(_SCALES),
    ahead=st.tuples(st.sampled_from((0, 1, 3)), st.floats(min_value=0.001, max_value=2.0)),
    ks=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=4),
    margin=st.sampled_from((0.8, 1.0, 1.2)),
    capped=st.booleans(),
)
def test_a_request_shown_surely_admitted_meets_its_slo_at_the_exact_seat(  # noqa: PLR0917
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int, str, tuple[float | None, float | None, float | None], int]],
    scale: float,
    ahead: tuple[int, float],
    ks: list[int],
    margin: float,
    capped: bool,
) -> None:
    params = SloFeasibilityParams(margin=margin, recheck="off")
    cache = LoadCache(params.predict_params())
    plain = LoadCache(params.predict_params())
    sure = SureAdmission()
    order: SeatOrder | None = None
    views = tuple(_ahead(_view(k, e), ahead[0], ahead[1], capped=capped) for k, e in enumerate(endpoints))
    now = NOW
    for serial, (dt_ms, at, what, cls, targets, _) in enumerate(steps):
        now += dt_ms / 1000.0
        k = at % len(views)
        moved = changed(views[k], what, now, serial)
        if moved is not None:
            views = (*views[:k], moved, *views[k + 1 :])
        snap = FleetSnapshot(now=now, endpoints=views)
        loads = cache.refs(list(views), now)
        exact = plain.refs(list(views), now)
        r = step_request(serial, now, cls, targets, scale)
        ttft_left, e2e_left = time_left(r, now)
        left = (
            None if ttft_left is None else ttft_left * margin,
            None if e2e_left is None else e2e_left * margin,
            None if r.slo.itl_ms is None else r.slo.itl_ms * margin,
        )
        model = ModelName("m")
        bounds = (fleet_bound(snap, model, slowest=True), fleet_bound(snap, model, slowest=False))
        out = output_bound(r, params.predict_params().gamma)
        for kth in ks:
            if not sure.admits(r, loads, kth, order=order, bounds=bounds, limits=left, out=out):
                continue
            got = _plain_after(exact, kth)
            assert got is not None
            p = got[1].predict_after(r, got[0])
            assert left[0] is None or p.ttft_s <= left[0]
            assert left[1] is None or p.e2e_s <= left[1]
            assert left[2] is None or p.tpot_s * 1000.0 <= left[2]
        if serial % 3 == 0:  # an order made now and then: its ends known for the loads kept since
            order = SeatOrder(loads)


class _Plain(SloFeasibilityAdmitter):
    """The same admission without the sure admission: every question answered by the seat order."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._sure = None


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=40),
    steps=st.lists(_step, min_size=1, max_size=12),
    scale=st.sampled_from(_SCALES),
    ahead=st.tuples(st.sampled_from((0, 1, 3)), st.floats(min_value=0.001, max_value=2.0)),
    assume_full=st.booleans(),
    queued=st.lists(st.integers(min_value=0, max_value=12), min_size=12, max_size=12),
    capped=st.booleans(),
    full=st.booleans(),
    columns=st.booleans(),
)
def test_the_admitter_decides_as_without_the_sure_admission(  # noqa: PLR0917
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int, str, tuple[float | None, float | None, float | None], int]],
    scale: float,
    ahead: tuple[int, float],
    assume_full: bool,
    queued: list[int],
    capped: bool,
    full: bool,
    columns: bool,
) -> None:
    """`queued`: the requests waiting per step (ahead of it: on both sides of the free seats, and of the
    running requests); `full`: every endpoint's cap its running requests (few free seats); `columns`: the
    snapshots carry the fleet's columns (the ready endpoints and free seats read from them)."""
    if full:
        endpoints = [(max(1, min(cap, len(runs))), runs, coef) for cap, runs, coef in endpoints]
    params = SloFeasibilityParams(margin=1.0, retry_after_s=0.5, assume_full=assume_full, recheck="off")
    new = SloFeasibilityAdmitter(params, SLO, LoadCache(params.predict_params()))
    plain = _Plain(params, SLO, LoadCache(params.predict_params()))
    views = tuple(_ahead(_view(k, e), ahead[0], ahead[1], capped=capped) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    now = NOW
    for serial, (dt_ms, at, what, cls, targets, _) in enumerate(steps):
        now += dt_ms / 1000.0
        views, cols, _ = advance(views, cols, now, at=at, what=what, serial=serial)
        s = FleetSnapshot(now=now, endpoints=views, columns=cols if columns else None)
        r = step_request(serial, now, cls, targets, scale)

        def waiting(c: str, n: int = queued[serial]) -> int:
            return n if c == "chat" else n // 3

        assert new.admit(r, s, waiting) == plain.admit(r, s, waiting)


@settings(max_examples=300, deadline=None)
@given(
    endpoint=_endpoint,
    later_s=st.floats(min_value=0.0, max_value=60.0),
    ahead=st.tuples(st.sampled_from((0, 1, 2)), st.floats(min_value=0.001, max_value=2.0)),
)
def test_every_end_and_context_is_within_its_pace_bounds(
    endpoint: Endpoint, later_s: float, ahead: tuple[int, float]
) -> None:
    v = _ahead(_view(0, endpoint), ahead[0], ahead[1])
    params = SloFeasibilityParams().predict_params()
    for now in (NOW, NOW + later_s):
        load = EndpointLoad(v, now, params)
        ctx, ends = pace_bounds(v, load.pace)
        assert load.ctx_sum <= ctx
        assert len(ends) == load.n
        latest, counts = reports_behind(v)
        if latest <= now and counts:
            # each request's end at most the bound of some request: sorted, the i-th at most the i-th
            for got, bound in zip(sorted(load.seat_free), ends.tolist(), strict=True):
                assert got <= bound or math.isnan(bound)  # (NaN: no bound)


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=40),
    steps=st.lists(_step, min_size=1, max_size=12),
    ahead=st.tuples(st.sampled_from((0, 1, 3)), st.floats(min_value=0.001, max_value=2.0)),
    tpot_at=st.lists(st.integers(min_value=0, max_value=11), max_size=4),
)
def test_bounds_renewed_at_the_changed_places_are_those_made_whole(
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int, str, tuple[float | None, float | None, float | None], int]],
    ahead: tuple[int, float],
    tpot_at: list[int],
) -> None:
    """`LoadBounds.renew` replaces the ends and scalars of the places whose pace changed only (the rest
    kept from the last loads, the columns asked for at some steps only): bit for bit what bounds made
    whole from the same loads hold and answer."""
    params = SloFeasibilityParams(recheck="off")
    cache = LoadCache(params.predict_params())
    kept = LoadBounds()
    views = tuple(_ahead(_view(k, e), ahead[0], ahead[1]) for k, e in enumerate(endpoints))
    slowest = fleet_bound(FleetSnapshot(now=NOW, endpoints=views), ModelName("m"), slowest=True)
    assert slowest is not None
    now = NOW
    for serial, (dt_ms, at, what, *_) in enumerate(steps):
        now += dt_ms / 1000.0
        k = at % len(views)
        moved = changed(views[k], what, now, serial)
        if moved is not None:
            views = (*views[:k], moved, *views[k + 1 :])
        loads = cache.refs(list(views), now)
        kept.renew(loads)
        whole = LoadBounds()
        whole.renew(loads)
        assert kept.total == whole.total
        assert kept._flat.tobytes() == whole._flat.tobytes()
        assert kept._starts == whole._starts
        assert kept._late == whole._late
        for t in (0.0, 0.5, 5.0, math.inf):
            assert kept.within(t) == whole.within(t)
        if serial in tpot_at:  # the columns made at some steps and carried over by the later ones
            a, b = kept.tpot(slowest, 100.0, 50.0), whole.tpot(slowest, 100.0, 50.0)
            assert a == b or (math.isnan(a) and math.isnan(b))


def _array_ends(v: EndpointView, overhead: float, fresh: float) -> bytes:
    """`pace_bounds`' ends as arrays throughout (its form for any operands), as bytes."""
    caps = [math.inf if r.max_tokens is None else float(r.max_tokens) for r in v.running]
    c = v.perf or default_prior()
    n = len(caps)
    ctx = 0.0
    for r, cap in zip(v.running, caps, strict=True):
        ctx += r.prompt_tokens + cap
    floor = _floor_of
    tpot = floor(floor(floor(c.k2 * floor(ctx / n) + c.c2) * n + c.c3) * (1.0 + overhead))
    with np.errstate(invalid="ignore"):
        ends = np.maximum(np.array(caps), 0.0) * tpot + floor(c.k1 * fresh + c.c1)
    ends.sort()
    return bytes(ends.tobytes())


def _floor_of(x: float) -> float:
    return x if x >= 0.0 else 0.0 if x < 0.0 else math.inf


@settings(max_examples=300, deadline=None)
@given(endpoint=_endpoint, capped=st.booleans(), coef=st.sampled_from((0.0, 1e-9, 1.0, 1e300, math.inf)))
def test_the_ends_bounds_are_those_of_the_array_form(endpoint: Endpoint, capped: bool, coef: float) -> None:
    """`pace_bounds` derives a few running requests' ends one by one: the same bits as the array form,
    whatever the caps (none: infinite) and coefficients (a zero or infinite per-token time or prefill
    takes the array form)."""
    v = _ahead(_view(0, endpoint), 0, 1.0, capped=capped)
    if not v.running:
        return
    c = v.perf or default_prior()
    v = dataclasses.replace(
        v,
        estimates=EndpointEstimates(
            perf=dataclasses.replace(c, k2=c.k2 * coef, c2=c.c2 * coef, c3=c.c3 * coef)
        ),
    )
    pace = EndpointLoad(v, NOW, SloFeasibilityParams().predict_params()).pace
    _, ends = pace_bounds(v, pace)
    fresh = 0.0
    for f in pace.fresh:
        fresh += f
    assert ends.tobytes() == _array_ends(v, pace.overhead, fresh)
