"""A load stands for its endpoint's later views that differ only in progress reports, within its reuse
time (`gateway.sched.loads.LoadCache`, `gateway.sched.load_terms.progress_only`): every other change of
the view (a dispatch, a completion, a cancel, a pin, new estimates, health, cap, gauges, models or
specification) remakes it at once."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable
from operator import is_

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointHealth, EngineKind, InstanceClass, ModelName
from gateway.sched.load_terms import progress_only, same_requests
from gateway.sched.loads import REUSE_S, LoadCache
from gateway.sched.perf import PerfCoefficients
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.running import KEPT_FIELDS, RunningRequest, with_progress
from gateway.sched.snapshot import EndpointEstimates, EndpointView
from tests.unit.slo_fixtures import running, view

_RUNS = (running("a", prompt=300, out=80.0), running("b", prompt=900, out=200.0, std=20.0))


def _view() -> EndpointView:
    return view("e", cap=4, runs=_RUNS)


def _progress(v: EndpointView, k: int, produced: int, at: float) -> EndpointView:
    """`v` after a progress report of its `k`-th running request (as `Fleet.progress` makes it)."""
    runs = list(v.running)
    runs[k] = with_progress(runs[k], produced, 0.1, at)
    return dataclasses.replace(
        v, running=tuple(runs), streamed_tokens=v.streamed_tokens + 16, gap_s=v.gap_s + 0.2, gap_tokens=16
    )


def _est(v: EndpointView) -> EndpointEstimates:
    assert v.estimates is not None
    return v.estimates


def _perf(v: EndpointView) -> PerfCoefficients:
    assert v.perf is not None
    return v.perf


# The fields a progress report changes (`Fleet.progress`), and for every other field a change of it.
_PROGRESS = {"running", "streamed_tokens", "gap_s", "gap_tokens", "gap_after_cut_s", "gap_after_cut_tokens"}
_R = dataclasses.replace
_READY, _DOWN = EndpointHealth.READY, EndpointHealth.UNHEALTHY
_CHANGES: dict[str, Callable[[EndpointView], EndpointView]] = {
    "id": lambda v: _R(v, id=v.id + "x"),
    "url": lambda v: _R(v, url=v.url + "x"),
    "engine": lambda v: _R(v, engine=EngineKind.SGLANG if v.engine is EngineKind.VLLM else EngineKind.VLLM),
    "models": lambda v: _R(v, models=v.models | {ModelName(f"m{len(v.models)}")}),
    "instance_class": lambda v: _R(
        v,
        instance_class=InstanceClass.BATCH
        if v.instance_class != InstanceClass.BATCH
        else InstanceClass.MIXED,
    ),
    "health": lambda v: _R(v, health=_DOWN if v.health is _READY else _READY),
    "cap": lambda v: _R(v, cap=v.cap + 1),
    "inflight": lambda v: _R(v, inflight=v.inflight + 1),
    "engine_running": lambda v: _R(v, engine_running=(v.engine_running or 0.0) + 1.0),
    "engine_waiting": lambda v: _R(v, engine_waiting=(v.engine_waiting or 0.0) + 1.0),
    "kv_usage": lambda v: _R(v, kv_usage=(v.kv_usage or 0.0) + 0.01),
    "dispatched_since_scrape": lambda v: _R(v, dispatched_since_scrape=v.dispatched_since_scrape + 1),
    "scraped_at": lambda v: _R(v, scraped_at=(v.scraped_at or 0.0) + 1.0),
    "node": lambda v: _R(v, node=(v.node or "n") + "x"),
    "completed_since_scrape": lambda v: _R(v, completed_since_scrape=v.completed_since_scrape + 1),
    "running_prompt_tokens": lambda v: _R(v, running_prompt_tokens=v.running_prompt_tokens + 1),
    "running_output_tokens": lambda v: _R(v, running_output_tokens=v.running_output_tokens + 1.0),
    "estimates": lambda v: _R(v, estimates=_R(_est(v), perf=_R(_perf(v), k1=2.0 * _perf(v).k1 + 1e-6))),
    "priority_scheduling": lambda v: _R(v, priority_scheduling=not v.priority_scheduling),
    "max_cap": lambda v: _R(v, max_cap=v.max_cap + 1),
    "cut_at": lambda v: _R(v, cut_at=9.5 if v.cut_at == -math.inf else v.cut_at + 1.0),
    "max_batch": lambda v: _R(v, max_batch=(v.max_batch or 0) + 1),
    "config": lambda v: _R(v, config=(v.config or "c") + "x"),
}
_ids = itertools.count()


def _new(v: EndpointView) -> EndpointView:
    return _R(v, running=(*v.running, running(f"d{next(_ids)}")))


# Changes of the running requests other than progress: a completion or cancel, a dispatch, another
# request in a finished one's place, a pin, the same request dispatched again (resumed), the order.
_RUNNING_CHANGES: dict[str, Callable[[EndpointView], EndpointView]] = {
    "completion": lambda v: _R(v, running=v.running[1:]) if v.running else _new(v),
    "dispatch": _new,
    "replaced": lambda v: (
        _R(v, running=(*v.running[:-1], _R(v.running[-1], id=f"d{next(_ids)}"))) if v.running else _new(v)
    ),
    "pin": lambda v: (
        _R(v, running=(*v.running[:-1], _R(v.running[-1], resumable=not v.running[-1].resumable)))
        if v.running
        else _new(v)
    ),
    "resumed": lambda v: (
        _R(v, running=(*v.running[:-1], _R(v.running[-1], dispatched_at=v.running[-1].dispatched_at + 1)))
        if v.running
        else _new(v)
    ),
    "order": lambda v: _R(v, running=(*v.running[1:], v.running[0])) if len(v.running) > 1 else _new(v),
}


# ... and within the estimates: the KV capacity
_RUNNING_CHANGES["kv_capacity"] = lambda v: _R(
    v, estimates=_R(_est(v), kv_capacity_tokens=(v.kv_capacity_tokens or 0.0) + 1000.0)
)


def test_every_field_of_a_view_is_either_progress_or_a_change() -> None:
    names = {f.name for f in dataclasses.fields(EndpointView)}
    assert names == _PROGRESS | set(_CHANGES), "classify the new field in progress_only and here"


def test_a_progress_report_reuses_the_load_within_its_reuse_time_only() -> None:
    cache = LoadCache(PredictParams())
    v = _view()
    first = cache.load(v, 10.0)
    moved = _progress(_progress(v, 0, 16, 10.004), 1, 32, 10.008)
    assert progress_only(moved, v)
    assert cache.load(moved, 10.01) is first  # a few tokens behind, as an aged load is
    later = cache.load(moved, 10.0 + 2 * REUSE_S + 1e-6)
    assert later is not first
    assert later.view is moved
    # remade from the old one's clock-independent terms, number for number the load made afresh
    fresh = EndpointLoad(moved, later.now, PredictParams())
    assert (later.wait_s, later.tpot_now, later.seat_free) == (fresh.wait_s, fresh.tpot_now, fresh.seat_free)


def test_a_refresh_of_the_measured_averages_alone_reuses_the_load() -> None:
    cache = LoadCache(PredictParams())
    v = _view()
    first = cache.load(v, 10.0)
    assert v.estimates is not None
    assert v.perf is not None
    # new EWMAs, and the coefficients refit to the same numbers (a new object)
    refreshed = _R(v, estimates=_R(v.estimates, ttft_ewma_s=0.4, itl_ewma_s=0.02, perf=_R(v.perf)))
    assert refreshed.perf is not v.perf
    assert cache.load(_progress(refreshed, 0, 16, 10.005), 10.01) is first


def test_every_other_change_remakes_the_load_at_once() -> None:
    for name, change in {**_CHANGES, **_RUNNING_CHANGES}.items():
        cache = LoadCache(PredictParams())
        v = _progress(_view(), 0, 16, 9.9)
        first = cache.load(v, 10.0)
        other = change(v)
        assert other != v, name
        assert not progress_only(other, v), name
        got = cache.load(other, 10.001)
        assert got is not first, name
        assert got.view is other, name
        # ... also when progress reports came with it
        cache = LoadCache(PredictParams())
        cache.load(v, 10.0)
        both = change(_progress(v, 1, 48, 10.0))
        assert cache.load(both, 10.001).view is both, name


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(
            ("progress", "progress", "progress", *sorted(set(_CHANGES) - {"id"}), *_RUNNING_CHANGES)
        ),
        st.floats(min_value=0.0, max_value=1.5 * REUSE_S),  # clock advance
        st.integers(min_value=0, max_value=1),  # which running request reports
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(steps=_STEPS)
def test_a_load_stands_only_for_views_apart_in_progress_within_its_time(
    steps: list[tuple[str, float, int]],
) -> None:
    cache = LoadCache(PredictParams())
    v = _view()
    now = 10.0
    load = cache.load(v, now)
    made_at, made_for = now, v
    for what, dt, k in steps:
        now += dt
        prev = load
        if what == "progress":
            v = _progress(v, k % len(v.running), 16, now) if v.running else v
        else:
            v = {**_CHANGES, **_RUNNING_CHANGES}[what](v)
        load = cache.load(v, now)
        if load is prev:
            # reused: apart from its own view in progress only, and within twice the reuse time
            assert progress_only(v, made_for)
            assert now - made_at <= 2 * REUSE_S + 1e-12
        else:
            assert load.view is v
            assert math.isclose(load.now, now) or not load.n  # an idle load is renewed, not remade
            made_at, made_for = now, v
        if now - made_at <= REUSE_S and progress_only(v, made_for):
            assert load.view is made_for  # within the shortest reuse time it is reused


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(("same", "progress", "dispatch", "new-list")),
            st.integers(min_value=0, max_value=2),  # which endpoint
            st.floats(min_value=0.0, max_value=1.5 * REUSE_S),  # clock advance
        ),
        max_size=25,
    )
)
def test_the_loads_of_a_list_of_views_are_each_view_s_load(steps: list[tuple[str, int, float]]) -> None:
    """`LoadCache.loads` kept for the same list of views answers what `load` answers for each view."""
    cache = LoadCache(PredictParams())
    views = [view(f"e{i}", cap=4, runs=_RUNS[: i % 3]) for i in range(3)]
    now = 10.0
    for what, k, dt in steps:
        now += dt
        if what == "progress" and views[k].running:
            views = list(views)
            views[k] = _progress(views[k], 0, 16, now)
        elif what == "dispatch":
            views = list(views)
            views[k] = _new(views[k])
        elif what == "new-list":
            views = list(views)
        got = cache.loads(views, now)
        assert all(map(is_, got, [cache.load(v, now) for v in views]))
        for load, v in zip(got, views, strict=True):
            assert progress_only(v, load.view)
            assert not load.n or now - load.now <= 2 * REUSE_S + 1e-12


def test_a_running_request_keeps_every_field_but_its_progress() -> None:
    names = {f.name for f in dataclasses.fields(RunningRequest)}
    # (`kept`: those fields as one tuple, a memo that is no part of its value)
    assert names - set(KEPT_FIELDS) == {"produced", "first_token_at", "reported_at", "kept"}


def _plain_same(a: tuple[RunningRequest, ...], b: tuple[RunningRequest, ...]) -> bool:
    """`same_requests` field by field, without any memo."""
    return len(a) == len(b) and all(
        all(getattr(r, f) == getattr(o, f) for f in KEPT_FIELDS) for r, o in zip(a, b, strict=True)
    )


_EDITS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=2),  # which tuple is the next one made from
        st.integers(min_value=0, max_value=2),  # which of its running requests
        st.sampled_from(("progress", "replace-kept", "replace-same", "replace-progress", "drop")),
        st.integers(min_value=1, max_value=40),  # tokens reported, or a kept field's new value
    ),
    max_size=25,
)


@given(edits=_EDITS, order=st.randoms(use_true_random=False))
def test_same_requests_is_the_field_by_field_comparison(
    edits: list[tuple[int, int, str, int]], order: random.Random
) -> None:
    """Records made by progress reports (which hand on the kept tuple), by `dataclasses.replace` of a
    kept field, of no field or of a progress field (which start it afresh), compared in any order
    (whichever record's memo is made first): `same_requests` answers what the fields answer."""
    base = tuple(running(f"r{i}", prompt=100 + i) for i in range(3))
    made: list[tuple[RunningRequest, ...]] = [base, base, base]
    for src, k, how, x in edits:
        rs = list(made[src])
        if not rs:
            made.append(())
            continue
        r = rs[k % len(rs)]
        if how == "progress":
            rs[k % len(rs)] = with_progress(r, (r.produced or 0) + x, 1.0, 1.0 + x)
        elif how == "replace-kept":
            rs[k % len(rs)] = dataclasses.replace(r, prompt_tokens=r.prompt_tokens + x % 2)
        elif how == "replace-same":
            rs[k % len(rs)] = dataclasses.replace(r)
        elif how == "replace-progress":
            rs[k % len(rs)] = dataclasses.replace(r, produced=x)
        else:
            del rs[k % len(rs)]
        made.append(tuple(rs))
    pairs = [(a, b) for a in made for b in made]
    order.shuffle(pairs)
    for a, b in pairs:
        assert same_requests(a, b) == _plain_same(a, b)
