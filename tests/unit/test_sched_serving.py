"""The ready endpoints of a model listed once per tuple of views (`FleetSnapshot.ready`): the same
answers as the plain lists each plugin made for itself, shared by the snapshots of the same views only,
and the plugins that read it deciding as before."""

from __future__ import annotations

import dataclasses
import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, EngineKind, ModelName, RequestId
from gateway.sched.columns import columns_of
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.admission.ready import ReadySeats
from gateway.sched.plugins.placement.demand_split import DemandSplitFilter, DemandSplitParams
from gateway.sched.prediction import seats_of
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import PluginKind
from gateway.sched.running import RunningRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView, FleetSnapshot, ReadyServing, ViewsMemo
from gateway.sched.types import EndpointSpec, QueueLimits
from tests.unit.sched_builders import request, view

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
    """From the memo's list, the columns, both (the memo's list is read) or neither, fleet after fleet
    (one filter per way, so what each keeps between fleets is read too): the sorted ids of the ready
    endpoints serving the model."""
    ways = ((True, False), (False, False), (False, True), (True, True))  # (memo, columns)
    splits = [DemandSplitFilter(DemandSplitParams(groups={"a": ["x"], "b": ["y"]})) for _ in ways]
    for views in fleets:
        cols = columns_of(views)
        want = tuple(
            sorted((e.id for e in views if M in e.models and e.health == EndpointHealth.READY), key=str)
        )
        for split, (memo, columns) in zip(splits, ways, strict=True):
            snap = FleetSnapshot(
                0.0,
                views,
                columns=cols if columns else None,
                memo=ViewsMemo.of(views, None) if memo else None,
            )
            assert split._ready(M, snap) == want


def _same_lists(got: ReadyServing, views: tuple[EndpointView, ...]) -> None:
    """`got` lists what a walk of every view lists (the same view objects), with the plain counts."""
    want = ReadyServing(M, views)
    assert len(got.endpoints) == len(want.endpoints)
    assert all(a is b for a, b in zip(got.endpoints, want.endpoints, strict=True))
    assert (got.free, got.roomy) == (want.free, want.roomy)
    assert len(got.open) == len(want.open)
    assert all(a is b for a, b in zip(got.open, want.open, strict=True))
    assert got.ids() == tuple(e.id for e in want.endpoints)
    for n in (1, 3):
        ready = want.endpoints
        fewest = heapq.nsmallest(n, ready, key=lambda e: e.inflight - e.cap) if len(ready) > n else ready
        assert len(got.fewest_taken(n)) == len(fewest)
        assert all(a is b for a, b in zip(got.fewest_taken(n), fewest, strict=True))
    plain = any(M in e.models and e.health is EndpointHealth.READY and e.has_room for e in views)
    assert (got.roomy > 0) is plain


@st.composite
def _replacements(draw: st.DrawFn) -> tuple[tuple[EndpointView, ...], list[dict[int, EndpointView]]]:
    """A tuple of views, and rounds of views replaced at a few places (the same endpoint, new numbers)."""
    views = draw(_views())
    rounds: list[dict[int, EndpointView]] = []
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.sets(st.integers(0, max(0, len(views) - 1)), max_size=3)) if views else set()
        rounds.append(
            {
                i: dataclasses.replace(
                    views[i],
                    health=draw(st.sampled_from([views[i].health, EndpointHealth.READY])),
                    cap=draw(st.integers(0, 6)),
                    inflight=draw(st.integers(0, 8)),
                    max_batch=draw(st.none() | st.integers(0, 8)),
                    running=_running(draw(st.integers(0, 8))),
                )
                for i in at
            }
        )
    return views, rounds


@settings(max_examples=300, deadline=None)
@given(_replacements())
def test_a_list_carried_over_to_replaced_views_is_the_plain_list(
    case: tuple[tuple[EndpointView, ...], list[dict[int, EndpointView]]],
) -> None:
    """`ReadyServing.after`, round after round, lists what a walk of the new views lists; None only
    when an endpoint joined or left the list."""
    views, rounds = case
    serving = ReadyServing(M, views)
    for replaced in rounds:
        new = tuple(replaced.get(i, v) for i, v in enumerate(views))
        got = serving.after(M, views, new, replaced)
        member = [M in e.models and e.health is EndpointHealth.READY for e in views]
        moved = any(
            member[i] != (M in v.models and v.health is EndpointHealth.READY) for i, v in replaced.items()
        )
        assert (got is None) is moved
        serving = ReadyServing(M, new) if got is None else got
        _same_lists(serving, new)
        views = new


def _busy(e: EndpointView) -> bool:
    return len(e.running) > 2 and e.health is EndpointHealth.READY


@settings(max_examples=300, deadline=None)
@given(_replacements())
def test_places_carried_over_to_replaced_views_are_the_plain_places(
    case: tuple[tuple[EndpointView, ...], list[dict[int, EndpointView]]],
) -> None:
    """`ViewsMemo.places`, carried over memo after memo at the replaced places, are the places a test
    of every view finds; kept per key (by identity)."""
    views, rounds = case
    memo = ViewsMemo.of(views, None)
    key = (object(),)
    assert memo.places(key, _busy) == [i for i, e in enumerate(views) if _busy(e)]
    assert memo.places(key, _busy) is memo.places(key, _busy)
    for replaced in rounds:
        new = tuple(replaced.get(i, v) for i, v in enumerate(views))
        memo = ViewsMemo.of(new, memo, set(replaced))
        assert memo.places(key, _busy) == [i for i, e in enumerate(new) if _busy(e)]
        snap = FleetSnapshot(0.0, new, memo=memo)
        assert snap.places(key, _busy) is memo.places(key, _busy)
        assert FleetSnapshot(0.0, new).places(key, _busy) is None  # no memo: the caller tests each
        views = new


def _spec(i: int) -> EndpointSpec:
    return EndpointSpec(EndpointId(f"e{i}"), f"http://e{i}", EngineKind.VLLM, frozenset({M}), cap=3)


def _policy() -> Policy:
    reg = default_registry()
    return Policy(
        name="t",
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="ordering"),
        profile=SchedulerProfile(
            filters=(),
            scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
            picker=reg.build(PluginKind.PICKER, "max-score", None, path="picker"),
        ),
    )


_fleet_events = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "complete", "health", "cap", "time", "sync", "ask"]), st.integers(0, 40)
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 12), events=_fleet_events)
def test_the_scheduler_memo_carried_over_is_the_plain_list(n: int, events: list[tuple[str, int]]) -> None:
    """The memo a snapshot takes (`SchedulerBooks.snapshot`: carried over from the last one at the places
    the fleet replaced, `Fleet.replaced`) lists what a walk of the snapshot's views lists, and answers
    `has_room` as the walk does, whatever happened in between (dispatches, completions, health and cap
    changes, gauges gone stale, the endpoint set changed, snapshots not asked about the model)."""
    clock = FakeClock()
    books = Scheduler(_policy(), clock, QueueLimits(stale_after_s=1.0))
    fleet = books._fleet
    fleet.sync([_spec(i) for i in range(n)])
    for eid in fleet.ids():
        fleet.set_health(eid, EndpointHealth.READY)
    running: list[RequestId] = []
    for kind, k in events:
        ids = fleet.ids()
        if kind == "dispatch" and ids:
            req = request(f"r{len(running)}-{k}")
            fleet.dispatch(ids[k % len(ids)], req, clock.now())
            running.append(req.id)
        elif kind == "complete" and running:
            fleet.complete(running.pop(k % len(running)))
        elif kind == "health" and ids:
            fleet.set_health(ids[k % len(ids)], EndpointHealth.READY if k % 3 else EndpointHealth.UNHEALTHY)
        elif kind == "cap" and ids:
            fleet.set_cap(ids[k % len(ids)], k % 5 + 1)
        elif kind == "time":
            fleet.observe_gauges(ids[k % len(ids)], EngineGauges(running=1.0, waiting=0.0), clock.now())
            clock.advance(0.4 * (k % 4))
        elif kind == "sync":
            fleet.sync([_spec(i) for i in range(k % 12 + 1)])
        snap = books.snapshot()
        plain = any(M in e.models and e.health is EndpointHealth.READY and e.has_room for e in snap.endpoints)
        assert snap.has_room(M) is plain  # the memo's list when it has one, else the walk
        if kind == "ask" or k % 3 == 0:
            _same_lists(snap.ready(M), snap.endpoints)
            assert snap.has_room(M) is (snap.ready(M).roomy > 0)
            assert snap.places((M,), _busy) == [i for i, e in enumerate(snap.endpoints) if _busy(e)]
