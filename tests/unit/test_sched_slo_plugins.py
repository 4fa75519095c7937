"""The SLO-aware plugins through their contracts, on a fake clock: orderings (edf, slack, priority-bands),
placement (cato-slack, best-fit, overflow-guard) and the latency predictions they share."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.slo import SloClass, SloPolicy
from gateway.core.types import EndpointHealth
from gateway.sched.loads import LoadCache
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.ordering.bands import BandsParams, PriorityBandsOrdering
from gateway.sched.plugins.ordering.edf import NO_DEADLINE, EdfOrdering
from gateway.sched.plugins.ordering.slack import (
    AT_RISK,
    BEST_EFFORT,
    CAN_WAIT,
    LATE,
    UNLIMITED,
    SlackOrdering,
    SlackParams,
    assess,
)
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.plugins.placement.cato_slack import CatoSlackParams, CatoSlackPicker
from gateway.sched.plugins.placement.overflow_guard import OverflowGuardFilter, OverflowGuardParams
from gateway.sched.predict import EndpointLoad, PredictParams, peak_kv
from gateway.sched.registry import BuildContext, PluginKind
from gateway.sched.targets import meets, time_left
from tests.unit.slo_fixtures import COEF, req, running, snap, view

P = PredictParams()
Order = Literal["most-loaded", "least-loaded", "least-outstanding"]


def load_of(v: object, now: float = 0.0) -> EndpointLoad:
    from gateway.sched.snapshot import EndpointView

    assert isinstance(v, EndpointView)
    return EndpointLoad(v, now, P)


# --------------------------------------------------------------------- predictions
def test_an_idle_endpoint_predicts_prefill_then_decode_alone() -> None:
    load = load_of(view("a"))
    p = load.predict(req(prompt=1000, out=11))
    assert p.wait_s == 0.0
    assert p.ttft_s == pytest.approx(1e-4 * 1000 + 0.01)
    assert p.tpot_s == pytest.approx((0.001 + 0.01) * 1.1)
    assert p.e2e_s == pytest.approx(p.ttft_s + 10 * p.tpot_s)
    assert load.idle_service(req(prompt=1000, out=11)).e2e_s == pytest.approx(p.e2e_s)


def test_a_full_endpoint_waits_for_a_seat() -> None:
    runs = [running(f"x{i}", dispatched_at=-1.0, out=1000.0 + 100 * i) for i in range(2)]
    load = load_of(view("a", cap=2, runs=runs))
    assert load.n == load.seats == 2
    # the seat frees when the shorter running request ends
    assert load.wait_s == pytest.approx(load.seat_free[0] + 0.5 * load.tpot_now)
    assert load.predict(req()).wait_s > 1.0


def test_running_long_requests_are_expected_to_go_on() -> None:
    r = running("x", dispatched_at=-10.0, out=5.0)  # far past 5 tokens at ~12 ms each
    load = load_of(view("a", runs=[r]))
    s = load.running[0]
    assert s.produced > 5.0
    assert s.long > 0
    assert s.remaining == pytest.approx(0.5 * s.produced)
    assert load.running_long == pytest.approx(s.long)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=12),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.floats(min_value=1.0, max_value=500.0),
    age=st.floats(min_value=0.0, max_value=5.0),
)
def test_fast_times_agree_with_the_full_predictions(n: int, prompt: int, out: float, age: float) -> None:
    runs = [running(f"x{i}", dispatched_at=-age * (i + 1) / max(1, n), out=100.0) for i in range(n)]
    load = load_of(view("a", cap=16, runs=runs))
    r = req(prompt=prompt, out=out)
    idle_ttft, idle_e2e, ttft, e2e = load.times(float(prompt), out)
    assert idle_ttft == pytest.approx(load.idle_service(r).ttft_s)
    assert idle_e2e == pytest.approx(load.idle_service(r).e2e_s)
    assert ttft == pytest.approx(load.predict(r).ttft_s)
    assert e2e == pytest.approx(load.predict(r).e2e_s)
    assert 0.0 <= idle_ttft <= ttft
    assert idle_e2e <= e2e + 1e-9


@settings(max_examples=100, deadline=None)
@given(
    items=st.lists(
        st.tuples(st.integers(min_value=0, max_value=500), st.integers(min_value=1, max_value=60)),
        max_size=8,
    ),
    h=st.floats(min_value=0.5, max_value=2.0),
    j=st.floats(min_value=0.0, max_value=16.0),
)
def test_peak_kv_is_the_peak_of_the_per_iteration_sum(
    items: list[tuple[int, int]], h: float, j: float
) -> None:
    brute = 0.0
    for t in range(max((rem for _, rem in items), default=0) + 1):
        brute = max(brute, sum(h * (ctx + t) + j for ctx, rem in items if t < rem))
    got = peak_kv([(float(c), float(r)) for c, r in items], h, j)
    assert got == pytest.approx(brute) or (not items and got == 0.0)


def test_the_tail_mode_predicts_longer_outputs() -> None:
    r = req(out=100.0)
    r = dataclasses.replace(r, predicted_output_p90=164.0)
    mean = EndpointLoad(view("a"), 0.0, PredictParams()).output_tokens(r)
    normal = EndpointLoad(view("a"), 0.0, PredictParams(tail="normal", tau=0.1)).output_tokens(r)
    cantelli = EndpointLoad(view("a"), 0.0, PredictParams(tail="cantelli", tau=0.1)).output_tokens(r)
    assert mean == 100.0
    assert normal == pytest.approx(164.0, rel=1e-3)  # the p90 itself
    assert cantelli == pytest.approx(100.0 + 3.0 * (64.0 / 1.2815515655446004), rel=1e-3)


def test_the_tail_bound_stops_at_max_tokens() -> None:
    r = dataclasses.replace(req(out=100.0), predicted_output_p90=164.0, max_tokens=120)
    assert EndpointLoad(view("a"), 0.0, PredictParams(tail="cantelli", tau=0.1)).output_tokens(r) == 120.0
    assert EndpointLoad(view("a"), 0.0, PredictParams()).output_tokens(r) == 100.0


# --------------------------------------------------------------------- orderings
def test_edf_orders_by_the_earliest_deadline_then_arrival() -> None:
    edf = EdfOrdering()
    s = snap(view("a"))
    reqs = [
        req("late-ttft", arrival=0.0, ttft_ms=5000.0),
        req("early-e2e", arrival=1.0, e2e_ms=1000.0),
        req("none-1", arrival=0.5),
        req("none-0", arrival=0.2),
        req("demoted", arrival=0.0, ttft_ms=10.0, best_effort=True),
    ]
    order = [r.id for r in sorted(reqs, key=lambda r: edf.key(r, s))]
    assert order == ["early-e2e", "late-ttft", "none-0", "none-1", "demoted"]
    assert edf.key(reqs[2], s)[1] == NO_DEADLINE


@pytest.mark.parametrize(
    ("request_", "endpoint", "now", "cls"),
    [
        pytest.param(req(), view("a"), 0.0, CAN_WAIT, id="no-targets"),
        pytest.param(req(e2e_ms=10_000.0), view("a"), 0.0, CAN_WAIT, id="room-to-spare"),
        pytest.param(req(ttft_ms=100.0), view("a"), 0.2, LATE, id="deadline-passed"),
        pytest.param(req(ttft_ms=15.0, prompt=100), view("a"), 0.0, LATE, id="too-tight-even-alone"),
        pytest.param(
            req(e2e_ms=2000.0),
            view("a", cap=1, runs=[running("x", dispatched_at=-0.1, out=1000.0)]),
            0.0,
            AT_RISK,
            id="only-endpoint-full-for-long",
        ),
        pytest.param(req(ttft_ms=1.0, best_effort=True), view("a"), 0.0, BEST_EFFORT, id="demoted"),
        pytest.param(
            req(e2e_ms=1000.0), view("a", health=EndpointHealth.UNHEALTHY), 0.0, CAN_WAIT, id="nothing-ready"
        ),
    ],
)
def test_slack_classes(request_: object, endpoint: object, now: float, cls: int) -> None:
    from gateway.sched.request import SchedRequest
    from gateway.sched.snapshot import EndpointView

    assert isinstance(request_, SchedRequest)
    assert isinstance(endpoint, EndpointView)
    got, slack = assess(request_, snap(endpoint, now=now), LoadCache(P))
    assert got == cls
    assert math.isfinite(slack)


def test_slack_orders_least_slack_first_and_moves_with_time() -> None:
    ordering = SlackOrdering(SlackParams())
    s0 = snap(view("a"), now=0.0)
    tight = req("tight", e2e_ms=1500.0)
    loose = req("loose", arrival=-1.0, e2e_ms=5000.0)
    assert ordering.key(tight, s0) < ordering.key(loose, s0)
    # 1.6 s later `tight` is late: CATO serves it first, "late last" puts it behind `loose`
    s1 = snap(view("a"), now=1.6)
    assert ordering.key(tight, s1)[0] == 0.0
    last = SlackOrdering(SlackParams(late="last"))
    assert last.key(tight, s1) > last.key(loose, s1)
    assert last.engine_priority(tight, s1) == 2
    assert ordering.engine_priority(tight, s1) == 0


@pytest.mark.parametrize(
    ("late_first", "at_risk_first", "order"),
    [
        pytest.param(True, True, [LATE, AT_RISK, CAN_WAIT, BEST_EFFORT], id="cato"),
        pytest.param(False, True, [AT_RISK, CAN_WAIT, LATE, BEST_EFFORT], id="late-last"),
        pytest.param(False, False, [CAN_WAIT, AT_RISK, LATE, BEST_EFFORT], id="goodput"),
        pytest.param(True, False, [LATE, CAN_WAIT, AT_RISK, BEST_EFFORT], id="at-risk-last"),
    ],
)
def test_slack_rank_of_each_class(late_first: bool, at_risk_first: bool, order: list[int]) -> None:
    o = SlackOrdering(
        SlackParams(late="first" if late_first else "last", at_risk="first" if at_risk_first else "last")
    )
    assert sorted((LATE, AT_RISK, CAN_WAIT, BEST_EFFORT), key=o.rank_of) == order


@settings(max_examples=80, deadline=None)
@given(
    now=st.floats(min_value=0.0, max_value=30.0),
    prompt=st.integers(min_value=1, max_value=3000),
    out=st.floats(min_value=1.0, max_value=400.0),
    ttft=st.one_of(st.none(), st.floats(min_value=1.0, max_value=20000.0)),
    e2e=st.one_of(st.none(), st.floats(min_value=1.0, max_value=60000.0)),
    busy=st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=4),
)
def test_slack_class_invariants(
    *, now: float, prompt: int, out: float, ttft: float | None, e2e: float | None, busy: list[int]
) -> None:
    views = [
        view(
            f"e{i}",
            cap=4,
            runs=[running(f"x{i}-{k}", dispatched_at=-0.5, out=200.0) for k in range(min(n, 4))],
        )
        for i, n in enumerate(busy)
    ]
    r = req(prompt=prompt, out=out, ttft_ms=ttft, e2e_ms=e2e)
    s = snap(*views, now=now)
    cache = LoadCache(P)
    cls, slack = assess(r, s, cache)
    assert cls in (LATE, AT_RISK, CAN_WAIT)
    assert math.isfinite(slack)
    left = time_left(r, now)
    if ttft is None and e2e is None:
        assert (cls, slack) == (CAN_WAIT, UNLIMITED)
        return
    loads = [cache.load(v, now) for v in views]
    idle_ok = any(meets(ld.idle_service(r), left) for ld in loads)
    now_ok = any(meets(ld.predict(r), left) for ld in loads)
    assert (cls == LATE) == (not idle_ok)  # slack gone: not even alone on the best endpoint
    if cls == CAN_WAIT:
        assert now_ok
    if cls == AT_RISK:
        assert not now_ok
    key = SlackOrdering(SlackParams()).key(r, s)
    assert all(math.isfinite(k) for k in key)


def test_priority_bands_are_strict_and_slack_orders_inside_a_band() -> None:
    slo = SloPolicy(
        classes={
            "ide": SloClass("ide", band=0),
            "chat": SloClass("chat", band=1),
            "batch": SloClass("batch", band=5),
        },
        default_class="chat",
    )
    o = PriorityBandsOrdering(BandsParams(bands={"chat": 2}), slo)
    s = snap(view("a"))
    reqs = [
        req("batch", cls="batch", ttft_ms=10.0),
        req("chat-loose", cls="chat", e2e_ms=60_000.0),
        req("chat-tight", cls="chat", e2e_ms=3_000.0),
        req("ide", cls="ide"),
        req("unknown", cls="nope", ttft_ms=10.0),
        req("demoted", cls="ide", best_effort=True),
    ]
    order = [r.id for r in sorted(reqs, key=lambda r: o.key(r, s))]
    assert order == ["ide", "chat-tight", "chat-loose", "batch", "unknown", "demoted"]
    assert [o.engine_priority(r, s) for r in reqs] == [5, 2, 2, 0, 5, 6]


def test_priority_bands_reject_unknown_class_names() -> None:
    from gateway.core.errors import ConfigError

    ctx = BuildContext(slo=SloPolicy(classes={"a": SloClass("a")}, default_class="a"))
    with pytest.raises(ConfigError, match="bands names classes the policy does not define: zz"):
        default_registry().build(
            PluginKind.ORDERING, "priority-bands", {"bands": {"zz": 1}}, path="o", ctx=ctx
        )


# --------------------------------------------------------------------- cato-slack
def test_cato_slack_takes_the_smallest_wait_that_meets_the_deadline() -> None:
    picker = CatoSlackPicker(CatoSlackParams())
    busy = view("a-busy", cap=2, runs=[running("x", dispatched_at=-0.1, out=20.0)])
    full = view("b-full", cap=1, runs=[running("y", dispatched_at=-0.1, out=5000.0)])
    idle = view("c-idle")
    s = snap(busy, full, idle)
    r = req(e2e_ms=1000.0)
    scored = [(busy, 0.0), (full, 0.0), (idle, 0.0)]
    assert picker.pick(r, scored, s).id == "c-idle"
    # only the full endpoint left: nothing meets the deadline, the smallest wait wins anyway
    assert picker.pick(r, [(full, 0.0)], s).id == "b-full"
    # a deadline met nowhere: smallest wait
    impossible = req(e2e_ms=1.0)
    assert picker.pick(impossible, [(full, 0.0), (busy, 0.0)], s).id == "a-busy"


# --------------------------------------------------------------------- best-fit
BF = BestFitFilter(BestFitParams(gamma=0.5, theta=0.9, rebalance_threshold=0.5))


def test_best_fit_packs_onto_the_most_loaded_endpoint_that_fits() -> None:
    light = view("light", runs=[running("l0", dispatched_at=-0.2)])
    heavy = view("heavy", runs=[running(f"h{i}", dispatched_at=-0.2) for i in range(4)])
    idle = view("idle")
    assert [e.id for e in BF.filter(req(), [light, idle, heavy], snap(light, heavy, idle))] == ["heavy"]


def test_best_fit_avoids_endpoints_whose_requests_run_long() -> None:
    long_runner = view("long", runs=[running(f"x{i}", dispatched_at=-20.0, out=10.0) for i in range(4)])
    light = view("light", runs=[running("l0", dispatched_at=-0.2, out=500.0)])
    assert [e.id for e in BF.filter(req(), [long_runner, light], snap(long_runner, light))] == ["light"]


@pytest.mark.parametrize(
    ("endpoint", "request_", "violated"),
    [
        pytest.param(view("e"), req(ttft_ms=1.0), [], id="idle-always-fits"),
        pytest.param(
            view("e", cap=1, runs=[running("x", dispatched_at=-0.1)]), req(), ["seats"], id="no-seat"
        ),
        pytest.param(
            view("e", runs=[running("x", dispatched_at=-0.1, itl_s=0.0125)]),
            req(),
            ["atgt", "prefill"],
            id="itl-target-of-a-running-request",
        ),
        pytest.param(
            view("e", runs=[running("x", dispatched_at=-0.1, out=500.0)]),
            req(prompt=100, ttft_ms=25.0),
            ["ttft"],
            id="own-ttft-after-the-iteration-in-flight",
        ),
        pytest.param(
            view("e", runs=[running("x", dispatched_at=-0.1, out=50.0, e2e_deadline=0.6)]),
            req(prompt=3000),
            ["prefill"],
            id="long-prefill-pauses-a-tight-decode",
        ),
        pytest.param(
            view("e", kv=1000.0, runs=[running("x", dispatched_at=-0.1, prompt=500, out=100.0)]),
            req(prompt=400, out=100.0),
            ["kv"],
            id="kv-over-future-iterations",
        ),
        pytest.param(
            view("e", runs=[running("x", dispatched_at=-0.1, out=50.0, e2e_deadline=0.6)]),
            req(prompt=3000, best_effort=True, ttft_ms=1.0),
            ["prefill"],
            id="best-effort-still-protects-others",
        ),
    ],
)
def test_best_fit_constraints(endpoint: object, request_: object, violated: list[str]) -> None:
    from gateway.sched.request import SchedRequest
    from gateway.sched.snapshot import EndpointView

    assert isinstance(endpoint, EndpointView)
    assert isinstance(request_, SchedRequest)
    load = EndpointLoad(endpoint, 0.0, P)
    assert BF.violations(load, request_) == violated
    kept = BF.filter(request_, [endpoint], snap(endpoint))
    assert bool(kept) == (not violated)


@settings(max_examples=80, deadline=None)
@given(
    fleet=st.lists(
        st.lists(
            st.tuples(
                st.integers(min_value=1, max_value=2000),  # prompt
                st.floats(min_value=1.0, max_value=300.0),  # predicted output
                st.floats(min_value=0.0, max_value=3.0),  # age
                st.one_of(st.none(), st.floats(min_value=0.1, max_value=20.0)),  # e2e deadline from now
            ),
            max_size=6,
        ),
        min_size=1,
        max_size=4,
    ),
    prompt=st.integers(min_value=1, max_value=3000),
    out=st.floats(min_value=1.0, max_value=300.0),
    ttft=st.one_of(st.none(), st.floats(min_value=10.0, max_value=5000.0)),
    kv=st.one_of(st.none(), st.floats(min_value=500.0, max_value=20000.0)),
)
def test_best_fit_never_places_where_a_constraint_is_violated(
    fleet: list[list[tuple[int, float, float, float | None]]],
    prompt: int,
    out: float,
    ttft: float | None,
    kv: float | None,
) -> None:
    views = [
        view(
            f"e{i}",
            cap=6,
            kv=kv,
            runs=[
                running(f"x{i}-{k}", prompt=p, out=o, dispatched_at=-age, e2e_deadline=dl)
                for k, (p, o, age, dl) in enumerate(runs)
            ],
        )
        for i, runs in enumerate(fleet)
    ]
    r = req(prompt=prompt, out=out, ttft_ms=ttft)
    kept = BF.filter(r, views, snap(*views))
    assert len(kept) <= 1
    for v in kept:
        load = EndpointLoad(v, 0.0, P)
        assert load.n < load.seats
        if load.n == 0:
            continue
        # independently of `violations`: the four constraints, recomputed
        pred = load.predict(r)
        own = meets(load.idle_service(r), time_left(r, 0.0))
        if own and ttft is not None:
            assert pred.ttft_s <= ttft / 1000.0
        if kv is not None:
            items = [(s.context, s.remaining) for s in load.running] + [(float(prompt), pred.output_tokens)]
            assert peak_kv(items, COEF.h, COEF.j) <= kv
        for h in load.harm(r):
            if h.target != "itl":
                assert h.delay <= 0.9 * h.saved
    if not kept:  # nothing fitted: every endpoint breaks something
        for v in views:
            assert BF.violations(EndpointLoad(v, 0.0, P), r)


# --------------------------------------------------------------------- overflow guard
def test_overflow_guard_protects_running_deadlines_and_the_requests_own() -> None:
    guard = OverflowGuardFilter(OverflowGuardParams(worst_case=False, margin=1.0, hold_infeasible=False))
    tight = view("tight", runs=[running("x", dispatched_at=-0.1, out=50.0, e2e_deadline=0.6)])
    relaxed = view("relaxed", runs=[running("y", dispatched_at=-0.1, out=50.0, e2e_deadline=60.0)])
    s = snap(tight, relaxed)
    big = req(prompt=3000, e2e_ms=10_000.0)
    assert [e.id for e in guard.filter(big, [tight, relaxed], s)] == ["relaxed"]
    # the request itself cannot make it anywhere: it may still go where it harms no one ...
    hopeless = req(prompt=3000, e2e_ms=1.0)
    assert [e.id for e in guard.filter(hopeless, [tight, relaxed], s)] == ["relaxed"]
    # ... unless the guard holds such requests
    holding = OverflowGuardFilter(OverflowGuardParams(worst_case=False, margin=1.0, hold_infeasible=True))
    assert list(holding.filter(hopeless, [tight, relaxed], s)) == []


def test_overflow_guard_with_worst_case_throughput() -> None:
    v = view("e", cap=16)
    r = req(prompt=10, out=100.0, e2e_ms=1500.0)
    # alone: ~12 ms per token, fits; at a full batch of 16: ~29 ms per token, does not
    assert OverflowGuardFilter(
        OverflowGuardParams(worst_case=False, margin=1.0, hold_infeasible=True)
    ).filter(r, [v], snap(v))
    assert not OverflowGuardFilter(
        OverflowGuardParams(worst_case=True, margin=1.0, hold_infeasible=True)
    ).filter(r, [v], snap(v))


def test_best_fit_keeps_a_reserve_on_the_requests_own_deadline_then_falls_back() -> None:
    # alone: 0.02 s prefill + 99 x 12.1 ms ≈ 1.22 s; in a batch of 5: 99 x 16.5 ms ≈ 1.65 s
    busy = view("busy", runs=[running(f"b{i}", dispatched_at=-0.2, out=500.0) for i in range(4)])
    idle = view("idle")
    roomy = req(out=100.0, e2e_ms=3000.0)
    assert [e.id for e in BF.filter(roomy, [busy, idle], snap(busy, idle))] == ["busy"]  # packed
    # 1.7 s: fits the busy endpoint only without the reserve, the idle one with it
    tight = req(out=100.0, e2e_ms=1700.0)
    assert [e.id for e in BF.filter(tight, [busy, idle], snap(busy, idle))] == ["idle"]
    # 1.3 s: nowhere with the reserve; the least loaded endpoint where it fits at all
    tighter = req(out=100.0, e2e_ms=1300.0)
    assert BF.violations(EndpointLoad(idle, 0.0, P), tighter) == []  # an idle endpoint always fits
    only_busy = BF.filter(tighter, [busy], snap(busy))
    assert list(only_busy) == []


def test_least_loaded_order_is_by_load_alone_unless_asked_to_rebalance() -> None:
    # "long": one request far past its predicted 10 tokens (its remaining is re-estimated, so the load
    # counts it); "busy": four on track. By load "long" is the lighter: the least-loaded order takes it,
    # a packing order (and least-loaded with an explicit threshold) tries it last (Aladdin's rebalancing).
    long_runner = view("long", runs=[running("x", dispatched_at=-20.0, out=10.0)])
    busy = view("busy", runs=[running(f"b{i}", dispatched_at=-0.2, out=500.0) for i in range(4)])
    s = snap(long_runner, busy)
    spread = BestFitFilter(BestFitParams(gamma=0.5, theta=0.9, order="least-loaded"))
    assert spread.rebalance == 0.0
    assert EndpointLoad(long_runner, s.now, P).running_long > 0.5
    assert spread.capacity_norm(EndpointLoad(long_runner, s.now, P)) < spread.capacity_norm(
        EndpointLoad(busy, s.now, P)
    )
    assert [e.id for e in spread.filter(req(), [busy, long_runner], s)] == ["long"]
    asked = BestFitFilter(BestFitParams(gamma=0.5, theta=0.9, order="least-loaded", rebalance_threshold=0.5))
    assert [e.id for e in asked.filter(req(), [busy, long_runner], s)] == ["busy"]
    packing = BestFitFilter(BestFitParams(gamma=0.5, theta=0.9))
    assert packing.rebalance == 0.5
    assert [e.id for e in packing.filter(req(), [busy, long_runner], s)] == ["busy"]


def test_best_fit_can_try_the_least_loaded_endpoint_first() -> None:
    spread = BestFitFilter(BestFitParams(gamma=0.5, theta=0.9, rebalance_threshold=0.5, order="least-loaded"))
    light = view("light", runs=[running("l0", dispatched_at=-0.2)])
    heavy = view("heavy", runs=[running(f"h{i}", dispatched_at=-0.2) for i in range(4)])
    assert [e.id for e in spread.filter(req(), [heavy, light], snap(light, heavy))] == ["light"]
    assert [e.id for e in BF.filter(req(), [heavy, light], snap(light, heavy))] == ["heavy"]


# --------------------------------------------------------------------- best-fit, fixed-fleet order
def _order(order: Order, *, rebalance: float = 0.5) -> BestFitFilter:
    return BestFitFilter(BestFitParams(gamma=0.0, theta=0.9, rebalance_threshold=rebalance, order=order))


def test_least_outstanding_order_counts_requests_not_their_lengths() -> None:
    # one long prompt (a summarization) against three short requests with long answers (generations):
    # by capacity_norm the long context is the heavier endpoint, by count the lighter
    long_ctx = view("long", runs=[running("l0", dispatched_at=-0.5, prompt=12_000, out=20.0)])
    pair = view("pair", runs=[running(f"p{i}", dispatched_at=-0.5, prompt=8000, out=20.0) for i in range(2)])
    short = view("short", runs=[running(f"s{i}", dispatched_at=-0.5, prompt=50, out=300.0) for i in range(3)])
    r = req(prompt=3000)
    s = snap(long_ctx, pair, short)
    fleet = [short, pair, long_ctx]
    assert [e.id for e in _order("least-outstanding").filter(r, fleet, s)] == ["long"]
    assert [e.id for e in _order("least-loaded").filter(r, fleet, s)] == ["short"]
    assert [e.id for e in _order("most-loaded").filter(r, fleet, s)] == ["pair"]


def test_least_outstanding_order_counts_what_waits_in_the_engine() -> None:
    # one request of berth's, three more queued inside the engine by other routes
    queued = dataclasses.replace(
        view("queued", runs=[running("q0", dispatched_at=-0.2)]), engine_running=1.0, engine_waiting=3.0
    )
    two = view("two", runs=[running(f"t{i}", dispatched_at=-0.2) for i in range(2)])
    three = view("three", runs=[running(f"h{i}", dispatched_at=-0.2) for i in range(3)])
    s = snap(queued, two, three)
    assert [e.id for e in _order("least-outstanding").filter(req(), [queued, two, three], s)] == ["two"]
    assert [e.id for e in _order("least-loaded").filter(req(), [queued, two, three], s)] == ["queued"]
    assert [e.id for e in _order("most-loaded").filter(req(), [queued, two, three], s)] == ["three"]


def test_least_outstanding_order_still_keeps_every_constraint() -> None:
    no_seat = view("no-seat", cap=1, runs=[running("x", dispatched_at=-0.1)])
    tight = view("tight", runs=[running("y", dispatched_at=-0.1, out=50.0, e2e_deadline=0.9)])
    busy = view("busy", runs=[running(f"b{i}", dispatched_at=-0.1, out=500.0) for i in range(3)])
    s = snap(no_seat, tight, busy)
    jsq = _order("least-outstanding")
    # fewest outstanding first, but no seat on the first and a running deadline on the second
    assert jsq.violations(EndpointLoad(no_seat, 0.0, P), req(prompt=3000)) == ["seats"]
    assert jsq.violations(EndpointLoad(tight, 0.0, P), req(prompt=3000)) == ["prefill"]
    assert [e.id for e in jsq.filter(req(prompt=3000), [no_seat, tight, busy], s)] == ["busy"]
    # a short prompt pauses the running request briefly enough: the fewer outstanding takes it
    assert [e.id for e in jsq.filter(req(prompt=10), [no_seat, tight, busy], s)] == ["tight"]


def test_least_outstanding_order_falls_back_to_the_least_outstanding_without_the_reserve() -> None:
    # alone: ~1.22 s; the request's own deadline fits nowhere within θ of its time left, so the
    # endpoint with the fewest requests where it fits at all takes it (as in least-loaded order)
    one = view("one", runs=[running("o0", dispatched_at=-0.2, out=500.0)])
    three = view("three", runs=[running(f"t{i}", dispatched_at=-0.2, out=500.0) for i in range(3)])
    r = req(out=100.0, e2e_ms=1400.0)
    jsq = _order("least-outstanding")
    assert all(jsq.violations(EndpointLoad(v, 0.0, P), r) for v in (one, three))
    assert [e.id for e in jsq.filter(r, [three, one], snap(one, three))] == ["one"]


def test_the_rebalancing_tier_off_keeps_new_requests_from_piling_onto_one_endpoint() -> None:
    # every endpoint but one runs a request far past its predicted length (as every long answer does
    # while the length predictor has no data): with the tier, the one left takes every new request
    flagged = [view(f"e{i}", runs=[running(f"x{i}", dispatched_at=-20.0, out=10.0)]) for i in range(3)]
    fresh = view("fresh", runs=[running(f"f{i}", dispatched_at=-0.2, out=500.0) for i in range(3)])
    s = snap(*flagged, fresh)
    assert all(EndpointLoad(v, 0.0, P).running_long >= 0.5 for v in flagged)
    tiered = _order("least-outstanding")
    flat = _order("least-outstanding", rebalance=0.0)
    assert [e.id for e in tiered.filter(req(), [*flagged, fresh], s)] == ["fresh"]
    assert [e.id for e in flat.filter(req(), [*flagged, fresh], s)] == ["e0"]
