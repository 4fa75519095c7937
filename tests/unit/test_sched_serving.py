"""The ready endpoints of a model listed once per tuple of views (`FleetSnapshot.ready`): the same
answers as the plain lists each plugin made for itself, shared by the snapshots of the same views only,
and the plugins that read it deciding as before."""

from __future__ import annotations

import dataclasses
import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointHealth, EndpointId, ModelName, RequestId
from gateway.sched.plugins.admission.ready import ReadySeats
from gateway.sched.plugins.placement.demand_split import DemandSplitFilter, DemandSplitParams
from gateway.sched.prediction import seats_of
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot, ReadyServing, ViewsMemo
from tests.unit.sched_builders import view

M = ModelName("m")


def _running(n: int) -> tuple[RunningRequest, ...]:
    return tuple(
        RunningRequest(RequestId(f"r{i}"), "c", 16, 8.0, 0.0, None, 0.0, None, None, None) for i in range(n)
    )


@st.composite
def _views(draw: st.DrawFn) -> tuple[EndpointView, ...]:
    n = draw(st.integers(0, 12))
    out = []
    for i in range(n):
        cap = draw(st.integers(0, 6))
        v = view(
            f"e{draw(st.integers(0, 30))}-{i}",
            models=draw(st.sampled_from([("m",), ("x",), ("m", "x")])),
            health=draw(st.sampled_from(list(EndpointHealth))),
            cap=cap,
            inflight=draw(st.integers(0, 8)),
        )
        out.append(
            dataclasses.replace(
                v,
                max_batch=draw(st.none() | st.integers(0, 8)),
                running=_running(draw(st.integers(0, 8))),
            )
        )
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(_views(), st.integers(1, 6))
def test_ready_serving_is_the_plain_lists(views: tuple[EndpointView, ...], n: int) -> None:
    got = ReadyServing(M, views)
    ready = [e for e in views if M in e.models and e.health is EndpointHealth.READY]
    assert got.endpoints == ready
    assert got.free == sum(max(0, seats_of(e) - len(e.running)) for e in ready)
    assert got.open == [e for e in ready if len(e.running) < seats_of(e)]
    want = heapq.nsmallest(n, ready, key=lambda e: e.inflight - e.cap) if len(ready) > n else ready
    assert [e.id for e in got.fewest_taken(n)] == [e.id for e in want]
    assert all(a is b for a, b in zip(got.fewest_taken(n), want, strict=True))
    assert got.ids() == tuple(e.id for e in ready)


@settings(max_examples=100, deadline=None)
@given(_views())
def test_admission_seats_read_the_shared_list(views: tuple[EndpointView, ...]) -> None:
    seats = ReadySeats(M, FleetSnapshot(0.0, views, memo=ViewsMemo.of(views, None)))
    ready = [e for e in views if M in e.models and e.health is EndpointHealth.READY]
    assert seats.views() == ready
    assert seats.any == bool(ready)
    assert seats.free == sum(max(0, seats_of(e) - len(e.running)) for e in ready)
    assert list(seats.open()) == [e for e in ready if len(e.running) < seats_of(e)]


def test_shared_by_the_snapshots_of_the_same_views_only() -> None:
    views = (view("a"), view("b", inflight=8), view("c", health=EndpointHealth.UNHEALTHY))
    memo = ViewsMemo.of(views, None)
    assert ViewsMemo.of(views, memo) is memo
    first = FleetSnapshot(1.0, views, {M: 3}, memo=memo)
    second = FleetSnapshot(2.0, views, {M: 4}, memo=memo)
    assert first.ready(M) is second.ready(M)
    # a snapshot cut to part of the fleet carries the memo along but lists its own endpoints
    cut = dataclasses.replace(first, endpoints=views[1:])
    assert [e.id for e in cut.ready(M).endpoints] == [EndpointId("b")]
    assert [e.id for e in first.ready(M).endpoints] == [EndpointId("a"), EndpointId("b")]
    # other views: another memo
    other = (view("a"),)
    assert ViewsMemo.of(other, memo) is not memo
    # without a memo: made for the call
    bare = FleetSnapshot(1.0, views)
    assert bare.ready(M) is not bare.ready(M)


@settings(max_examples=100, deadline=None)
@given(st.lists(_views(), min_size=1, max_size=4))
def test_demand_split_ready_is_the_sorted_ids(fleets: list[tuple[EndpointView, ...]]) -> None:
    split = DemandSplitFilter(DemandSplitParams(groups={"a": ["x"], "b": ["y"]}))
    for views in fleets:
        for snap in (FleetSnapshot(0.0, views, memo=ViewsMemo.of(views, None)), FleetSnapshot(0.0, views)):
            got = split._ready(M, snap)
            want = tuple(
                sorted(
                    (e.id for e in views if M in e.models and e.health == EndpointHealth.READY),
                    key=str,
                )
            )
            assert got == want
