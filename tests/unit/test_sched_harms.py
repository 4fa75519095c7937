"""The cheaper forms of the SLO plugins' checks answer what the plain ones answer, on random loads:
`gateway.sched.harms` against a walk of `EndpointLoad.harm`, best fit's terms kept on a load and its
two reserves judged at once, SLO admission's late recheck against asking every endpoint alone."""

from __future__ import annotations

import dataclasses
from typing import Literal, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.slo import Infeasible, SloClass, SloPolicy
from gateway.core.types import EndpointId
from gateway.sched.harms import Sparing, breaks_deadlines, endangers
from gateway.sched.interfaces import AdmitOutcome
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.admission.seat_order import SeatOrder, kth_free
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.prefix import PrefixHits
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointEstimates, EndpointView
from gateway.sched.targets import meets, time_left
from tests.unit.slo_fixtures import COEF, req, running, snap, view

P = PredictParams()
Run = tuple[int, float, float, float | None, float | None, float | None, bool]
New = tuple[int, float, float | None, float | None, float | None]

_run = st.tuples(
    st.integers(min_value=1, max_value=4000),  # prompt
    st.floats(min_value=1.0, max_value=400.0),  # predicted output
    st.floats(min_value=0.0, max_value=5.0),  # age
    st.one_of(st.none(), st.floats(min_value=-1.0, max_value=20.0)),  # first-token deadline from now
    st.one_of(st.none(), st.floats(min_value=-1.0, max_value=40.0)),  # last-token deadline from now
    st.one_of(st.none(), st.floats(min_value=0.001, max_value=0.2)),  # inter-token target
    st.booleans(),  # best effort
)
_new = st.tuples(
    st.integers(min_value=1, max_value=6000),
    st.floats(min_value=1.0, max_value=500.0),
    st.one_of(st.none(), st.floats(min_value=10.0, max_value=5000.0)),
    st.one_of(st.none(), st.floats(min_value=100.0, max_value=30000.0)),
    st.one_of(st.none(), st.floats(min_value=5.0, max_value=200.0)),
)


def _load(
    runs: list[Run],
) -> EndpointLoad:
    now = 10.0
    rs = [
        running(
            f"x{k}",
            prompt=p,
            out=o,
            dispatched_at=now - age,
            ttft_deadline=None if ttft is None else now + ttft,
            e2e_deadline=None if e2e is None else now + e2e,
            itl_s=itl,
            best_effort=be,
        )
        for k, (p, o, age, ttft, e2e, itl, be) in enumerate(runs)
    ]
    return EndpointLoad(view("e", cap=32, runs=rs), now, P)


def _req(k: int, new: New) -> SchedRequest:
    prompt, out, ttft, e2e, itl = new
    return req(f"r{k}", arrival=9.5, prompt=prompt, out=out, ttft_ms=ttft, e2e_ms=e2e, itl_ms=itl)


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(_run, max_size=10),
    news=st.lists(_new, min_size=1, max_size=4),
    margin=st.sampled_from((0.5, 0.9, 1.0, 1.35)),
    theta=st.sampled_from((0.5, 0.9, 1.0)),
    on_track=st.sampled_from((0.0, 0.2)),
)
def test_the_harm_checks_answer_what_the_list_of_harms_answers(
    runs: list[Run],
    news: list[New],
    margin: float,
    theta: float,
    on_track: float,
) -> None:
    load = _load(runs)  # one load, asked about several requests (its kept terms are reused)
    for k, new in enumerate(news):
        r = _req(k, new)
        harms = load.harm(r, on_track=on_track)
        assert endangers(load, r, margin=margin, on_track=on_track) == bool(
            load.endangered(r, margin=margin, on_track=on_track)
        )
        expected = any(h.target != "itl" and h.delay > h.saved - (1.0 - theta) * h.left for h in harms)
        assert breaks_deadlines(load, r, theta=theta, on_track=on_track) == expected


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(_run, max_size=10),
    news=st.lists(_new, min_size=2, max_size=4),
    deadlines=st.booleans(),
)
def test_best_fit_answers_a_load_it_asked_before_as_a_fresh_one(
    runs: list[Run],
    news: list[New],
    deadlines: bool,
) -> None:
    bf = BestFitFilter(BestFitParams(gamma=0.5, theta=0.9, deadlines=deadlines))
    warm = _load(runs)
    for k, new in enumerate(news):
        r = _req(k, new)
        for reserve in (True, False):
            assert bf.violations(warm, r, reserve=reserve) == bf.violations(_load(runs), r, reserve=reserve)
        assert bf.capacity_norm(warm) == bf.capacity_norm(_load(runs))


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(_run, max_size=10),
    news=st.lists(_new, min_size=1, max_size=3),
    deadlines=st.booleans(),
    gamma=st.sampled_from((0.0, 0.5)),
    theta=st.sampled_from((0.5, 0.9, 1.0)),
)
def test_best_fit_judges_both_reserves_in_one_evaluation_as_in_two(
    runs: list[Run], news: list[New], deadlines: bool, gamma: float, theta: float
) -> None:
    bf = BestFitFilter(BestFitParams(gamma=gamma, theta=theta, deadlines=deadlines))
    load = _load(runs)
    for k, new in enumerate(news):
        r = _req(k, new)
        assert bf.fits_both(load, r) == (bf.fits(load, r), not bf.violations(load, r, reserve=False))


_coef = st.builds(
    lambda k1, c1, k2, c2, c3: dataclasses.replace(COEF, k1=k1, c1=c1, k2=k2, c2=c2, c3=c3),
    st.floats(1e-5, 1e-3),
    st.floats(0.0, 0.05),
    st.floats(0.0, 1e-5),
    st.floats(0.0, 0.01),
    st.floats(0.001, 0.05),
)


@settings(max_examples=300, deadline=None)
@given(
    coefs=st.lists(_coef, min_size=1, max_size=6),
    new=_new,
    now=st.floats(9.5, 40.0),
    tail=st.sampled_from(("mean", "normal")),
)
def test_the_late_recheck_answers_what_asking_every_endpoint_alone_answers(
    coefs: list[PerfCoefficients], new: New, now: float, tail: Literal["mean", "normal"]
) -> None:
    slo = SloPolicy(classes={"c": SloClass("c", on_infeasible=Infeasible.REJECT)}, default_class="c")
    params = SloFeasibilityParams(recheck="late", tail=tail)
    admitter = SloFeasibilityAdmitter(params, slo)
    views = [view(f"e{i}", coef=c) for i, c in enumerate(coefs)]
    r = _req(0, new)
    s = snap(*views, now=now)
    p = params.predict_params()
    left = time_left(r, now)
    alone = any(meets(EndpointLoad(v, now, p).idle_service(r), left) for v in views)
    expected = alone or left == (None, None)
    assert (admitter.recheck(r, s).outcome is AdmitOutcome.ADMIT) == expected


@dataclasses.dataclass
class _Seats:
    seat_free: list[float]
    memo: dict[object, object] = dataclasses.field(default_factory=dict)


@settings(max_examples=300, deadline=None)
@given(
    frees=st.lists(st.lists(st.sampled_from((0.0, 0.5, 1.0, 1.5, 2.0, 7.25)), max_size=5), max_size=6),
    k=st.integers(0, 30),
)
def test_the_kth_free_seat_is_the_kth_of_the_sorted_ends(frees: list[list[float]], k: int) -> None:
    loads = cast("list[EndpointLoad]", [_Seats(sorted(f)) for f in frees])
    ordered = sorted((t, i) for i, load in enumerate(loads) for t in load.seat_free)
    assert kth_free(loads, k) == (ordered[k] if k < len(ordered) else None)


@settings(max_examples=200, deadline=None)
@given(
    frees=st.lists(st.lists(st.sampled_from((0.0, 0.5, 1.0, 1.5, 2.0, 7.25)), max_size=5), max_size=6),
    ks=st.lists(st.integers(0, 30), min_size=1, max_size=5),
)
def test_a_seat_order_asked_again_answers_as_asked_afresh(frees: list[list[float]], ks: list[int]) -> None:
    loads = cast("list[EndpointLoad]", [_Seats(sorted(f)) for f in frees])
    order = SeatOrder(loads)
    assert order.renewed(loads) is order
    assert order.renewed(list(loads)) is order  # the same loads in another list
    for k in ks:
        assert order.kth(k) == kth_free(loads, k)


def _estimates(v: EndpointView) -> EndpointEstimates:
    assert v.estimates is not None
    return v.estimates


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(st.lists(_run, max_size=10), min_size=1, max_size=5),
    coefs=st.lists(_coef, min_size=5, max_size=5),
    news=st.lists(_new, min_size=1, max_size=3),
    cached=st.one_of(st.none(), st.integers(min_value=1, max_value=6000)),
    margin=st.sampled_from((0.5, 0.9, 1.0, 1.35)),
    on_track=st.sampled_from((0.0, 0.2)),
    tail=st.sampled_from(("mean", "normal")),
)
def test_the_loads_spared_are_those_each_load_finds_unendangered(  # noqa: PLR0917
    loads: list[list[Run]],
    coefs: list[PerfCoefficients],
    news: list[New],
    cached: int | None,
    margin: float,
    on_track: float,
    tail: Literal["mean", "normal"],
) -> None:
    """`Sparing` (the request's terms taken once for every candidate) against `endangers` load by load,
    with and without a prefix cached on one of the endpoints, the loads of one cache."""
    params = PredictParams(tail=tail)
    made = [
        EndpointLoad(
            dataclasses.replace(
                _load(runs).view,
                id=EndpointId(f"e{k}"),
                estimates=dataclasses.replace(_estimates(_load(runs).view), perf=coefs[k]),
            ),
            10.0,
            params,
        )
        for k, runs in enumerate(loads)
    ]
    for k, new in enumerate(news):
        r = _req(k, new)
        if cached is not None:
            r = dataclasses.replace(r, cached=PrefixHits({EndpointId("e0"): cached}))
        sparing = Sparing(r, margin=margin, on_track=on_track)
        assert [sparing.spares(load) for load in made] == [
            not endangers(load, r, margin=margin, on_track=on_track) for load in made
        ]
