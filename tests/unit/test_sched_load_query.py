"""Per-candidate work of a placement done a cheaper way, pinned to the plain way: `LoadCache.loads` (the
list query best fit asks for its candidates, `load`'s fast path inline) against `load` asked per view,
two caches side by side through the same changes of a fleet; best fit's KV peak and running terms read
from a load's states against the running states they stand for."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.kv_peak import peak_kv
from gateway.sched.loads import REUSE_S, LoadCache
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.running import RunningRequest, with_progress
from gateway.sched.snapshot import EndpointView
from tests.unit.slo_fixtures import running, view

_ids = itertools.count()
_R = dataclasses.replace


def _run(k: int, at: float) -> RunningRequest:
    """A running request with or without targets (ITL among them), by `k`."""
    return running(
        f"r{next(_ids)}",
        dispatched_at=at,
        prompt=100 + 97 * (k % 7),
        out=20.0 + 31.0 * (k % 5),
        std=4.0 * (k % 3),
        ttft_deadline=at + 0.5 if k % 4 == 1 else None,
        e2e_deadline=at + 3.0 + k % 3 if k % 4 == 2 else None,
        itl_s=0.03 + 0.01 * (k % 2) if k % 3 == 0 else None,
        best_effort=k % 11 == 5,
    )


def _state(load: EndpointLoad) -> tuple[object, ...]:
    """A load's numbers."""
    return (
        load.view,
        load.now,
        load.n,
        load.wait_s,
        load.ctx_sum,
        load.tpot_now,
        load.pending_prompt,
        load.states,
    )


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(("same", "progress", "dispatch", "completion", "refs", "new-list")),
        st.integers(min_value=0, max_value=5),  # which endpoint
        st.floats(min_value=0.0, max_value=1.5 * REUSE_S),  # clock advance
    ),
    max_size=30,
)


def fleet_step(
    views: list[EndpointView], what: str, k: int, now: float, caches: Sequence[LoadCache]
) -> list[EndpointView]:
    """One of `_STEPS`' changes at `now`: endpoint `k`'s first running request reports progress, a
    request is dispatched to it or its first completes (`views` changed in place), or `refs` is asked of
    every cache (leaving pending loads); the candidates asked about then (the first `2 + k` views for a
    new list, else all)."""
    v = views[k]
    if what == "progress" and v.running:
        runs = list(v.running)
        runs[0] = with_progress(runs[0], 16, 0.1, now)
        views[k] = _R(v, running=tuple(runs))
    elif what == "dispatch" and len(v.running) < v.cap:
        views[k] = _R(v, running=(*v.running, _run(k + len(v.running), now)), inflight=v.inflight + 1)
    elif what == "completion" and v.running:
        views[k] = _R(v, running=v.running[1:], inflight=v.inflight - 1)
    elif what == "refs":
        for cache in caches:
            cache.refs(views, now)
    return list(views[: 2 + k]) if what == "new-list" else list(views)


@settings(max_examples=200, deadline=None)
@given(steps=_STEPS)
def test_the_list_query_answers_and_writes_what_load_per_view_does(
    steps: list[tuple[str, int, float]],
) -> None:
    """`loads(..., keep=False)` on one cache and `load` per view on another, through the same changes
    (progress reports, dispatches, completions, the clock within and past the reuse time, `refs` leaving
    pending loads): the same numbers handed out and the same entries kept."""
    listed, plain = LoadCache(PredictParams()), LoadCache(PredictParams())
    now = 10.0
    views = [view(f"e{i}", cap=4, runs=[_run(i + j, now) for j in range(i % 4)]) for i in range(6)]
    for what, k, dt in steps:
        now += dt
        candidates = fleet_step(views, what, k, now, (listed, plain))
        got = listed.loads(candidates, now, keep=False)
        want = [plain.load(e, now) for e in candidates]
        _same(listed, plain, views, got, want)


def _same(
    listed: LoadCache,
    plain: LoadCache,
    views: Sequence[EndpointView],
    got: list[EndpointLoad],
    want: list[EndpointLoad],
) -> None:
    """The list query's loads `got` are the loads `want` asked one by one, and the two caches hold the same
    entries for `views`."""
    assert [_state(a) for a in got] == [_state(b) for b in want]
    for e in views:
        a, b = listed.entry(e.id), plain.entry(e.id)
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert a[1:] == b[1:]


def test_the_list_query_reads_the_table_again_once_a_full_table_is_emptied() -> None:
    """Past 4,096 entries the cache starts a new table: loads asked after that in the same list are
    looked up in the new one, as `load` per view looks them up."""
    listed, plain = LoadCache(PredictParams()), LoadCache(PredictParams())
    views = [view(f"e{i}", cap=2, runs=[_run(i, 0.0)] if i % 2 else []) for i in range(4100)]
    for cache in (listed, plain):
        for e in views[4000:]:
            cache.load(e, 1.0)
    got = listed.loads(views, 1.0 + 0.5 * REUSE_S, keep=False)
    want = [plain.load(e, 1.0 + 0.5 * REUSE_S) for e in views]
    _same(listed, plain, views, got, want)


@settings(max_examples=200, deadline=None)
@given(
    ks=st.lists(st.integers(min_value=0, max_value=60), max_size=12),
    produced=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    later=st.floats(min_value=0.0, max_value=5.0),
    kv=st.one_of(st.none(), st.floats(min_value=1000.0, max_value=200_000.0)),
    extra=st.tuples(st.floats(min_value=0.0, max_value=8000.0), st.floats(min_value=0.0, max_value=500.0)),
)
def test_kv_peak_and_running_terms_from_the_states_are_the_running_states(
    ks: list[int], produced: list[int], later: float, kv: float | None, extra: tuple[float, float]
) -> None:
    """A load's KV peak (with and without one more request) and best fit's running terms, read from the
    load's states, are those of its running states (`EndpointLoad.running`) bit for bit."""
    runs = [_run(k, 0.0) for k in ks]
    for i, n in enumerate(produced[: len(runs)]):
        if n:
            runs[i] = with_progress(runs[i], n, 0.05, 0.5 + 0.01 * i)
    e: EndpointView = view("e", cap=16, runs=runs, kv=kv)
    load = EndpointLoad(e, 1.0 + later, PredictParams())
    fit = BestFitFilter(BestFitParams())
    got_terms = fit._running_terms(load)
    got_peak = load.peak_kv()
    got_extra = load.peak_kv(extra)
    items = [(s.context, s.remaining) for s in load.running]  # (the running states made only now)
    assert got_peak == peak_kv(items, load.coef.h, load.coef.j)
    assert got_extra == peak_kv([*items, extra], load.coef.h, load.coef.j)
    budget: float | None = None
    saved_least: float | None = None
    for s in load.running:
        r = s.req
        if r.itl_s is None or r.best_effort:
            continue
        budget = r.itl_s if budget is None else min(budget, r.itl_s)
        if s.prefilled:
            saved = s.produced * (r.itl_s - load.tpot_now)
            if saved >= 0 and (saved_least is None or saved < saved_least):
                saved_least = saved
    assert got_terms == (budget, saved_least)
