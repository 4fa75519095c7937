"""The overflow guard's shortlist (`OverflowGuardParams.shortlist`): over columns, with no more busy
candidates than the shortlist it keeps what the guard without one keeps; with more, what that guard keeps
among the idle candidates and the busy ones judged `shortlist` at a time in `shortlist_order` (the holders
of part of the request's prompt first, then an estimate of best fit's capacity norm from the loads last
judged), up to the first of those where one keeps the request's targets (or, best effort, where it harms
no one), and the whole answer when there is none; the plain way, the whole guard's answer; and the
estimate of an endpoint just judged is best fit's capacity norm of its load (hypothesis: random fleets
changing step by step, requests with and without targets, cached prefixes and best effort)."""

from __future__ import annotations

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointId
from gateway.sched.columns import columns_of
from gateway.sched.loads import LoadCache
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.plugins.placement.overflow_guard import OverflowGuardFilter, OverflowGuardParams
from gateway.sched.profile import eligible
from gateway.sched.snapshot import FleetSnapshot
from tests.unit.fleet_steps import (
    ENDPOINT,
    NEW_REQUEST,
    NOW,
    STEP,
    Endpoint,
    advance,
    columnar_policy,
    new_request,
    place_run,
    view_of,
)


def _params(shortlist: int) -> OverflowGuardParams:
    return OverflowGuardParams(worst_case=False, prefill_overhead=0.05, shortlist=shortlist)


def _guard(shortlist: int, least: int = 1, cache: LoadCache | None = None) -> OverflowGuardFilter:
    guard = OverflowGuardFilter(_params(shortlist), cache)
    guard._fleet.least = least
    return guard


def _ids(views: tuple, mask: np.ndarray) -> list[EndpointId]:  # type: ignore[type-arg]
    return [v.id for v, m in zip(views, mask.tolist(), strict=True) if m]


@settings(max_examples=150, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=1, max_size=12),
    **NEW_REQUEST,
    best_effort=st.booleans(),
    size=st.integers(min_value=1, max_value=4),
    least=st.sampled_from((1, 17)),
)
def test_a_shortlist_keeps_what_the_whole_guard_keeps_on_the_blocks_it_judges(
    *,
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int]],
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    best_effort: bool,
    size: int,
    least: int,
) -> None:
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    cache = LoadCache(_params(0).predict_params())
    short = _guard(size, least, cache)  # (least 1: over the rows however few are busy; 17: one by one)
    whole = _guard(0, least, cache)  # the same loads and rows (one cache)
    few = _guard(size, least, cache)  # its answer as views where the shortlist acts (its own rank)
    r = new_request(prompt, out, targets, cached, best_effort=best_effort)
    now = NOW
    for serial, (dt_ms, at, what) in enumerate(steps):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
        s = FleetSnapshot(now=now, endpoints=views, columns=cols)
        cands = cols.eligible(r.model)
        busy = cands & (cols.busy > 0)
        for eid in r.cached:
            i = cols.index.get(eid)
            if i is not None and cands[i]:
                busy[i] = True
        places = busy.nonzero()[0]
        order = short.shortlist_order(r, cols, places).tolist()  # (read before the rows are brought up)
        assert sorted(order) == places.tolist()
        held = [i for i in order if views[i].id in r.cached]
        assert order[: len(held)] == held  # the holders of part of its prompt first
        got = _ids(views, short.filter_columns(r, cols, cands, s))
        as_views = few.filter_columns_few(r, cols, cands, s)
        if isinstance(as_views, list):  # (a shortlist acted: the same candidates, as views)
            assert len(places) > size
            assert sorted(v.id for v in as_views) == sorted(got)
        else:
            assert len(places) <= size
            assert _ids(views, as_views) == got
        harmless, meeting = whole._judge_columns(r, cols, cands, s)
        expected = _ids(views, whole.filter_columns(r, cols, cands, s))
        if len(places) > size:
            answer = harmless if best_effort else meeting
            judged = cands & ~busy
            for k in range(0, len(order), size):
                judged[order[k : k + size]] = True
                if np.count_nonzero(answer & judged):
                    break
            if np.count_nonzero(answer & judged):  # (the whole guard's filter, on those judged)
                none_meet = best_effort or not np.count_nonzero(meeting & judged)
                kept = (harmless if none_meet else meeting) & judged
                expected = _ids(views, kept)
        assert got == expected


@settings(max_examples=100, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=1, max_size=8),
    **NEW_REQUEST,
    best_effort=st.booleans(),
    size=st.integers(min_value=1, max_value=4),
)
def test_a_shortlisted_guard_judges_every_candidate_the_plain_way(
    *,
    endpoints: list[Endpoint],
    steps: list[tuple[int, int, int]],
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    best_effort: bool,
    size: int,
) -> None:
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    short, whole = _guard(size), _guard(0)  # (a cache each, asked alike)
    r = new_request(prompt, out, targets, cached, best_effort=best_effort)
    now = NOW
    for serial, (dt_ms, at, what) in enumerate(steps):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
        s = FleetSnapshot(now=now, endpoints=views, columns=cols)
        got = [v.id for v in short.filter(r, eligible(r, s), s)]
        assert got == [v.id for v in whole.filter(r, eligible(r, s), s)]


@settings(max_examples=100, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=1, max_size=8),
    steps=st.lists(STEP, min_size=0, max_size=8),
    least=st.sampled_from((1, 17)),
)
def test_the_shortlist_ranks_by_the_capacity_norm_best_fit_orders_by(
    *, endpoints: list[Endpoint], steps: list[tuple[int, int, int]], least: int
) -> None:
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    guard = _guard(1, least)
    fit = BestFitFilter(BestFitParams(gamma=0.5, prefill_overhead=0.05), guard._cache)
    now = NOW
    for serial, (dt_ms, at, what) in enumerate(steps):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
    places = (cols.busy > 0).nonzero()[0]
    assert (guard._rank.keys(cols, places) == -np.inf).all()  # never judged: first
    r = new_request(100, 50.0, (None, None, None), {}, best_effort=False, now=now)
    s = FleetSnapshot(now=now, endpoints=views, columns=cols)
    guard.filter_columns(r, cols, cols.eligible(r.model), s)
    keys = guard._rank.keys(cols, places)
    judged = np.isfinite(keys)  # (kept only from the blocks judged, when more than one is busy)
    assert judged.any() or np.count_nonzero(cols.eligible(r.model) & (cols.busy > 0)) <= 1
    for i, key in zip(places[judged].tolist(), keys[judged].tolist(), strict=True):
        norm = fit.capacity_norm(guard._cache.load(views[i], now))
        assert abs(key - norm) <= 1e-9 * max(1.0, norm)


def _run(
    endpoints: list[Endpoint], steps: list[tuple[int, int, int]], size: int, *, hand_over: bool
) -> list[str | None]:
    """A run of `coding-assistant` over columns (busy endpoints over the loads' rows however few) with a
    shortlist of `size`, on a fleet of its own: per step the fleet changes, a request is placed and
    dispatched where it was placed. `hand_over`: the guard answers a shortlist's survivors as views
    (the rest of the placement the plain way), else as a mask (the rest over columns)."""
    policy = columnar_policy("coding-assistant")
    guards = [f for f in policy.profile.filters if isinstance(f, OverflowGuardFilter)]
    assert len(guards) == 1
    guard = guards[0]
    guard.params = msgspec.structs.replace(guard.params, shortlist=size)
    guard.hand_over = hand_over
    return place_run(policy, endpoints, steps)


@settings(max_examples=80, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=2, max_size=8),
    steps=st.lists(STEP, min_size=4, max_size=24),
    size=st.integers(min_value=1, max_value=3),
)
def test_a_shortlist_handing_its_survivors_to_the_plain_rest_of_the_placement_makes_the_same_choices(
    *, endpoints: list[Endpoint], steps: list[tuple[int, int, int]], size: int
) -> None:
    """Two runs of the same sequence, each with load caches of its own: the guard's shortlisted
    survivors handed over as views (best fit and the picker in their plain forms over them, no rows
    written for the blocks) or as a mask (best fit over the loads' rows): the same choice at every
    step, and the same loads asked of the cache (the runs would part otherwise)."""
    assert _run(endpoints, steps, size, hand_over=True) == _run(endpoints, steps, size, hand_over=False)
