"""A filter told the next plugin's sure rejects (`SetAsideFilter`, `SureRejects`: the overflow guard and
best fit's sure misses) leaves the placement's choice as it was (hypothesis: the pipeline with and
without the capability, on random fleets large enough for best fit to name sure misses, with random
guard and best-fit settings, and the whole `coding-assistant` preset), and a request that fits nowhere
for best fit's KV bound is not judged by the guard at all."""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointId, RequestId
from gateway.sched.columns import columns_of
from gateway.sched.loads import LoadCache
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.plugins.placement.best_fit_bounds import MIN_CANDIDATES, SET_ASIDE_FROM, RejectGate
from gateway.sched.plugins.placement.least_outstanding import MaxScorePicker
from gateway.sched.plugins.placement.overflow_guard import OverflowGuardFilter, OverflowGuardParams
from gateway.sched.prefix import PrefixHits
from gateway.sched.profile import SchedulerProfile
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from tests.unit.slo_fixtures import COEF, SLOW, columnar_preset, req, running, view
from tests.unit.test_sched_columns_slo import NOW, Run, _endpoint, _new_request, _params, _run, _view

Endpoint = tuple[int, list[Run], PerfCoefficients, float | None, bool]

# endpoints ready (eligible) but a few, busy but a few: best fit names sure misses from MIN_CANDIDATES on
_ready = st.tuples(
    st.integers(min_value=2, max_value=6),  # cap
    st.lists(_run, min_size=1, max_size=5),
    st.sampled_from((COEF, SLOW)),
    st.one_of(st.none(), st.floats(min_value=2000.0, max_value=40000.0)),  # KV capacity
    st.just(True),
)
_fleet = st.lists(
    st.one_of(_ready, _ready, _ready, _endpoint), min_size=MIN_CANDIDATES, max_size=2 * MIN_CANDIDATES
)
_guard = st.builds(
    OverflowGuardParams,
    worst_case=st.booleans(),
    margin=st.sampled_from((0.9, 1.0, 1.5)),
    hold_infeasible=st.booleans(),
    on_track=st.sampled_from((0.0, 0.2)),
    prefill_overhead=st.just(0.05),
)
_request = st.tuples(
    st.integers(min_value=1, max_value=6000),  # prompt
    st.floats(min_value=1.0, max_value=400.0),  # predicted output
    st.one_of(st.none(), st.floats(min_value=50.0, max_value=5000.0)),  # TTFT target (ms)
    st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),  # E2E target (ms)
    st.one_of(st.none(), st.floats(min_value=5.0, max_value=200.0)),  # ITL target (ms)
    st.booleans(),  # best effort
)


def _profile(
    guard: OverflowGuardParams, fit: BestFitParams, *, set_aside: bool, columns_from: int | None = None
) -> SchedulerProfile:
    cache = LoadCache(fit.predict_params())  # one cache for both, as a policy shares it
    filters = (OverflowGuardFilter(guard, cache), BestFitFilter(fit, cache))
    return SchedulerProfile(
        filters=filters, scorers=(), picker=MaxScorePicker(), set_aside=set_aside, columns_from=columns_from
    )


def _id(e: EndpointView | None) -> EndpointId | None:
    return None if e is None else e.id


@settings(max_examples=200, deadline=None)
@given(
    endpoints=_fleet,
    guard=_guard,
    fit=_params,
    requests=st.lists(_request, min_size=1, max_size=3),
    up_front=st.booleans(),
)
def test_the_guard_told_best_fits_sure_misses_places_as_without(
    *,
    endpoints: list[Endpoint],
    guard: OverflowGuardParams,
    fit: BestFitParams,
    requests: list[tuple],  # type: ignore[type-arg]
    up_front: bool,
) -> None:
    """`up_front`: best fit names its sure misses for every request (else as its gate decides)."""
    fit = msgspec.structs.replace(fit, prefill_overhead=guard.prefill_overhead)
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    s = FleetSnapshot(now=NOW, endpoints=views)
    with_columns = FleetSnapshot(now=NOW, endpoints=views, columns=columns_of(views))
    with_aside, without = _profile(guard, fit, set_aside=True), _profile(guard, fit, set_aside=False)
    columnar = _profile(guard, fit, set_aside=True, columns_from=0)
    assert with_aside._asides[0] is not None
    assert columnar._column_asides[0] is not None
    assert without._asides == (None, None)
    for k, (prompt, out, ttft_ms, e2e_ms, itl_ms, best_effort) in enumerate(requests):
        r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), {}, best_effort=best_effort)
        r = dataclasses.replace(r, id=RequestId(f"new{k}"))
        if up_front:
            for p in (with_aside, columnar):
                p.filters[1]._gate.share = 1.0  # type: ignore[attr-defined]
        want = _id(without.place(r, s))
        assert _id(with_aside.place(r, s)) == want
        assert _id(columnar.place(r, with_columns)) == want


@settings(max_examples=100, deadline=None)
@given(
    endpoints=_fleet,
    cls=st.sampled_from(("generation", "translation", "summarization", "completion")),
    prompt=st.integers(min_value=1, max_value=6000),
    out=st.floats(min_value=1.0, max_value=400.0),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),
    cached=st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000)),
)
def test_coding_assistant_places_alike_with_and_without_setting_aside(
    *,
    endpoints: list[Endpoint],
    cls: str,
    prompt: int,
    out: float,
    e2e_ms: float | None,
    cached: dict[int, int],
) -> None:
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    r = req("new", arrival=NOW - 0.1, prompt=prompt, out=out, e2e_ms=e2e_ms, cls=cls)
    r = dataclasses.replace(r, cached=PrefixHits({EndpointId(f"e{k:02d}"): t for k, t in cached.items()}))
    columnar = columnar_preset("coding-assistant").profile
    plain = dataclasses.replace(columnar_preset("coding-assistant").profile, columns_from=None)
    off = dataclasses.replace(columnar_preset("coding-assistant").profile, columns_from=None, set_aside=False)
    assert any(a is not None for a in plain._asides)
    assert any(a is not None for a in columnar._column_asides)
    s = FleetSnapshot(now=NOW, endpoints=views)
    want = _id(off.place(r, s))
    assert _id(plain.place(r, s)) == want
    assert _id(columnar.place(r, FleetSnapshot(now=NOW, endpoints=views, columns=columns_of(views)))) == want


def test_a_request_over_every_kv_capacity_is_not_judged_by_the_guard() -> None:
    runs = [running(f"x{j}", prompt=3000, out=100.0) for j in range(4)]
    views = tuple(view(f"e{k:02d}", cap=8, runs=runs, kv=14000.0, coef=COEF) for k in range(MIN_CANDIDATES))
    s = FleetSnapshot(now=NOW, endpoints=views)
    profile = _profile(OverflowGuardParams(), BestFitParams(), set_aside=True)
    guard = profile.filters[0]
    assert isinstance(guard, OverflowGuardFilter)
    r = req("new", arrival=NOW, prompt=3000)
    assert profile.place(r, s) is None
    loads = [guard._cache.load(v, NOW) for v in views]
    assert not any(k[0] == "harm-terms" for load in loads for k in load.memo if isinstance(k, tuple))
    # without the capability the guard judges every one of them
    off = _profile(OverflowGuardParams(), BestFitParams(), set_aside=False)
    assert off.place(r, s) is None
    loads = [off.filters[0]._cache.load(v, NOW) for v in views]  # type: ignore[attr-defined]
    assert all(any(k[0] == "harm-terms" for k in load.memo if isinstance(k, tuple)) for load in loads)


def test_an_endpoint_set_aside_where_the_request_meets_its_targets_still_counts_for_the_guard() -> None:
    """Fast endpoints over their KV capacity (best fit's sure misses, where the request meets its
    deadline) and slow ones where it harms no one but misses its deadline even alone: the guard keeps
    the fast ones, best fit none, so the request waits; told to set the fast ones aside, the guard
    must still answer none of the slow ones (else best fit would place it there)."""
    fast = [
        view(
            f"f{k:02d}",
            cap=4,
            runs=[running(f"f{k}-x{j}", prompt=500, out=100.0) for j in range(2)],
            kv=1500.0,
        )
        for k in range(MIN_CANDIDATES // 2)
    ]
    slow = [
        view(
            f"s{k:02d}",
            cap=4,
            runs=[running(f"s{k}-x{j}", prompt=500, out=100.0) for j in range(2)],
            coef=SLOW,
        )
        for k in range(MIN_CANDIDATES // 2)
    ]
    s = FleetSnapshot(now=NOW, endpoints=(*fast, *slow))
    r = req("new", arrival=NOW, prompt=1000, out=100.0, e2e_ms=1600.0)
    guard = OverflowGuardParams(worst_case=False, prefill_overhead=0.05)
    fit = BestFitParams(prefill_overhead=0.05)
    assert [e.id for e in OverflowGuardFilter(guard).filter(r, s.endpoints, s)] == [e.id for e in fast]
    assert BestFitFilter(fit).filter(r, slow, s)  # best fit alone would take a slow one
    assert _profile(guard, fit, set_aside=False).place(r, s) is None
    profile = _profile(guard, fit, set_aside=True)
    assert profile._asides[0] is not None
    best_fit = profile.filters[1]
    assert isinstance(best_fit, BestFitFilter)
    assert best_fit.sure_rejects(r, s.endpoints, s) == [True] * len(fast) + [False] * len(slow)
    assert profile.place(r, s) is None


def test_best_fit_names_its_sure_misses_up_front_while_that_names_enough() -> None:
    many = MIN_CANDIDATES
    r, other = req("a"), req("b")
    gate = RejectGate()
    assert gate.ask(r, many)
    assert not gate.ask(r, many - 1)  # too few to pay
    assert not gate.ask(dataclasses.replace(r, cached=PrefixHits({EndpointId("e00"): 10})), many)
    gate.seen(r, [True] + [False] * (many - 1), up_front=True)  # named too few: closed
    assert gate.share < SET_ASIDE_FROM
    assert not gate.ask(r, many)
    gate.seen(other, [True] * many)  # the filter's look at another request than the one skipped
    assert not gate.ask(r, many)
    gate.seen(r, [True] * many)  # the filter's own look at the request skipped: open again
    assert gate.ask(other, many)
