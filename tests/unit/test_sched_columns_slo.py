"""The SLO placement plugins' columnar forms choose what their plain forms choose (hypothesis: random
fleets of endpoints, idle and busy, with running requests that have targets, fitted coefficients and KV
capacities; requests with and without targets and cached prefixes; every order and constraint setting),
SLO admission decides on a snapshot's columns as on its views, the scoped filters cut a snapshot alike,
and a fleet of idle endpoints is placed without a load per endpoint."""

from __future__ import annotations

import dataclasses
import random
from typing import Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.slo import Infeasible, SloClass, SloPolicy
from gateway.core.types import EndpointHealth, EndpointId, InstanceClass
from gateway.sched.columns import columns_of
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.plugins.placement.overflow_guard import OverflowGuardFilter, OverflowGuardParams
from gateway.sched.prefix import PrefixHits
from gateway.sched.profile import eligible
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from tests.unit.fleet_steps import new_request
from tests.unit.slo_fixtures import COEF, SLOW, columnar_preset, req, running, view

NOW = 10.0

_run = st.tuples(
    st.integers(min_value=1, max_value=3000),  # prompt
    st.floats(min_value=1.0, max_value=300.0),  # predicted output
    st.floats(min_value=0.0, max_value=5.0),  # age
    st.one_of(st.none(), st.floats(min_value=-1.0, max_value=10.0)),  # first-token deadline from now
    st.one_of(st.none(), st.floats(min_value=-1.0, max_value=30.0)),  # last-token deadline from now
    st.one_of(st.none(), st.floats(min_value=0.005, max_value=0.2)),  # inter-token target
)
_endpoint = st.tuples(
    st.integers(min_value=1, max_value=6),  # cap
    st.one_of(st.just([]), st.lists(_run, min_size=1, max_size=6)),  # idle half the time
    st.sampled_from((COEF, SLOW)),
    st.one_of(st.none(), st.floats(min_value=2000.0, max_value=40000.0)),  # KV capacity
    st.booleans(),  # ready
)
_params = st.builds(
    BestFitParams,
    gamma=st.sampled_from((0.0, 0.5, 1.0)),
    theta=st.sampled_from((0.8, 0.9, 1.0)),
    rebalance_threshold=st.sampled_from((None, 0.0, 0.5)),
    order=st.sampled_from(("most-loaded", "least-loaded", "least-outstanding")),
    deadlines=st.booleans(),
)

Run = tuple[int, float, float, float | None, float | None, float | None]


def _view(k: int, endpoint: tuple[int, list[Run], PerfCoefficients, float | None, bool]) -> EndpointView:
    cap, runs, coef, kv, ready = endpoint
    rs = [
        running(
            f"e{k}-x{j}",
            prompt=p,
            out=o,
            dispatched_at=NOW - age,
            ttft_deadline=None if ttft is None else NOW + ttft,
            e2e_deadline=None if e2e is None else NOW + e2e,
            itl_s=itl,
        )
        for j, (p, o, age, ttft, e2e, itl) in enumerate(runs[:cap])
    ]
    v = view(f"e{k:02d}", cap=cap, runs=rs, kv=kv, coef=coef)
    return v if ready else dataclasses.replace(v, health=EndpointHealth.UNHEALTHY)


def _new_request(
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    *,
    best_effort: bool,
) -> SchedRequest:
    """The request a test places: its targets (TTFT, E2E, ITL in ms) and the prompt tokens each endpoint
    `e<k>` holds."""
    ttft_ms, e2e_ms, itl_ms = targets
    r = req("new", arrival=NOW - 0.1, prompt=prompt, out=out, ttft_ms=ttft_ms, e2e_ms=e2e_ms, itl_ms=itl_ms)
    hits = PrefixHits({EndpointId(f"e{k:02d}"): t for k, t in cached.items()})
    return dataclasses.replace(r, best_effort=best_effort, cached=hits)


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=8),
    params=_params,
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft_ms=st.one_of(st.none(), st.floats(min_value=50.0, max_value=5000.0)),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),
    itl_ms=st.one_of(st.none(), st.floats(min_value=5.0, max_value=200.0)),
    cached=st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000)),
    best_effort=st.booleans(),
)
def test_best_fit_over_columns_chooses_what_the_plain_filter_chooses(
    *,
    endpoints: list[tuple[int, list[Run], PerfCoefficients, float | None, bool]],
    params: BestFitParams,
    prompt: int,
    out: float,
    ttft_ms: float | None,
    e2e_ms: float | None,
    itl_ms: float | None,
    cached: dict[int, int],
    best_effort: bool,
) -> None:
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), cached, best_effort=best_effort)
    cols = columns_of(views)
    s = FleetSnapshot(now=NOW, endpoints=views, columns=cols)
    plain = BestFitFilter(params).filter(r, eligible(r, s), s)
    mask = BestFitFilter(params).filter_columns(r, cols, cols.eligible(r.model), s)
    assert [v.id for v, m in zip(views, mask, strict=True) if m] == [v.id for v in plain]


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=7),
    idle=st.integers(min_value=0, max_value=12),
    names=st.randoms(use_true_random=False),
    params=_params,
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft_ms=st.one_of(st.none(), st.floats(min_value=50.0, max_value=5000.0)),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),
    itl_ms=st.one_of(st.none(), st.floats(min_value=5.0, max_value=200.0)),
)
def test_best_fit_over_columns_with_few_busy_tries_the_idle_in_id_order(
    *,
    endpoints: list[tuple[int, list[Run], PerfCoefficients, float | None, bool]],
    idle: int,
    names: random.Random,
    params: BestFitParams,
    prompt: int,
    out: float,
    ttft_ms: float | None,
    e2e_ms: float | None,
    itl_ms: float | None,
) -> None:
    """Fewer busy candidates than `FleetLoads.least`, idle ones besides, and endpoint ids in no relation
    to the columns' order: the busy ones' keys merged with the idle ones' in id order choose what one
    sort of every candidate's key chooses (and the plain filter)."""
    views = [_view(k, e) for k, e in enumerate(endpoints)]
    views += [view(f"e{k:02d}", cap=2, coef=COEF) for k in range(len(views), len(views) + idle)]
    ids = [f"e{k:02d}" for k in range(len(views))]
    names.shuffle(ids)
    shuffled = tuple(dataclasses.replace(v, id=EndpointId(i)) for v, i in zip(views, ids, strict=True))
    r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), {}, best_effort=False)
    cols = columns_of(shuffled)
    s = FleetSnapshot(now=NOW, endpoints=shuffled, columns=cols)
    plain = BestFitFilter(params).filter(r, eligible(r, s), s)
    mask = BestFitFilter(params).filter_columns(r, cols, cols.eligible(r.model), s)
    assert [v.id for v, m in zip(shuffled, mask, strict=True) if m] == [v.id for v in plain]


def test_idle_endpoints_are_placed_over_columns_without_a_load_each() -> None:
    order: Literal["least-loaded"] = "least-loaded"
    views = tuple(view(f"e{k:02d}", cap=4) for k in range(300))
    busy = view("a", cap=4, runs=[running("x", prompt=500, out=100.0)])
    views = (busy, *views)
    cols = columns_of(views)
    s = FleetSnapshot(now=0.0, endpoints=views, columns=cols)
    f = BestFitFilter(BestFitParams(order=order))
    mask = f.filter_columns(req("new"), cols, cols.eligible(req("new").model), s)
    assert [v.id for v, m in zip(views, mask, strict=True) if m] == ["e00"]  # least loaded, first by id
    assert len(f._cache._loads) == 1  # the busy endpoint's only


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=8),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft_ms=st.one_of(st.none(), st.floats(min_value=50.0, max_value=5000.0)),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),
    queued=st.integers(min_value=0, max_value=30),
    outcome=st.sampled_from((Infeasible.REJECT, Infeasible.HOLD)),
)
def test_slo_admission_decides_on_columns_as_on_views(
    *,
    endpoints: list[tuple[int, list[Run], PerfCoefficients, float | None, bool]],
    prompt: int,
    out: float,
    ttft_ms: float | None,
    e2e_ms: float | None,
    queued: int,
    outcome: Infeasible,
) -> None:
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    r = req("new", arrival=NOW - 0.1, prompt=prompt, out=out, ttft_ms=ttft_ms, e2e_ms=e2e_ms)
    slo = SloPolicy(classes={"c": SloClass("c", on_infeasible=outcome)}, default_class="c")
    params = SloFeasibilityParams()
    plain = SloFeasibilityAdmitter(params, slo).admit(
        r, FleetSnapshot(now=NOW, endpoints=views), lambda c: queued
    )
    over_columns = SloFeasibilityAdmitter(params, slo).admit(
        r, FleetSnapshot(now=NOW, endpoints=views, columns=columns_of(views)), lambda c: queued
    )
    assert over_columns == plain


_CLASSES = (InstanceClass.INTERACTIVE, InstanceClass.MIXED, InstanceClass.BATCH)


def _ids(s: FleetSnapshot) -> list[str]:
    return [e.id for e in s.endpoints]


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(st.tuples(_endpoint, st.sampled_from(_CLASSES)), min_size=1, max_size=8),
    cls=st.sampled_from(("interactive", "batch")),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft_ms=st.one_of(st.none(), st.floats(min_value=50.0, max_value=5000.0)),
    itl_ms=st.one_of(st.none(), st.floats(min_value=5.0, max_value=200.0)),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),
    cached=st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000)),
)
def test_chat_and_batch_places_over_columns_as_the_plain_way(
    *,
    endpoints: list[tuple[tuple[int, list[Run], PerfCoefficients, float | None, bool], InstanceClass]],
    cls: str,
    prompt: int,
    out: float,
    ttft_ms: float | None,
    itl_ms: float | None,
    e2e_ms: float | None,
    cached: dict[int, int],
) -> None:
    views = tuple(dataclasses.replace(_view(k, e), instance_class=c) for k, (e, c) in enumerate(endpoints))
    r = new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), cached, now=NOW, cls=cls)
    policy = columnar_preset("chat-and-batch")
    assert policy.profile.columnar
    bare, with_columns = (
        FleetSnapshot(now=NOW, endpoints=views),
        FleetSnapshot(now=NOW, endpoints=views, columns=columns_of(views)),
    )
    assert _ids(policy.profile.scope(r, with_columns)) == _ids(policy.profile.scope(r, bare))
    plain = policy.profile.place(r, bare)
    columnar = policy.profile.place(r, with_columns)
    assert (None if columnar is None else columnar.id) == (None if plain is None else plain.id)


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=8),
    worst_case=st.booleans(),
    hold=st.booleans(),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft_ms=st.one_of(st.none(), st.floats(min_value=10.0, max_value=1000.0)),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=100.0, max_value=10000.0)),
    itl_ms=st.one_of(st.none(), st.floats(min_value=5.0, max_value=40.0)),
    cached=st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000)),
    best_effort=st.booleans(),
)
def test_the_overflow_guard_over_columns_keeps_what_the_plain_filter_keeps(
    *,
    endpoints: list[tuple[int, list[Run], PerfCoefficients, float | None, bool]],
    worst_case: bool,
    hold: bool,
    prompt: int,
    out: float,
    ttft_ms: float | None,
    e2e_ms: float | None,
    itl_ms: float | None,
    cached: dict[int, int],
    best_effort: bool,
) -> None:
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), cached, best_effort=best_effort)
    params = OverflowGuardParams(worst_case=worst_case, hold_infeasible=hold, prefill_overhead=0.05)
    cols = columns_of(views)
    s = FleetSnapshot(now=NOW, endpoints=views, columns=cols)
    plain = OverflowGuardFilter(params).filter(r, eligible(r, s), s)
    mask = OverflowGuardFilter(params).filter_columns(r, cols, cols.eligible(r.model), s)
    assert [v.id for v, m in zip(views, mask, strict=True) if m] == [v.id for v in plain]


@settings(max_examples=200, deadline=None)
@given(
    endpoints=st.lists(_endpoint, min_size=1, max_size=8),
    cls=st.sampled_from(("generation", "translation", "summarization", "completion")),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft_ms=st.one_of(st.none(), st.floats(min_value=50.0, max_value=5000.0)),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=500.0, max_value=30000.0)),
    cached=st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000)),
)
def test_coding_assistant_places_over_columns_as_the_plain_way(
    *,
    endpoints: list[tuple[int, list[Run], PerfCoefficients, float | None, bool]],
    cls: str,
    prompt: int,
    out: float,
    ttft_ms: float | None,
    e2e_ms: float | None,
    cached: dict[int, int],
) -> None:
    views = tuple(_view(k, e) for k, e in enumerate(endpoints))
    r = req("new", arrival=NOW - 0.1, prompt=prompt, out=out, ttft_ms=ttft_ms, e2e_ms=e2e_ms, cls=cls)
    r = dataclasses.replace(r, cached=PrefixHits({EndpointId(f"e{k:02d}"): t for k, t in cached.items()}))
    plain_policy, columnar_policy = columnar_preset("coding-assistant"), columnar_preset("coding-assistant")
    assert columnar_policy.profile.columnar
    bare, with_columns = (
        FleetSnapshot(now=NOW, endpoints=views),
        FleetSnapshot(now=NOW, endpoints=views, columns=columns_of(views)),
    )
    assert _ids(columnar_policy.profile.scope(r, with_columns)) == _ids(plain_policy.profile.scope(r, bare))
    plain = plain_policy.profile.place(r, bare)
    columnar = columnar_policy.profile.place(r, with_columns)
    assert (None if columnar is None else columnar.id) == (None if plain is None else plain.id)


_scaled = st.floats(min_value=0.25, max_value=4.0)


@settings(max_examples=150, deadline=None)
@given(
    fleets=st.lists(
        st.lists(st.tuples(st.sampled_from((COEF, SLOW)), _scaled), min_size=1, max_size=24),
        min_size=1,
        max_size=4,
    ),
    worst_case=st.booleans(),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft_ms=st.one_of(st.none(), st.floats(min_value=10.0, max_value=1000.0)),
    e2e_ms=st.one_of(st.none(), st.floats(min_value=100.0, max_value=10000.0)),
    itl_ms=st.one_of(st.none(), st.floats(min_value=5.0, max_value=40.0)),
)
def test_the_guard_judges_idle_endpoints_by_their_coefficient_rows_as_one_by_one(
    *,
    fleets: list[list[tuple[PerfCoefficients, float]]],
    worst_case: bool,
    prompt: int,
    out: float,
    ttft_ms: float | None,
    e2e_ms: float | None,
    itl_ms: float | None,
) -> None:
    """One guard over fleets of idle endpoints one after another, their coefficients scaled (a few
    distinct rows, or more than it judges row by row; the same rows again, or others): what the plain
    filter keeps, fleet after fleet."""
    guard = OverflowGuardFilter(OverflowGuardParams(worst_case=worst_case, prefill_overhead=0.05))
    r = _new_request(prompt, out, (ttft_ms, e2e_ms, itl_ms), {}, best_effort=False)
    for fleet in fleets:
        views = tuple(
            view(
                f"e{k:02d}",
                cap=1 + k % 3,
                coef=dataclasses.replace(c, k1=c.k1 * x, c2=c.c2 * x, k2=c.k2 * x, c3=c.c3 * round(x)),
            )
            for k, (c, x) in enumerate(fleet)
        )
        cols = columns_of(views)
        s = FleetSnapshot(now=NOW, endpoints=views, columns=cols)
        plain = OverflowGuardFilter(guard.params).filter(r, eligible(r, s), s)
        mask = guard.filter_columns(r, cols, cols.eligible(r.model), s)
        assert [v.id for v, m in zip(views, mask, strict=True) if m] == [v.id for v in plain]
        again = guard.filter_columns(r, cols, cols.eligible(r.model), s)  # (the rows kept)
        assert (again == mask).all()
