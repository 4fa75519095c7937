"""Best fit's sure misses (`best_fit_bounds`): every endpoint they name is one the exact test rejects in
both forms, and the filter chooses with them what it chooses trying every endpoint (hypothesis: random
fleets, some with running requests close to their deadlines, requests and parameters, as the columnar
pinning tests draw them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.columns import columns_of
from gateway.sched.loads import LoadCache
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.placement import best_fit, best_fit_bounds
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.plugins.placement.best_fit_bounds import sure_misses
from gateway.sched.plugins.placement.best_fit_order import holders_first
from gateway.sched.profile import eligible
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from tests.unit.slo_fixtures import COEF, SLOW
from tests.unit.test_sched_columns_slo import NOW, Run, _endpoint, _new_request, _params, _view

Endpoint = tuple[int, list[Run], PerfCoefficients, float | None, bool]

# Running requests close to their deadlines: a new request's prefill pause breaks some of them.
_tight_run = st.tuples(
    st.integers(min_value=1, max_value=3000),  # prompt
    st.floats(min_value=1.0, max_value=40.0),  # predicted output
    st.floats(min_value=0.0, max_value=0.5),  # age
    st.one_of(st.none(), st.floats(min_value=0.05, max_value=1.0)),  # first-token deadline from now
    st.one_of(st.none(), st.floats(min_value=0.3, max_value=2.0)),  # last-token deadline from now
    st.one_of(st.none(), st.floats(min_value=0.005, max_value=0.05)),  # inter-token target
)
_tight_endpoint = st.tuples(
    st.integers(min_value=1, max_value=6),
    st.lists(_tight_run, max_size=6),
    st.sampled_from((COEF, SLOW)),
    st.one_of(st.none(), st.floats(min_value=2000.0, max_value=40000.0)),
    st.just(True),
)
_endpoints = st.lists(st.one_of(_endpoint, _tight_endpoint), min_size=1, max_size=12)

_request = st.tuples(
    st.integers(min_value=1, max_value=4000),  # prompt
    st.floats(min_value=1.0, max_value=400.0),  # predicted output
    st.one_of(st.none(), st.floats(min_value=50.0, max_value=5000.0)),  # TTFT target (ms)
    st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),  # E2E target (ms)
    st.one_of(st.none(), st.floats(min_value=5.0, max_value=200.0)),  # ITL target (ms)
    st.dictionaries(st.integers(min_value=0, max_value=11), st.integers(min_value=1, max_value=3000)),
    st.booleans(),  # best effort
)


def _case(endpoints: list[Endpoint], request: tuple) -> tuple[FleetSnapshot, object]:  # type: ignore[type-arg]
    prompt, out, ttft_ms, e2e_ms, itl_ms, cached, best_effort = request
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), cached, best_effort=best_effort)
    return FleetSnapshot(now=NOW, endpoints=views, columns=columns_of(views)), r


@settings(max_examples=400, deadline=None)
@given(endpoints=_endpoints, params=_params, request=_request)
def test_a_sure_miss_fits_in_neither_form(
    *,
    endpoints: list[Endpoint],
    params: BestFitParams,
    request: tuple,  # type: ignore[type-arg]
) -> None:
    s, r = _case(endpoints, request)
    f = BestFitFilter(params)
    loads = [f._cache.load(e, s.now) for e in s.endpoints]
    for load, miss in zip(loads, sure_misses(f, loads, r), strict=True):  # type: ignore[arg-type]
        if miss:
            assert f.fits_both(load, r) == (False, False)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(endpoints=_endpoints, params=_params, request=_request, eager=st.integers(0, 3))
def test_best_fit_chooses_with_sure_misses_what_it_chooses_trying_every_endpoint(
    *,
    endpoints: list[Endpoint],
    params: BestFitParams,
    request: tuple,  # type: ignore[type-arg]
    eager: int,
) -> None:
    s, r = _case(endpoints, request)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(best_fit, "MIN_CANDIDATES", 10**9)
        every = BestFitFilter(params).filter(r, eligible(r, s), s)  # type: ignore[arg-type]
        mp.setattr(best_fit, "MIN_CANDIDATES", 1)
        mp.setattr(best_fit, "EAGER_TRIES", eager)  # the sure misses found after this many tries
        bounded = BestFitFilter(params).filter(r, eligible(r, s), s)  # type: ignore[arg-type]
    assert [v.id for v in bounded] == [v.id for v in every]


@settings(max_examples=200, deadline=None)
@given(endpoints=_endpoints, params=_params, request=_request)
def test_a_kv_overflow_at_the_first_iteration_is_a_sure_miss(
    *,
    endpoints: list[Endpoint],
    params: BestFitParams,
    request: tuple,  # type: ignore[type-arg]
) -> None:
    """(e)'s bound names every endpoint with free seats whose KV footprint at the request's first
    iteration (every running request and it at their context) is over the capacity by more than the
    rounding margin: the batch backlog's requests that fit nowhere are mostly these."""
    s, r = _case(endpoints, request)
    f = BestFitFilter(params)
    loads = [f._cache.load(e, s.now) for e in s.endpoints]
    for load, miss in zip(loads, sure_misses(f, loads, r), strict=True):  # type: ignore[arg-type]
        cap = load.kv_capacity
        if cap is None or not 0 < load.n < load.seats:
            continue
        start = load.coef.h * (sum(x.context for x in load.running) + r.prompt_tokens)  # type: ignore[attr-defined]
        start += (load.n + 1) * load.coef.j
        if start > cap * (1 + 1e-6):
            assert miss
            assert f.fits_both(load, r) == (False, False)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    endpoints=_endpoints,
    params=_params,
    request=_request,
    pick=st.lists(st.integers(0, 11), min_size=1, max_size=12),
    swaps=st.lists(st.sets(st.integers(0, 11), max_size=3), min_size=1, max_size=5),
)
def test_sure_misses_on_kept_numbers_are_those_on_numbers_made_anew(
    *,
    endpoints: list[Endpoint],
    params: BestFitParams,
    request: tuple,  # type: ignore[type-arg]
    pick: list[int],
    swaps: list[set[int]],
) -> None:
    """The loads' numbers kept from one look to the next (`_numbers`: given again for the same loads,
    brought up to date where some are new) name what numbers made anew for each look name."""
    s, r = _case(endpoints, request)
    f = BestFitFilter(params)
    every = [f._cache.load(e, s.now) for e in s.endpoints]
    for swapped in [set(), *swaps]:
        # the same places each look, a few of them another endpoint's load than at the first look
        loads = [every[(i + (j in swapped)) % len(every)] for j, i in enumerate(pick)]
        rows = np.array([best_fit_bounds._row(f, x) for x in loads]).reshape(len(loads), 14)
        kv = np.array([best_fit_bounds._kv(x) for x in loads]).reshape(len(loads), 3)
        fresh: np.ndarray | float = float(resume_prompt_tokens(r))  # type: ignore[arg-type]
        if r.cached:  # type: ignore[attr-defined]
            fresh = np.array([float(prefill_tokens(r, x.view.id)) for x in loads])  # type: ignore[arg-type]
        want = best_fit_bounds.sure_misses_of(f, rows, r, fresh, kv)  # type: ignore[arg-type]
        assert sure_misses(f, loads, r) == want  # type: ignore[arg-type]
        kept_rows, kept_kv = best_fit_bounds._numbers(f, loads)
        assert np.array_equal(kept_rows, rows, equal_nan=True)
        assert np.array_equal(kept_kv, kv, equal_nan=True)


@settings(max_examples=400, deadline=None)
@given(endpoints=_endpoints, params=_params, request=_request)
def test_a_sure_miss_with_the_reserve_does_not_fit_with_it(
    *,
    endpoints: list[Endpoint],
    params: BestFitParams,
    request: tuple,  # type: ignore[type-arg]
) -> None:
    """`sure_misses_both`' second answer: every endpoint it names fails `fits_both`'s first test (with
    the θ reserve), and it names every sure miss."""
    s, r = _case(endpoints, request)
    f = BestFitFilter(params)
    loads = [f._cache.load(e, s.now) for e in s.endpoints]
    rows, kv = best_fit_bounds._numbers(f, loads)
    fresh = float(resume_prompt_tokens(r))  # type: ignore[arg-type]
    if r.cached:  # type: ignore[attr-defined]
        fresh = np.array([float(prefill_tokens(r, load.view.id)) for load in loads])  # type: ignore[arg-type, assignment]
    misses, strict = best_fit_bounds.sure_misses_both(f, rows, r, fresh, kv)  # type: ignore[arg-type]
    for load, miss, no_strict in zip(loads, misses, strict, strict=True):
        assert no_strict or not miss
        if no_strict:
            assert not f.fits_both(load, r)[0]  # type: ignore[arg-type]


# Fleets with at least as many busy endpoints as the rows are judged from, requests with tight targets:
# the reserve fails on many endpoints, so best fit passes over them and tries them only if none fits
# with it.
_busy_endpoints = st.lists(
    st.tuples(
        st.integers(min_value=2, max_value=8),
        st.lists(_tight_run, min_size=1, max_size=4),
        st.sampled_from((COEF, SLOW)),
        st.one_of(st.none(), st.floats(min_value=2000.0, max_value=40000.0)),
        st.just(True),
    ),
    min_size=8,
    max_size=20,
)
_tight_request = st.tuples(
    st.integers(min_value=1, max_value=4000),
    st.floats(min_value=1.0, max_value=400.0),
    st.one_of(st.none(), st.floats(min_value=50.0, max_value=1500.0)),
    st.floats(min_value=300.0, max_value=8000.0),
    st.none(),
    st.just({}),
    st.just(False),
)


# ... and a wide reserve (θ down to 0.3), so that an endpoint fits without it and not with it often.
_wide_params = st.builds(
    BestFitParams,
    gamma=st.sampled_from((0.0, 0.5, 1.0)),
    theta=st.sampled_from((0.3, 0.5, 0.8, 1.0)),
    rebalance_threshold=st.sampled_from((None, 0.0, 0.5)),
    order=st.sampled_from(("most-loaded", "least-loaded")),
    deadlines=st.booleans(),
)


def _idle_at(endpoints: list[Endpoint], idle: list[int]) -> list[Endpoint]:
    """`endpoints` with those at `idle` running nothing."""
    return [(c, [] if k in idle else runs, coef, kv, t) for k, (c, runs, coef, kv, t) in enumerate(endpoints)]


@settings(max_examples=200, deadline=None)
@given(
    endpoints=_busy_endpoints,
    params=_wide_params,
    request=_tight_request,
    eager=st.integers(0, 3),
    idle=st.lists(st.integers(min_value=0, max_value=19), max_size=2),
)
def test_best_fit_passing_over_sure_misses_of_the_reserve_chooses_as_trying_every_one(
    *,
    endpoints: list[Endpoint],
    params: BestFitParams,
    request: tuple,  # type: ignore[type-arg]
    eager: int,
    idle: list[int],
) -> None:
    """The plain way and over columns, with the sure misses (in both forms and with the reserve) found
    after `eager` tries, best fit takes the endpoint it takes trying every endpoint the plain way."""
    s, r = _case(_idle_at(endpoints, idle), request)
    cols = s.columns
    assert cols is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(best_fit, "MIN_CANDIDATES", 10**9)
        every = BestFitFilter(params).filter(r, eligible(r, s), s)  # type: ignore[arg-type]
        mp.setattr(best_fit, "MIN_CANDIDATES", 1)
        mp.setattr(best_fit, "EAGER_TRIES", eager)
        bounded = BestFitFilter(params).filter(r, eligible(r, s), s)  # type: ignore[arg-type]
        f = BestFitFilter(params)
        f._fleet.least = 1
        mask = f.filter_columns(r, cols, cols.eligible(r.model), s)  # type: ignore[arg-type, attr-defined]
    want = [v.id for v in every]
    assert [v.id for v in bounded] == want
    assert [v.id for v, m in zip(s.endpoints, mask.tolist(), strict=True) if m] == want


def _sorted_choice(f: BestFitFilter, r: SchedRequest, views: Sequence[EndpointView]) -> list[str]:
    """Best fit's choice as it is defined: every candidate's load sorted by its order (holders of the
    request's prefix first), the first that fits with the reserve, else the first in the spreading order
    that fits without it; no sure misses, no keys kept, (e) from the exact peak."""
    cache = LoadCache(f.load_params)
    loads = [cache.load(v, NOW) for v in views]
    spread = sorted(loads, key=f._spread_key)
    tried = sorted(loads, key=f.order_key) if f.packs else spread
    if r.cached:
        tried = holders_first(r, tried)
    for load in tried:
        if f.fits_both(load, r)[0]:
            return [load.view.id]
    for load in spread:
        if f.fits_both(load, r)[1]:
            return [load.view.id]
    return []


@settings(max_examples=300, deadline=None)
@given(endpoints=_endpoints, params=_params, requests=st.lists(_request, min_size=1, max_size=4))
def test_best_fit_chooses_as_sorting_every_candidate_with_the_exact_kv_peak(
    *,
    endpoints: list[Endpoint],
    params: BestFitParams,
    requests: list[tuple],  # type: ignore[type-arg]
) -> None:
    """The plain way (the first tried found as the least key, the keys kept on each load and asked
    again by the next requests, (e)'s sure pass) takes the endpoint the definition takes."""
    f = BestFitFilter(params)
    for request in requests:
        s, r = _case(endpoints, request)
        assert isinstance(r, SchedRequest)
        s = FleetSnapshot(
            now=NOW, endpoints=s.endpoints
        )  # (one fleet, its loads reused request after request)
        candidates = list(eligible(r, s))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(best_fit, "MIN_CANDIDATES", 10**9)
            mp.setattr(best_fit, "surely_under", lambda *_, **__: False)
            want = _sorted_choice(BestFitFilter(params), r, candidates)
            mp.undo()
            mp.setattr(best_fit, "MIN_CANDIDATES", 10**9)
            got = f.filter(r, candidates, s)
        assert [v.id for v in got] == want
