"""The loads as arrays (`FleetLoads`) give each endpoint the verdicts its load gives one by one
(hypothesis: random fleets with running requests that have targets, progress reports, max_tokens,
fitted coefficients; requests with and without targets and cached prefixes; every margin and on_track),
and the overflow guard over columns keeps what its plain form keeps while the fleet changes under a
shared load cache: time passing within and past the loads' reuse time, progress reports, dispatches and
completions, columns carried by updates."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Literal
from unittest import mock

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched import fleet_loads as fleet_loads_module
from gateway.sched.columns import columns_of
from gateway.sched.fleet_loads import _E2E, _SCALARS, FleetLoads, fleet_loads
from gateway.sched.harms import endangers, terms_of
from gateway.sched.joining import join_delays
from gateway.sched.load_batch_small import WRITE_SMALL
from gateway.sched.loads import LoadCache
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.plugins.placement.best_fit_bounds import _row
from gateway.sched.plugins.placement.overflow_guard import OverflowGuardFilter, OverflowGuardParams
from gateway.sched.predict import PredictParams
from gateway.sched.profile import eligible
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetColumns, FleetSnapshot
from gateway.sched.targets import itl_ok, meets, time_left
from tests.unit.fleet_steps import (
    COEFS,
    ENDPOINT,
    NEW_REQUEST,
    NOW,
    RUN,
    STEP,
    TARGETS,
    Endpoint,
    Run,
    advance,
    columnar_policy,
    new_request,
    view_of,
)
from tests.unit.slo_fixtures import COEF, SLOW


def _check(  # noqa: PLR0917 (a test helper)
    fleet: FleetLoads,
    cache: LoadCache,
    r: SchedRequest,
    cols: FleetColumns,
    which: npt.NDArray[np.bool_],
    now: float,
    harm: tuple[float, float, bool],
) -> None:
    """`judge`'s verdicts, and the numbers it compares bit for bit, against the loads' one by one."""
    on_track, margin, worst_case = harm
    spared, keeps = fleet.judge(r, cols, which, now, worst_case=worst_case, on_track=on_track, margin=margin)
    idx = np.flatnonzero(which)
    (first, pause, per_iter, delay), (ttft, e2e, tpot) = fleet.numbers(
        r, cols, which, now, worst_case=worst_case
    )
    left = time_left(r, now)
    for k, i in enumerate(idx.tolist()):
        load = cache.load(cols.endpoints[i], now)
        assert bool(spared[k]) == (not endangers(load, r, margin=margin, on_track=on_track))
        pred = load.predict(r, worst_case=worst_case)
        assert bool(keeps[k]) == (meets(pred, left, margin) and itl_ok(r, pred))
        joins = join_delays(load, r)
        assert (first[k], pause[k], per_iter[k]) == (joins.first, joins.pause, joins.per_iter)
        for j, s in enumerate(load.running):
            assert (
                delay[k, j]
                == (joins.pause if s.prefilled else joins.first)
                + min(s.remaining, joins.out) * joins.per_iter
            )
        assert (ttft[k], e2e[k], tpot[k]) == (pred.ttft_s, pred.e2e_s, pred.tpot_s)
        # the harm terms kept, as `harms` derives them for the load
        terms = terms_of(load, on_track, margin)
        j = fleet._keys.index((on_track, margin))
        ttft_b, itl_b = fleet._table[i, _SCALARS + 2 * j : _SCALARS + 2 * j + 2].tolist()
        assert (ttft_b, itl_b) == (
            math.inf if terms.ttft is None else terms.ttft,
            math.inf if terms.itl is None else terms.itl,
        )
        e2e_b = fleet._per[_E2E + j, i].tolist()
        assert sorted(b for b in e2e_b if b < math.inf) == sorted(b for _, _, b in terms.e2e)


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    **NEW_REQUEST,
    margin=st.sampled_from((0.5, 0.9, 1.0, 1.5)),
    on_track=st.sampled_from((0.0, 0.2, 0.8)),
    worst_case=st.booleans(),
    tail=st.sampled_from(("mean", "normal")),
)
def test_every_endpoint_is_judged_as_its_load_judges_it(
    *,
    endpoints: list[Endpoint],
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    margin: float,
    on_track: float,
    worst_case: bool,
    tail: str,
) -> None:
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    r = new_request(prompt, out, targets, cached)
    cols = columns_of(views)
    cache = LoadCache(PredictParams(tail="normal" if tail == "normal" else "mean", prefill_overhead=0.05))
    fleet = fleet_loads(cache)
    fleet.want(on_track, margin)
    which = np.ones(len(views), dtype=np.bool_)
    which[0] = False  # not every endpoint asked about
    _check(fleet, cache, r, cols, which, NOW, (on_track, margin, worst_case))


@settings(max_examples=150, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=1, max_size=12),
    **NEW_REQUEST,
    plain_first=st.lists(st.booleans(), min_size=12, max_size=12),
    numpy_rows=st.booleans(),
)
def test_the_overflow_guard_over_columns_keeps_what_the_plain_filter_keeps_as_the_fleet_changes(
    *,
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int]],
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    plain_first: list[bool],
    numpy_rows: bool,
) -> None:
    """Over columns the guard keeps what the plain filter keeps, its rows written in Python floats or
    (`numpy_rows`) every batch through numpy's."""
    with mock.patch.object(fleet_loads_module, "WRITE_SMALL", 0 if numpy_rows else WRITE_SMALL):
        _guard_both_ways(endpoints, steps, new_request(prompt, out, targets, cached), plain_first)


def _guard_both_ways(
    endpoints: list[Endpoint], steps: list[tuple[int, int, int]], r: SchedRequest, plain_first: list[bool]
) -> None:
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    guard = OverflowGuardFilter(OverflowGuardParams(worst_case=False, prefill_overhead=0.05))
    guard._fleet.least = 1  # over the rows however few are busy
    now = NOW
    for serial, ((dt_ms, at, what), first) in enumerate(zip(steps, plain_first, strict=False)):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
        s = FleetSnapshot(now=now, endpoints=views, columns=cols)
        for plain_now in (first, not first):  # (both forms share the guard's load cache)
            if plain_now:
                plain = [v.id for v in guard.filter(r, eligible(r, s), s)]
            else:
                mask = guard.filter_columns(r, cols, cols.eligible(r.model), s)
                columnar = [v.id for v, m in zip(views, mask.tolist(), strict=True) if m]
        assert columnar == plain
        # the rows are those of the loads the cache hands out now
        which = cols.eligible(r.model) & (cols.busy > 0)
        _check(guard._fleet, guard._cache, r, cols, which, now, (0.0, 1.0, False))


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(("coding-assistant", "aladdin")),
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=1, max_size=12),
    requests=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=4000),
            st.floats(min_value=1.0, max_value=400.0),
            TARGETS,
            st.sampled_from(("generation", "translation", "summarization", "completion", "chat")),
        ),
        min_size=12,
        max_size=12,
    ),
    plain_first=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_slo_presets_place_over_columns_as_the_plain_way_as_the_fleet_changes(
    *,
    name: str,
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int]],
    requests: list[tuple[int, float, tuple[float | None, float | None, float | None], str]],
    plain_first: list[bool],
) -> None:
    """One policy (its load caches shared by both forms) places a request per step both ways."""
    policy = columnar_policy(name)
    assert policy.profile.columnar
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    now = NOW
    for serial, ((dt_ms, at, what), first, (prompt, out, targets, cls)) in enumerate(
        zip(steps, plain_first, requests, strict=False)
    ):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
        r = new_request(prompt, out, targets, {}, now=now, name=f"r{serial}", cls=cls)
        bare = FleetSnapshot(now=now, endpoints=views)
        with_columns = FleetSnapshot(now=now, endpoints=views, columns=cols)
        got: dict[bool, str | None] = {}
        for plain_now in (first, not first):
            chosen = policy.profile.place(r, bare if plain_now else with_columns)
            got[plain_now] = None if chosen is None else chosen.id
        assert got[True] == got[False]


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(
        st.tuples(st.integers(min_value=1, max_value=24), st.lists(RUN, min_size=1, max_size=24), COEFS),
        min_size=1,
        max_size=8,
    ),
    kv=st.lists(
        st.one_of(st.none(), st.just(0.0), st.floats(min_value=2000.0, max_value=40000.0)),
        min_size=8,
        max_size=8,
    ),
    params=st.builds(
        BestFitParams,
        gamma=st.sampled_from((0.0, 0.5, 1.0)),
        order=st.sampled_from(("most-loaded", "least-loaded", "least-outstanding")),
        rebalance_threshold=st.sampled_from((None, 0.0, 0.5)),
    ),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    targets=TARGETS,
)
def test_best_fit_orders_busy_endpoints_over_their_arrays_as_over_their_loads(
    *,
    endpoints: list[Endpoint],
    kv: list[float | None],
    params: BestFitParams,
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
) -> None:
    views = tuple(
        dataclasses.replace(v, estimates=dataclasses.replace(v.estimates, kv_capacity_tokens=kv[k]))
        if v.estimates is not None
        else v
        for k, v in enumerate(view_of(k, e) for k, e in enumerate(endpoints))
    )
    cols = columns_of(views)
    s = FleetSnapshot(now=NOW, endpoints=views, columns=cols)
    f = BestFitFilter(params)
    fleet = fleet_loads(f._cache)
    fleet.least = 1
    which = np.ones(len(views), dtype=np.bool_)
    fleet.rows(cols, which, NOW)
    places = np.flatnonzero(which)
    n, seats, _, tokens, running_long = fleet.capacity(places, params.gamma)
    norms, demoted = f.capacity_norms(places), f.demoted(places)
    for i, v in enumerate(views):
        load = f._cache.load(v, NOW)
        got = (n[i], seats[i], tokens[i], running_long[i])
        assert got == (load.n, load.seats, f._tokens(load), load.running_long)
        assert (norms[i], bool(demoted[i])) == (f.capacity_norm(load), f.order_key(load)[0])
    rows = fleet.best_fit_rows(places, params.gamma)
    assert np.array_equal(rows, np.array([_row(f, f._cache.load(v, NOW)) for v in views]), equal_nan=True)
    r = new_request(prompt, out, targets, {})
    mask = f.filter_columns(r, cols, cols.eligible(r.model), s)
    plain = BestFitFilter(params).filter(r, eligible(r, s), s)
    assert [v.id for v, m in zip(views, mask.tolist(), strict=True) if m] == [v.id for v in plain]


@settings(max_examples=150, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=1, max_size=16),
    gamma=st.sampled_from((0.0, 0.5, 1.0)),
    kv_unknown=st.booleans(),
    numpy_rows=st.booleans(),
)
def test_capacity_norms_kept_per_row_are_those_of_the_loads_as_the_fleet_changes(
    *,
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int]],
    gamma: float,
    kv_unknown: bool,
    numpy_rows: bool,
) -> None:
    """The capacity norms kept per row (`FleetLoads.capacity_norms`: worked out as a row is written in
    Python floats, or when next asked for a numpy batch's rows) are, after every change of the fleet,
    `capacity_norm` of the loads the cache hands out: time passing within and past the reuse time,
    progress reports, dispatches, completions; rows written either way (`numpy_rows`: every batch
    through numpy's)."""
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    if kv_unknown:
        views = tuple(
            dataclasses.replace(v, estimates=dataclasses.replace(v.estimates, kv_capacity_tokens=None))
            if v.estimates is not None
            else v
            for v in views
        )
    cols = columns_of(views)
    f = BestFitFilter(BestFitParams(gamma=gamma, order="least-loaded"))
    fleet = fleet_loads(f._cache)
    now = NOW
    with mock.patch.object(fleet_loads_module, "WRITE_SMALL", 0 if numpy_rows else WRITE_SMALL):
        for serial, (dt_ms, at, what) in enumerate(steps):
            views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
            which = cols.busy > 0
            fleet.rows(cols, which, now)
            places = np.flatnonzero(which)
            loads = [f._cache.load(cols.endpoints[i], now) for i in places.tolist()]
            norms = f.capacity_norms(places).tolist()
            assert norms == [f.capacity_norm(load) for load in loads]


@pytest.mark.parametrize("seed", range(4))
def test_best_fit_over_columns_skips_the_sure_misses_of_a_large_busy_fleet_as_the_plain_filter_does(
    seed: int,
) -> None:
    """Fleets of 30 busy endpoints whose running requests have deadlines close enough that a newcomer
    often fits only past the first few endpoints in best fit's order (about a quarter of these): the
    columnar form then skips the sure misses found over the arrays, as the plain form does over the
    loads. (Seeded draws rather than hypothesis: its draws rarely reach that case.)"""
    rng = random.Random(seed)
    for _ in range(25):
        endpoints: list[Endpoint] = []
        for _ in range(30):
            cap = rng.randint(8, 16)
            runs: list[Run] = [
                (
                    rng.randint(1, 3000),
                    rng.uniform(1.0, 300.0),
                    rng.uniform(0.0, 5.0),
                    None,
                    rng.uniform(0.2, 8.0),
                    rng.choice((None, rng.uniform(0.01, 0.05))),
                    None,
                    None,
                    False,
                )
                for _ in range(rng.randint(1, 7))
            ]
            endpoints.append((cap, runs, rng.choice((COEF, SLOW))))
        views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
        cols = columns_of(views)
        s = FleetSnapshot(now=NOW, endpoints=views, columns=cols)
        order: Literal["most-loaded", "least-loaded", "least-outstanding"] = rng.choice(
            ("least-loaded", "most-loaded", "least-outstanding")
        )
        params = BestFitParams(gamma=0.5, theta=rng.choice((0.8, 1.0)), order=order, deadlines=True)
        targets = (rng.uniform(20.0, 600.0), rng.uniform(300.0, 6000.0), None)
        r = new_request(rng.randint(1, 4000), rng.uniform(1.0, 400.0), targets, {})
        mask = BestFitFilter(params).filter_columns(r, cols, cols.eligible(r.model), s)
        plain = BestFitFilter(params).filter(r, eligible(r, s), s)
        assert [v.id for v, m in zip(views, mask.tolist(), strict=True) if m] == [v.id for v in plain]
