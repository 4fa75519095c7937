"""What predictions keep between decisions: a load remade for its age alone, from the old one's
clock-independent terms, is the load made from scratch, number for number (`gateway.sched.loads`); a
fleet's idle bound kept across snapshots is the one collected afresh (`gateway.sched.idle.KeptBounds`)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.idle import KeptBounds, fleet_bound
from gateway.sched.loads import LoadCache
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.sched.predict import EndpointLoad, Prediction, PredictParams, running_states
from gateway.sched.prediction import seats_of
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest, prefill_tokens, resume_prompt_tokens, with_progress
from gateway.sched.snapshot import EndpointEstimates, FleetSnapshot
from tests.unit.slo_fixtures import req, running, view

_run = st.tuples(
    st.integers(min_value=1, max_value=4000),  # prompt
    st.floats(min_value=1.0, max_value=400.0),  # predicted output
    st.floats(min_value=0.0, max_value=80.0),  # its spread
    st.floats(min_value=0.0, max_value=5.0),  # age
    st.one_of(st.none(), st.integers(min_value=1, max_value=300)),  # max_tokens
    st.one_of(st.none(), st.integers(min_value=0, max_value=300)),  # tokens reported
    st.integers(min_value=0, max_value=3000),  # cached prompt tokens
)


def _numbers(load: EndpointLoad) -> tuple[object, ...]:
    states = tuple(
        (s.req, s.prefilled, s.produced, s.remaining, s.finish_s, s.first_s, s.long) for s in load.running
    )
    return (
        load.n,
        load.overhead,
        load.ctx_sum,
        load.pending_prompt,
        load.running_long,
        load.tpot_now,
        load.wait_s,
        tuple(load.seat_free),
        states,
    )


def _runs(runs: list[tuple[int, float, float, float, int | None, int | None, int]]) -> list[RunningRequest]:
    now = 10.0
    out = []
    for k, (p, o, std, age, mt, reported, cached) in enumerate(runs):
        r = dataclasses.replace(
            running(f"x{k}", prompt=p, out=o, std=std, dispatched_at=now - age),
            max_tokens=mt,
            cached_tokens=cached,
        )
        if reported is not None:
            r = with_progress(r, reported, now - age + 0.2, now - age / 2)
        out.append(r)
    return out


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(_run, max_size=12),
    later=st.floats(min_value=0.0, max_value=3.0),
    cap=st.integers(min_value=1, max_value=16),
    tail=st.sampled_from(("mean", "normal", "cantelli")),
)
def test_a_load_remade_later_is_the_load_made_afresh(
    runs: list[tuple[int, float, float, float, int | None, int | None, int]],
    later: float,
    cap: int,
    tail: str,
) -> None:
    params = PredictParams(tail=tail, tau=0.05, prefill_overhead=0.05)  # type: ignore[arg-type]
    v = view("e", cap=cap, runs=_runs(runs))
    old = EndpointLoad(v, 10.0, params)
    assert _numbers(EndpointLoad(v, 10.0 + later, params, like=old)) == _numbers(
        EndpointLoad(v, 10.0 + later, params)
    )
    # a view apart only in what no load reads: new gauges, new measured EWMAs
    assert v.estimates is not None
    gauged = dataclasses.replace(
        v, engine_waiting=3.0, estimates=dataclasses.replace(v.estimates, ttft_ewma_s=0.5)
    )
    assert _numbers(EndpointLoad(gauged, 10.0 + later, params, like=old)) == _numbers(
        EndpointLoad(gauged, 10.0 + later, params)
    )
    # ... and one whose running requests changed (a progress report): nothing is taken over wrongly
    if v.running:
        moved = dataclasses.replace(v, running=(with_progress(v.running[0], 7, 9.0, 9.5), *v.running[1:]))
        assert _numbers(EndpointLoad(moved, 10.0 + later, params, like=old)) == _numbers(
            EndpointLoad(moved, 10.0 + later, params)
        )


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(_run, max_size=12),
    cap=st.integers(min_value=1, max_value=16),
    first=st.sampled_from(("seat_free", "running")),
)
def test_the_ends_made_when_asked_are_the_running_states_ends(
    runs: list[tuple[int, float, float, float, int | None, int | None, int]], cap: int, first: str
) -> None:
    """A load makes its running requests' sorted ends (`seat_free`) only when asked for them or when a
    full endpoint's wait needs them: whichever is asked first, they are the running states' predicted
    ends, sorted, and the wait is the one they give."""
    params = PredictParams(tail="normal", tau=0.05, prefill_overhead=0.05)
    load = EndpointLoad(view("e", cap=cap, runs=_runs(runs)), 10.5, params)
    if first == "seat_free":
        ends = list(load.seat_free)
        states = load.running
    else:
        states = load.running
        ends = list(load.seat_free)
    assert ends == sorted(s.finish_s for s in states)
    seats = load.seats
    expected = ends[load.n - seats] + 0.5 * load.tpot_now if load.n >= seats else 0.5 * load.tpot_now
    assert load.wait_s == expected
    assert load.guessed == (load.coef == default_prior())


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(_run, max_size=12),
    cap=st.integers(min_value=1, max_value=16),
    max_batch=st.one_of(st.none(), st.integers(min_value=0, max_value=20)),
    kv=st.one_of(st.none(), st.floats(min_value=1.0, max_value=1e6)),
    prior=st.booleans(),
)
def test_a_loads_spelled_out_terms_are_their_sources(
    runs: list[tuple[int, float, float, float, int | None, int | None, int]],
    cap: int,
    max_batch: int | None,
    kv: float | None,
    prior: bool,
) -> None:
    """`EndpointLoad` writes out `view.perf`, `view.kv_capacity_tokens`, `seats_of` and `decode_iter_s`
    (a load is made per endpoint every 100-200 ms on a busy fleet): each is what its source gives."""
    v = dataclasses.replace(view("e", cap=cap, runs=_runs(runs), kv=kv), max_batch=max_batch)
    if prior:
        v = dataclasses.replace(v, estimates=None)
    load = EndpointLoad(v, 10.5, PredictParams(tail="normal", tau=0.05, prefill_overhead=0.05))
    assert load.coef == (v.perf or default_prior())
    assert load.kv_capacity == v.kv_capacity_tokens
    assert load.seats == seats_of(v)
    n = load.n
    want = load.coef.decode_iter_s(n, load.ctx_sum / n) * (1.0 + load.overhead) if n else 0.0
    assert load.tpot_now == want


def _predicted(load: EndpointLoad, r: SchedRequest, *, worst_case: bool) -> Prediction:
    """`EndpointLoad.predict` through the coefficients' own methods (the reference)."""
    out = load.output_tokens(r)
    p = float(resume_prompt_tokens(r))
    ttft = load.wait_s + load.coef.prefill_s(prefill_tokens(r, load.view.id) + load.pending_prompt)
    b = float(load.seats) if worst_case else float(min(load.n + 1, load.seats))
    tpot = load.tpot(b, (load.ctx_sum + p + 0.5 * out) / (load.n + 1))
    return Prediction(load.wait_s, ttft, ttft + max(0.0, out - 1.0) * tpot, tpot, out)


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(_run, max_size=12),
    cap=st.integers(min_value=1, max_value=16),
    prompt=st.integers(min_value=1, max_value=4000),
    out=st.one_of(st.none(), st.floats(min_value=0.0, max_value=500.0)),
    worst_case=st.booleans(),
)
def test_a_prediction_is_the_one_the_coefficients_give(
    runs: list[tuple[int, float, float, float, int | None, int | None, int]],
    cap: int,
    prompt: int,
    out: float | None,
    worst_case: bool,
) -> None:
    params = PredictParams(tail="normal", tau=0.05, prefill_overhead=0.05)
    load = EndpointLoad(view("e", cap=cap, runs=_runs(runs)), 10.5, params)
    r = req(prompt=prompt, out=out)
    assert load.predict(r, worst_case=worst_case) == _predicted(load, r, worst_case=worst_case)


def test_the_cache_reuses_a_load_then_remakes_it_from_the_old_one() -> None:
    params = PredictParams()
    v = view("e", cap=4, runs=_runs([(500, 100.0, 0.0, 1.0, None, None, 0)]))
    cache = LoadCache(params)
    first = cache.load(v, 10.0)
    assert cache.load(v, 10.01) is first  # within its reuse time
    later = cache.load(v, 11.0)
    assert later is not first
    assert later.now == 11.0
    assert _numbers(later) == _numbers(EndpointLoad(v, 11.0, params))


_COEFS = (
    None,
    PerfCoefficients(
        k1=1e-4, c1=0.01, k2=0.0, c2=0.001, c3=0.01, h=1.0, j=0.0, thr1=1.0, alpha=0.0, beta=0.0
    ),
    PerfCoefficients(
        k1=2e-4, c1=0.02, k2=1e-7, c2=0.002, c3=0.01, h=1.0, j=8.0, thr1=1.0, alpha=0.0, beta=0.0
    ),
)
# (endpoint index, what changes: its estimates to coefficients k, its health, its models, or only its
# running requests)
_change = st.tuples(
    st.integers(min_value=0, max_value=5),
    st.sampled_from(("estimates", "health", "models", "progress")),
    st.integers(min_value=0, max_value=len(_COEFS) - 1),
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=1, max_value=6), changes=st.lists(_change, max_size=12))
def test_kept_bounds_are_the_fleet_bound_of_every_snapshot(
    n: int, changes: list[tuple[int, str, int]]
) -> None:
    views = [view(f"e{i}", coef=_COEFS[1]) for i in range(n)]
    kept = KeptBounds()
    for at, what, k in [(0, "progress", 0), *changes]:
        i = at % n
        v = views[i]
        if what == "estimates":
            v = dataclasses.replace(v, estimates=EndpointEstimates(perf=_COEFS[k]))
        elif what == "health":
            ready = v.health is EndpointHealth.READY
            v = dataclasses.replace(v, health=EndpointHealth.UNHEALTHY if ready else EndpointHealth.READY)
        elif what == "models":
            v = dataclasses.replace(v, models=frozenset({ModelName("m" if k else "other")}))
        else:
            v = dataclasses.replace(v, inflight=v.inflight + 1)
        views[i] = v
        s = FleetSnapshot(now=1.0, endpoints=tuple(views))
        for slowest in (False, True):
            assert kept.bound(s, ModelName("m"), slowest=slowest) == fleet_bound(
                s, ModelName("m"), slowest=slowest
            )


def test_a_load_with_nothing_running_is_kept_while_its_view_is() -> None:
    cache = LoadCache(PredictParams())
    idle = view("e", cap=4)
    first = cache.load(idle, 10.0)
    assert cache.load(idle, 50.0) is first  # its numbers do not move with the clock: renewed
    assert _numbers(first) == _numbers(EndpointLoad(idle, 50.0, PredictParams()))
    assert cache.load(view("e", cap=4), 50.0) is first  # a new view of the same numbers: the same load
    busy = view("e", cap=4, runs=[running("r", dispatched_at=49.0)])
    assert cache.load(busy, 50.0) is not first  # a dispatch: a new load


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(_run, max_size=12),
    later=st.floats(min_value=0.0, max_value=3.0),
    tails=st.lists(st.sampled_from(("mean", "normal", "cantelli")), min_size=1, max_size=3),
)
def test_a_loads_running_states_are_those_running_states_gives(
    runs: list[tuple[int, float, float, float, int | None, int | None, int]],
    later: float,
    tails: list[str],
) -> None:
    # A load reads its running requests through the terms kept on its pace (`request_terms`, made
    # once per coefficients and gamma): loads of one pace at other times, after a progress report, and
    # for other parameters give the states `running_states` gives from the records themselves.
    v = view("e", cap=8, runs=_runs(runs))
    coef = v.perf or default_prior()
    pace = None
    for k, tail in enumerate(tails):
        params = PredictParams(tail=tail, tau=0.05, prefill_overhead=0.05)  # type: ignore[arg-type]
        seen = v
        if v.running and k % 2:
            seen = dataclasses.replace(v, running=(with_progress(v.running[0], 7, 9.0, 9.5), *v.running[1:]))
        now = 10.0 + later * k
        load = EndpointLoad(seen, now, params, pace=pace)
        pace = load.pace
        plain = running_states(
            seen.running, pace.fresh, now, guess=pace.guess, k1=coef.k1, c1=coef.c1, gamma=params.gamma
        )
        assert (load.states, load.pending_prompt, load.ctx_sum, load.running_long) == plain


# (endpoint asked about: its index; whether its view gets a progress report first; the clock's step)
_ask = st.tuples(
    st.lists(st.integers(min_value=0, max_value=4), max_size=6),
    st.integers(min_value=-1, max_value=4),
    st.sampled_from((0.0, 0.0, 0.05, 0.3)),
)


@settings(max_examples=200, deadline=None)
@given(asks=st.lists(_ask, max_size=10))
def test_loads_asked_again_about_the_same_views_are_the_loads_asked_afresh(
    asks: list[tuple[list[int], int, float]],
) -> None:
    # The filters of a placement ask in turn about the same views (new lists) at the same time: the
    # second answer is the first one's loads, and is what a cache asking afresh gives, step by step.
    params = PredictParams()
    views = [view(f"e{k}", cap=4, runs=_runs([(500, 100.0, 0.0, 1.0 + k, None, None, 0)])) for k in range(5)]
    kept, fresh = LoadCache(params), LoadCache(params)
    now = 10.0
    for picked, moved, step in asks:
        now += step
        if moved >= 0 and views[moved].running:
            v = views[moved]
            views[moved] = dataclasses.replace(
                v, running=(with_progress(v.running[0], 3, 9.5, now), *v.running[1:])
            )
        asked = [views[k] for k in dict.fromkeys(picked)]
        for _ in range(2):
            got = kept.loads(list(asked), now, keep=False)
            fresh._asked = None  # (asks afresh every time)
            want = fresh.loads(list(asked), now, keep=False)
            assert [_numbers(load) for load in got] == [_numbers(load) for load in want]
            assert all(load is kept.load(v, now) for load, v in zip(got, asked, strict=True))
            # (and each is the load of its own view made afresh at its time: a load remade from an
            # older one took over only what its view gives)
            assert [_numbers(load) for load in got] == [
                _numbers(EndpointLoad(load.view, load.now, params)) for load in got
            ]
