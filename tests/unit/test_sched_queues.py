"""The queue's heap of stable keys picks exactly what asking every key picks (hypothesis: random pushes,
cancels, serves with requests passed over, preemption requeues with their original place, demotions,
ordering swaps and keys that raise), and its per-class counts equal a walk of the queue."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from gateway.core.slo import SloClass, SloPolicy
from gateway.core.types import SLO, ApiKind, EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.sched.decisions import Dispatch
from gateway.sched.interfaces import Ordering, OrderKey
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.ordering.bands import BandsParams, PriorityBandsOrdering
from gateway.sched.plugins.ordering.edf import EdfOrdering
from gateway.sched.plugins.ordering.fcfs import FcfsOrdering
from gateway.sched.plugins.ordering.slack import SlackOrdering, SlackParams
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.queues import ModelQueue, OrderingFault, Queued, first, stable_keys
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits
from tests.unit.sched_builders import view

SLO_POLICY = SloPolicy(
    classes={
        "ide": SloClass("ide", band=0),
        "chat": SloClass("chat", band=1),
        "batch": SloClass("batch", band=5),
    },
    default_class="chat",
)
SNAP = FleetSnapshot(now=0.0, endpoints=(view("a"),))


class Faulty:
    """A stable ordering (arrival) whose key raises for requests whose id ends in '!'."""

    name = "faulty"
    stable_keys = True

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        if req.id.endswith("!"):
            raise ValueError("no key")
        return (req.arrival,)


def request(rid: str, arrival: float, slo: SLO, *, best_effort: bool = False) -> SchedRequest:
    return SchedRequest(
        id=RequestId(rid),
        model=ModelName("m"),
        api=ApiKind.CHAT,
        arrival=arrival,
        slo=slo,
        prompt_tokens=16,
        max_tokens=None,
        stream=False,
        best_effort=best_effort,
    )


def orderings() -> dict[str, Ordering]:
    return {
        "fcfs": FcfsOrdering(),
        "edf": EdfOrdering(),
        "bands-arrival": PriorityBandsOrdering(BandsParams(within="arrival"), SLO_POLICY),
        "faulty": Faulty(),
    }


@dataclass(frozen=True)
class Push:
    cls: str
    arrival: float  # few values: ties on the key, broken by arrival order
    ttft_ms: float | None
    best_effort: bool
    faulty: bool


@dataclass(frozen=True)
class Serve:
    skips: int  # requests passed over before the one taken (policy.lookahead)
    requeue: bool  # the taken one is preempted back into the queue with its place
    places: int = 1  # requests the serve takes before it ends (skipped ones stay passed over)


@dataclass(frozen=True)
class Cancel:
    pick: int


@dataclass(frozen=True)
class Demote:
    pick: int


@dataclass(frozen=True)
class Swap:
    ordering: str  # serve under another ordering from now on (a policy reload)


ops = st.one_of(
    st.builds(
        Push,
        cls=st.sampled_from(("ide", "chat", "batch", "other")),
        arrival=st.sampled_from((0.0, 1.0, 2.0, 3.0)),
        ttft_ms=st.sampled_from((None, 500.0, 2000.0)),
        best_effort=st.booleans(),
        faulty=st.integers(0, 9).map(lambda n: n == 0),
    ),
    st.builds(Serve, skips=st.integers(0, 5), requeue=st.booleans(), places=st.integers(1, 3)),
    st.builds(Cancel, pick=st.integers(0, 1000)),
    st.builds(Demote, pick=st.integers(0, 1000)),
    st.builds(Swap, ordering=st.sampled_from(("fcfs", "edf", "bands-arrival", "faulty", "slack"))),
)


def scan(ordering: Ordering, queue: ModelQueue, skipped: set[int]) -> Queued | OrderingFault | None:
    try:
        return first(ordering, list(queue), SNAP, skipped)
    except OrderingFault as f:
        return f


def fast(ordering: Ordering, queue: ModelQueue, skipped: set[int]) -> Queued | OrderingFault | None:
    try:
        return queue.first(ordering, SNAP, skipped)
    except OrderingFault as f:
        return f


def same(a: Queued | OrderingFault | None, b: Queued | OrderingFault | None) -> bool:
    if isinstance(a, OrderingFault) and isinstance(b, OrderingFault):
        return a.item is b.item
    return a is b


@pytest.mark.parametrize("name", ["fcfs", "edf", "bands-arrival", "faulty"])
@settings(max_examples=150, deadline=None)
@given(script=st.lists(ops, max_size=60))
def test_the_heap_picks_what_the_scan_picks(name: str, script: list[object]) -> None:
    by_name: dict[str, Ordering] = {**orderings(), "slack": SlackOrdering(SlackParams(queue="scan"))}
    ordering = by_name[name]
    queue = ModelQueue()
    seq = 0
    for op in script:
        if isinstance(op, Push):
            rid = f"r{seq}" + ("!" if op.faulty else "")
            slo = SLO(slo_class=op.cls, ttft_ms=op.ttft_ms)
            req = request(rid, op.arrival, slo, best_effort=op.best_effort)
            queue.push(req, seq, frozenset(), op.arrival)
            seq += 1
        elif isinstance(op, Cancel | Demote) and queue:
            item = list(queue)[op.pick % len(queue)]
            if isinstance(op, Cancel):
                queue.remove(item)
            else:
                queue.set_req(item, dataclasses.replace(item.req, best_effort=True))
        elif isinstance(op, Swap):
            ordering = by_name[op.ordering]
        elif isinstance(op, Serve):
            skipped: set[int] = set()  # one serve's: it goes on past a placement with the same set
            placed = 0
            while True:
                want = scan(ordering, queue, skipped)
                got = fast(ordering, queue, skipped)
                assert same(got, want), (got, want)
                if isinstance(got, OrderingFault):
                    queue.remove(got.item)  # the scheduler rejects it
                    continue
                if got is None:
                    break
                if len(skipped) < op.skips:
                    skipped.add(got.seq)
                    continue
                queue.remove(got)
                if op.requeue:  # preempted: its request again, with its place in arrival order
                    queue.push(dataclasses.replace(got.req, produced_tokens=8), got.seq, frozenset(), 9.0)
                placed += 1
                if placed >= op.places:
                    break
        walked: dict[str, int] = {}
        for item in queue:
            walked[item.req.slo.slo_class] = walked.get(item.req.slo.slo_class, 0) + 1
        assert queue.classes() == walked
        assert all(queue.in_class(c) == n for c, n in walked.items())


def test_which_orderings_declare_stable_keys() -> None:
    assert stable_keys(FcfsOrdering())
    assert stable_keys(EdfOrdering())
    assert stable_keys(PriorityBandsOrdering(BandsParams(within="arrival"), SLO_POLICY))
    assert not stable_keys(PriorityBandsOrdering(BandsParams(), SLO_POLICY))
    assert not stable_keys(SlackOrdering(SlackParams()))


class Counting:
    """fcfs that counts the keys it is asked for."""

    name = "counting"
    stable_keys = True

    def __init__(self) -> None:
        self.asked = 0

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        self.asked += 1
        return (req.arrival,)


def test_a_stable_key_is_asked_once_per_stay_in_the_queue() -> None:
    ordering = Counting()
    queue = ModelQueue()
    reqs = [request(f"r{i}", float(i), SLO()) for i in range(100)]
    for i, r in enumerate(reqs):
        queue.push(r, i, frozenset(), r.arrival)
    for i in range(50):
        got = queue.first(ordering, SNAP, set())
        assert got is not None
        assert got.req is reqs[i]
        queue.remove(got)
    assert ordering.asked == 100
    queue.push(reqs[0], 0, frozenset(), 5.0)  # requeued: asked again, and first again
    got = queue.first(ordering, SNAP, {50})
    assert got is not None
    assert got.req is reqs[0]
    assert ordering.asked == 101


def test_the_scheduler_asks_each_stable_key_once_however_long_the_queue() -> None:
    reg = default_registry()
    ordering = Counting()
    pol = Policy(
        name="counting",
        ordering=ordering,
        profile=SchedulerProfile(
            filters=(),
            scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
            picker=reg.build(PluginKind.PICKER, "max-score", None, path="picker"),
        ),
    )
    clock = FakeClock()
    sched = Scheduler(pol, clock, QueueLimits())
    spec = EndpointSpec(EndpointId("e"), "http://e:8000", EngineKind.VLLM, frozenset({ModelName("m")}), cap=1)
    sched.sync_endpoints([spec])
    sched.set_health(EndpointId("e"), EndpointHealth.READY)
    n = 300
    for i in range(n):  # submitted newest first: arrival order is not submit order
        assert (sched.submit(request(f"r{i}", float(n - i), SLO())) is None) == (i > 0)
    order = []
    running = RequestId("r0")
    for _ in range(n - 1):
        (d,) = sched.complete(running)
        assert isinstance(d, Dispatch)
        running = d.req.id
        order.append(running)
    assert order == [RequestId(f"r{i}") for i in range(n - 1, 0, -1)]
    assert ordering.asked == n - 1  # once each while queued (a submit served alone asks none)
