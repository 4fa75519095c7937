"""Loads derived again after progress reports give `EndpointLoad`'s numbers (the running requests' rows
kept with the load's pace, only the reported ones rewritten: `gateway.sched.load_batch`), and a whole run
over columns makes the plain run's choices (a load's reuse time is its endpoint's: `loads.reuse_s`)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.columns import columns_of
from gateway.sched.fleet_loads import fleet_loads
from gateway.sched.load_batch import Pending, derive
from gateway.sched.load_terms import pace_for
from gateway.sched.loads import LoadCache
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.profile import Policy
from gateway.sched.running import with_progress
from tests.unit.fleet_steps import (
    ENDPOINT,
    NOW,
    STEP,
    Endpoint,
    advance,
    columnar_policy,
    place_run,
    view_of,
)
from tests.unit.slo_fixtures import COEF, columnar_preset


@settings(max_examples=150, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    reports=st.lists(
        st.tuples(st.integers(min_value=0, max_value=7), st.integers(min_value=0, max_value=23)),
        min_size=1,
        max_size=10,
    ),
    back=st.booleans(),
)
def test_loads_derived_again_after_progress_reports_are_the_loads_made_one_by_one(
    *, endpoints: list[Endpoint], reports: list[tuple[int, int]], back: bool
) -> None:
    """A load remade for its age keeps its pace (`pace_for`), and with it the running requests' rows
    (`load_batch._Rows`): only the progress of the requests that reported since is rewritten. The
    numbers stay the ones `EndpointLoad` makes, including for an older view asked for again (`back`)."""
    params = PredictParams(tail="normal", prefill_overhead=0.05)
    views = [view_of(k, e) for k, e in enumerate(endpoints)]
    first = [pace_for(v, v.perf or COEF, params, None) for v in views]
    derive([(v, NOW, p) for v, p in zip(views, first, strict=True)], params, [(0.0, 1.0)])
    later = list(views)
    for serial, (at, j) in enumerate(reports):
        k = at % len(later)
        rs = list(later[k].running)
        if rs:
            r = rs[j % len(rs)]
            rs[j % len(rs)] = with_progress(
                r, (r.produced or 0) + 16, r.first_token_at or NOW - 0.2, NOW + serial / 1e3
            )
            later[k] = dataclasses.replace(later[k], running=tuple(rs))
    asked = views if back else later
    if back:  # the newer views first, then the older ones again
        derive([(v, NOW + 0.03, p) for v, p in zip(later, first, strict=True)], params, [(0.0, 1.0)])
    paces = [
        pace_for(v, v.perf or COEF, params, Pending(old, NOW, params, p))
        for v, old, p in zip(asked, views, first, strict=True)
    ]
    assert all(p is q for p, q in zip(paces, first, strict=True))  # (the pace, and its rows, kept)
    now = NOW + 0.05
    got = derive([(v, now, p) for v, p in zip(asked, paces, strict=True)], params, [(0.0, 1.0)])
    for i, (v, p) in enumerate(zip(asked, paces, strict=True)):
        load = EndpointLoad(v, now, params, pace=p)
        assert (got.n[i], got.wait_s[i], got.pending_prompt[i], got.ctx_sum[i], got.tpot_now[i]) == (
            load.n,
            load.wait_s,
            load.pending_prompt,
            load.ctx_sum,
            load.tpot_now,
        )
        assert got.running_long[i] == load.running_long
        assert got.remaining_total[i] == load.remaining_total()
        assert sorted(got.finish[i, : load.n].tolist()) == load.seat_free
        for j, s in enumerate(load.running):
            assert (bool(got.prefilled[i, j]), got.context[i, j], got.remaining[i, j]) == (
                s.prefilled,
                s.context,
                s.remaining,
            )


def _place_run(
    name: str, endpoints: list[Endpoint], steps: list[tuple[int, int, int]], columns: bool
) -> list[str | None]:
    """A run of one policy on a fleet of its own, over columns or the plain way (`place_run`)."""
    return place_run(columnar_policy(name) if columns else _plain(name), endpoints, steps, columns=columns)


def _plain(name: str) -> Policy:
    """The shipped preset, never placing over columns."""
    policy = columnar_preset(name)
    return dataclasses.replace(policy, profile=dataclasses.replace(policy.profile, columns_from=1 << 30))


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(("coding-assistant", "aladdin")),
    endpoints=st.lists(ENDPOINT, min_size=2, max_size=8),
    steps=st.lists(STEP, min_size=4, max_size=24),
)
def test_a_columnar_run_and_a_plain_run_make_the_same_choices(
    *, name: str, endpoints: list[Endpoint], steps: list[tuple[int, int, int]]
) -> None:
    """Two runs of the same sequence, each with load caches of its own, one over columns and one the
    plain way: the same choice at every step. The columnar path makes no load for an idle endpoint, so
    this holds only because a load's reuse time is the endpoint's (`loads.reuse_s`), not set by the
    order loads are made in."""
    assert _place_run(name, endpoints, steps, columns=True) == _place_run(
        name, endpoints, steps, columns=False
    )


@settings(max_examples=150, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=1, max_size=16),
    plain=st.lists(
        st.one_of(st.none(), st.tuples(st.integers(min_value=0, max_value=7), st.integers(0, 50))),
        min_size=16,
        max_size=16,
    ),
    asked=st.lists(st.integers(min_value=0, max_value=255), min_size=16, max_size=16),
    whole=st.lists(st.booleans(), min_size=16, max_size=16),
)
def test_rows_not_asked_again_are_the_loads_the_cache_hands_out(
    *,
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int]],
    plain: list[tuple[int, int] | None],
    asked: list[int],
    whole: list[bool],
) -> None:
    """`FleetLoads.rows` asks the cache only about endpoints whose entry it wrote since, whose view is
    another, or whose load is past its reuse time: every row it skips is the load the cache would hand
    out, and asking the cache about it writes nothing (`LoadCache._ref`'s fast return). A plain plugin
    sharing the cache (`LoadCache.load`, here a load made at another time) remakes entries meanwhile.
    Columns made whole again for the same endpoints (`whole`: another index, equal) keep the rows."""
    cache = LoadCache(PredictParams(tail="normal", prefill_overhead=0.05))
    fleet = fleet_loads(cache)
    fleet.want(0.0, 1.0)
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    now = NOW
    for serial, ((dt_ms, at, what), other, bits, anew) in enumerate(
        zip(steps, plain, asked, whole, strict=False)
    ):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
        if anew:
            kept = list(fleet._refs)
            cols = columns_of(views)
            fleet.rows(cols, np.zeros(len(views), dtype=np.bool_), now)
            assert fleet._refs == kept or not kept  # (the same endpoints in the same places: kept)
        if other is not None:  # a plain plugin's load, made at this time or a little earlier
            k, back_ms = other
            cache.load(views[k % len(views)], now - back_ms / 1000.0)
        which = np.array([bool(bits >> (i % 8) & 1) for i in range(len(views))], dtype=np.bool_)
        fleet.rows(cols, which, now)
        assert cache.touched is not None
        cache.touched.clear()
        for i in np.flatnonzero(which).tolist():
            assert cache.refs([views[i]], now)[0] is fleet._refs[i]
        assert not cache.touched  # (nothing remade: every row was the cache's load)
        fleet._at = None  # (asked afresh at the next step even at the same clock)
