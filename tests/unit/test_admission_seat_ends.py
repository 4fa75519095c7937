"""`seat_ends.ends` gives every pending load's running requests' predicted ends bit for bit as its
`EndpointLoad` does (`seat_free`, unsorted), and as `load_batch.derive` does (hypothesis: random
endpoints with progress reports, max_tokens, deadlines, cached prefixes, the generic prior; each load at
its own time; the rows kept on a pace made by an earlier batch and brought up to date for later
progress reports, or carried over to a load remade for new coefficients)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.load_batch import Pending, derive
from gateway.sched.load_terms import pace_for
from gateway.sched.loads import REUSE_S, LoadCache
from gateway.sched.perf import default_prior
from gateway.sched.plugins.admission.seat_ends import ends
from gateway.sched.predict import EndpointLoad, PredictParams, Tail
from gateway.sched.running import RunningRequest, with_progress
from gateway.sched.snapshot import EndpointView
from tests.unit.slo_fixtures import COEF, SLOW, running, view

NOW = 50.0

_run = st.tuples(
    st.integers(min_value=1, max_value=3000),  # prompt
    st.floats(min_value=1.0, max_value=300.0),  # predicted output
    st.floats(min_value=0.0, max_value=8.0),  # age
    st.one_of(st.none(), st.integers(min_value=0, max_value=400)),  # tokens reported
    st.one_of(st.none(), st.integers(min_value=1, max_value=500)),  # max_tokens
    st.integers(min_value=0, max_value=2000),  # cached prompt tokens
)
Run = tuple[int, float, float, int | None, int | None, int]
_endpoint = st.tuples(
    st.lists(_run, min_size=1, max_size=12),
    st.sampled_from((COEF, SLOW, None)),  # None: the generic prior
    st.floats(min_value=0.0, max_value=0.2),  # the load's time after NOW
)


def _running(name: str, run: Run) -> RunningRequest:
    p, o, age, reported, max_tokens, cached = run
    r = running(name, prompt=p, out=o, std=o / 3, dispatched_at=NOW - age, e2e_deadline=NOW + 5.0)
    r = dataclasses.replace(r, max_tokens=max_tokens, cached_tokens=cached)
    if reported is not None and age > 0.05:
        r = with_progress(r, reported, NOW - age + 0.05, NOW - age / 2)
    return r


def _view(k: int, runs: list[Run], coef: object) -> EndpointView:
    rs = [_running(f"e{k}-x{j}", run) for j, run in enumerate(runs)]
    v = view(f"e{k:02d}", cap=len(rs), runs=rs, coef=COEF if coef is None else coef)  # type: ignore[arg-type]
    return v if coef is not None else dataclasses.replace(v, estimates=None)


def _reported(v: EndpointView, step: int) -> EndpointView:
    """`v` with every other running request's progress reported again, later."""
    rs = tuple(
        with_progress(r, (r.produced or 0) + 16, r.first_token_at or NOW - 0.5, NOW + 0.01 * step)
        if j % 2 == 0
        else r
        for j, r in enumerate(v.running)
    )
    return dataclasses.replace(v, running=rs)


@settings(max_examples=150, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=12),
    tail=st.sampled_from(("mean", "normal", "cantelli")),
    overhead=st.sampled_from((0.0, 0.1)),
    warm=st.booleans(),
)
def test_ends_are_the_loads_own(
    endpoints: list[tuple[list[Run], object, float]], tail: Tail, overhead: float, warm: bool
) -> None:
    params = PredictParams(tail=tail, prefill_overhead=overhead)
    views = [_view(k, runs, coef) for k, (runs, coef, _) in enumerate(endpoints)]
    times = [NOW + dt for _, _, dt in endpoints]
    paces = [pace_for(v, v.perf or default_prior(), params, None) for v in views]
    if warm:
        # rows made on the paces by an earlier batch, then later progress reports
        derive(list(zip(views, times, paces, strict=True)), params, ())
        views = [_reported(v, k) for k, v in enumerate(views)]
    todo = [Pending(v, t, params, p) for v, t, p in zip(views, times, paces, strict=True)]
    got = ends(todo)
    derived = derive([(p.view, p.now, p.pace) for p in todo], params, ()).finish
    for i, (p, arr) in enumerate(zip(todo, got, strict=True)):
        load = EndpointLoad(p.view, p.now, params, pace=p.pace)
        assert sorted(arr.tolist()) == load.seat_free
        assert np.array_equal(arr, derived[i, : p.n])


@settings(max_examples=100, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=10),
    refit=st.sampled_from((COEF, SLOW, None)),
    reported=st.booleans(),
)
def test_rows_carried_over_a_refit_give_the_loads_own_ends(
    endpoints: list[tuple[list[Run], object, float]], refit: object, reported: bool
) -> None:
    """A load remade for new coefficients (a refit) with the same running requests takes the rows of the
    last one over (`load_batch.carry_rows`): its ends are still its load's."""
    params = PredictParams()
    cache = LoadCache(params)
    views = [_view(k, runs, coef) for k, (runs, coef, _) in enumerate(endpoints)]
    first = cache.refs(views, NOW)
    todo = [p for p in first if isinstance(p, Pending)]
    ends(todo)  # the rows made on their paces
    # the same running requests (other objects), new coefficients, maybe later progress reports
    later = [_view(k, runs, refit) for k, (runs, _, _) in enumerate(endpoints)]
    if reported:
        later = [_reported(v, k) for k, v in enumerate(later)]
    refs = cache.refs(later, NOW + 2 * REUSE_S)  # past every reuse time
    again = [p for p in refs if isinstance(p, Pending)]
    assert len(again) == len(later)
    assert all(p.pace.arrays is not None for p in again)
    for p, arr in zip(again, ends(again), strict=True):
        assert sorted(arr.tolist()) == EndpointLoad(p.view, p.now, params, pace=p.pace).seat_free
