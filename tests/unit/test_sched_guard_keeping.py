"""The overflow guard's own-deadline test, taken load by load with the request's terms once
(`harms.Sparing.keeps`), answers what `meets(load.predict(req), ...) and itl_ok(...)` answers, and the
guard keeps what the plain computation keeps (hypothesis: random loads, requests, margins, cached
prefixes, and loads of another cache's parameters in between)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.harms import Sparing, endangers
from gateway.sched.loads import LoadCache
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.placement.overflow_guard import OverflowGuardFilter, OverflowGuardParams
from gateway.sched.predict import PredictParams, Tail
from gateway.sched.profile import eligible
from gateway.sched.snapshot import FleetSnapshot
from gateway.sched.targets import itl_ok, meets, time_left
from tests.unit.test_sched_columns_slo import NOW, Run, _endpoint, _new_request, _view

Endpoint = tuple[int, list[Run], PerfCoefficients, float | None, bool]

_request = st.tuples(
    st.integers(min_value=1, max_value=4000),  # prompt
    st.floats(min_value=1.0, max_value=400.0),  # predicted output
    st.one_of(st.none(), st.floats(min_value=10.0, max_value=5000.0)),  # TTFT target (ms)
    st.one_of(st.none(), st.floats(min_value=100.0, max_value=30000.0)),  # E2E target (ms)
    st.one_of(st.none(), st.floats(min_value=5.0, max_value=200.0)),  # ITL target (ms)
    st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000)),
    st.booleans(),  # best effort
)


@settings(max_examples=400, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=8),
    request=_request,
    margin=st.sampled_from((0.5, 0.9, 1.0, 1.5)),
    worst_case=st.booleans(),
    tails=st.lists(st.sampled_from(("mean", "normal")), min_size=1, max_size=8),
)
def test_sparing_answers_what_predict_meets_and_endangers_answer(
    *,
    endpoints: list[Endpoint],
    request: tuple,  # type: ignore[type-arg]
    margin: float,
    worst_case: bool,
    tails: list[Tail],
) -> None:
    prompt, out, ttft_ms, e2e_ms, itl_ms, cached, best_effort = request
    r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), cached, best_effort=best_effort)
    caches = {t: LoadCache(PredictParams(tail=t, prefill_overhead=0.05)) for t in ("mean", "normal")}
    left = time_left(r, NOW)
    sparing = Sparing(r, margin=margin, left=left, worst_case=worst_case)
    for k, e in enumerate(endpoints):
        load = caches[tails[k % len(tails)]].load(_view(k, e), NOW)  # a cache's load, then another's
        pred = load.predict(r, worst_case=worst_case)
        # both questions of one object, in either order, load after load (one output estimate shared)
        if k % 2:
            assert sparing.spares(load) == (not endangers(load, r, margin=margin))
        assert sparing.keeps(load) == (meets(pred, left, margin) and itl_ok(r, pred))
        assert sparing.spares(load) == (not endangers(load, r, margin=margin))


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=8),
    request=_request,
    worst_case=st.booleans(),
    hold=st.booleans(),
    margin=st.sampled_from((0.9, 1.0)),
    on_track=st.sampled_from((0.0, 0.2)),
)
def test_the_guard_keeps_what_the_plain_computation_keeps(
    *,
    endpoints: list[Endpoint],
    request: tuple,  # type: ignore[type-arg]
    worst_case: bool,
    hold: bool,
    margin: float,
    on_track: float,
) -> None:
    prompt, out, ttft_ms, e2e_ms, itl_ms, cached, best_effort = request
    r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), cached, best_effort=best_effort)
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    s = FleetSnapshot(now=NOW, endpoints=views)
    params = OverflowGuardParams(
        worst_case=worst_case, hold_infeasible=hold, margin=margin, on_track=on_track, prefill_overhead=0.05
    )
    guard = OverflowGuardFilter(params)
    candidates = eligible(r, s)
    cache = LoadCache(params.predict_params())
    left = time_left(r, NOW)
    harmless, meeting = [], []
    for e in candidates:
        load = cache.load(e, NOW)
        if endangers(load, r, margin=margin, on_track=on_track):
            continue
        harmless.append(e.id)
        pred = load.predict(r, worst_case=worst_case)
        if not r.best_effort and meets(pred, left, margin) and itl_ok(r, pred):
            meeting.append(e.id)
    want = harmless if r.best_effort else meeting if (meeting or hold) else harmless
    assert [e.id for e in guard.filter(r, candidates, s)] == want


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=8),
    requests=st.lists(_request, min_size=1, max_size=4),
    margin=st.sampled_from((0.5, 0.9, 1.0)),
    on_track=st.sampled_from((0.0, 0.2)),
    worst=st.lists(st.booleans(), min_size=1, max_size=4),
    tails=st.lists(st.sampled_from(("mean", "normal")), min_size=1, max_size=8),
)
def test_judging_every_load_in_one_loop_answers_each_question_asked_alone(
    *,
    endpoints: list[Endpoint],
    requests: list[tuple],  # type: ignore[type-arg]
    margin: float,
    on_track: float,
    worst: list[bool],
    tails: list[Tail],
) -> None:
    """`Sparing.judge` keeps what `spares` and `keeps` keep, load by load: requests in turn on the same
    loads (the terms each load keeps asked again, with and without `worst_case`), loads of two caches'
    parameters mixed, cached prefixes and best-effort requests, an object asked a question before."""
    caches = {t: LoadCache(PredictParams(tail=t, prefill_overhead=0.05)) for t in ("mean", "normal")}
    views = [_view(k, e) for k, e in enumerate(endpoints)]
    loads = [caches[tails[k % len(tails)]].load(v, NOW) for k, v in enumerate(views)]
    for i, (prompt, out, ttft_ms, e2e_ms, itl_ms, cached, best_effort) in enumerate(requests):
        r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), cached, best_effort=best_effort)
        left = time_left(r, NOW)
        worst_case = worst[i % len(worst)]
        own = not r.best_effort
        judge = Sparing(r, margin=margin, on_track=on_track, left=left, worst_case=worst_case)
        if i % 2:  # (an object that answered a question before: its output estimate kept)
            judge.keeps(loads[-1])
        harmless, meeting = judge.judge(views, iter(loads), own=own)
        alone = Sparing(r, margin=margin, on_track=on_track, left=left, worst_case=worst_case)
        spared = [v.id for v, load in zip(views, loads, strict=True) if alone.spares(load)]
        kept = [
            v.id
            for v, load in zip(views, loads, strict=True)
            if own and alone.spares(load) and alone.keeps(load)
        ]
        assert [v.id for v in harmless] == spared
        assert [v.id for v in meeting] == kept
