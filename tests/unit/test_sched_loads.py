"""Endpoint loads kept between decisions (`gateway.sched.loads`): a load remade for its age alone, from
the old one's clock-independent terms, is the load made from scratch, number for number."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.loads import LoadCache
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.running import RunningRequest, with_progress
from tests.unit.slo_fixtures import running, view

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
