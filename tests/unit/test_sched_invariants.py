"""Scheduler invariants over random event sequences on a random fleet (hypothesis).

A ledger replays every decision the scheduler hands out and checks after each event that
(1) no endpoint is over its cap or below zero, (2) every request moves queued -> running -> completed,
or queued -> rejected, or queued -> cancelled, each step exactly once, and ends in one of those, and
(3) each endpoint's in-flight count equals the requests the ledger saw dispatched there and not completed.

Events are submits (some retries with `exclude`, some pinned to one endpoint by a request-specific filter,
so a queue's head can wait while others could run), completes, cancels, ticks that move the fake clock,
health changes, and endpoints removed from and added back to the set.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineKind,
    ModelName,
    RequestId,
)
from gateway.sched.decisions import Decision, Dispatch, Preempt, Reject
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import BuildContext, PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits

MODELS = (ModelName("m"), ModelName("n"))
MAX_WAIT_S = 5.0


class State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


TERMINAL = {State.COMPLETED, State.REJECTED, State.CANCELLED}


# ----------------------------------------------------------------- events
@dataclass(frozen=True)
class Submit:
    model: int
    exclude: int | None  # index of an endpoint a retry must avoid
    # The only endpoint the request may run on (see PinFilter), as an index into the endpoints with the
    # fullest first: small indexes pin to a busy endpoint, which is what makes a queue wait.
    pin: int | None


@dataclass(frozen=True)
class Complete:
    pick: int  # index into the running requests


@dataclass(frozen=True)
class Cancel:
    pick: int  # index into the queued requests, or into every request seen so far
    queued_only: bool


@dataclass(frozen=True)
class Tick:
    advance_s: float


@dataclass(frozen=True)
class SetHealth:
    endpoint: int
    health: EndpointHealth


@dataclass(frozen=True)
class Toggle:
    endpoint: int  # remove it from the endpoint set, or add it back


Event = Submit | Complete | Cancel | Tick | SetHealth | Toggle

_index = st.integers(0, 7)  # taken modulo the size of whatever it indexes
_submit = st.builds(Submit, st.sampled_from([0, 0, 1]), st.none() | _index, st.none() | _index)
# Weighted towards the events that build up and reshuffle a queue.
events = st.one_of(
    _submit,
    _submit,
    st.builds(Cancel, _index, st.booleans()),
    st.builds(Cancel, _index, st.just(True)),
    st.builds(Complete, _index),
    st.builds(Tick, st.sampled_from([0.0, 1.0, 2.5, MAX_WAIT_S + 1])),
    st.builds(SetHealth, _index, st.sampled_from(list(EndpointHealth))),
    st.builds(Toggle, _index),
)


@st.composite
def fleets(draw: st.DrawFn) -> list[EndpointSpec]:
    n = draw(st.integers(1, 3))
    return [
        EndpointSpec(
            id=EndpointId(f"e{i}"),
            url=f"http://e{i}:8000",
            engine=EngineKind.VLLM,
            # Every endpoint serves the first model, so endpoints compete for one queue.
            models=frozenset({MODELS[0], *draw(st.sets(st.sampled_from(MODELS[1:])))}),
            cap=draw(st.integers(1, 2)),
        )
        for i in range(n)
    ]


@dataclass
class PinFilter:
    """A request-specific filter (like an instance-class or cache-affinity one): a pinned request may run
    only on its endpoint, so the head of a queue can wait while the requests behind it could run."""

    pins: dict[RequestId, EndpointId]
    name: str = "pin"

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        pin = self.pins.get(req.id)
        return [e for e in candidates if pin is None or e.id == pin]


def build_policy(picker: str, seed: int, pins: dict[RequestId, EndpointId]) -> Policy:
    reg = default_registry()
    ctx = BuildContext(seed=seed)
    return Policy(
        name=picker,
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="ordering"),
        profile=SchedulerProfile(
            filters=(PinFilter(pins),),
            scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
            picker=reg.build(PluginKind.PICKER, picker, None, path="picker", ctx=ctx),
        ),
    )


# ----------------------------------------------------------------- the ledger
@dataclass
class Ledger:
    sched: Scheduler
    clock: FakeClock
    specs: list[EndpointSpec]
    present: set[EndpointId]
    pins: dict[RequestId, EndpointId]
    state: dict[RequestId, State] = field(default_factory=dict)
    model: dict[RequestId, ModelName] = field(default_factory=dict)
    # Where a request runs: endpoint and that endpoint's generation (bumped when it is added back).
    where: dict[RequestId, tuple[EndpointId, int]] = field(default_factory=dict)
    generation: Counter[EndpointId] = field(default_factory=Counter)

    def apply(self, decisions: list[Decision]) -> None:
        snap = self.sched.snapshot()
        for d in decisions:
            assert not isinstance(d, Preempt), "the policy here never preempts"
            rid = d.req.id
            assert self.state.get(rid) is State.QUEUED, f"{d!r} for a request that is {self.state.get(rid)}"
            if isinstance(d, Dispatch):
                ep = d.endpoint
                assert ep.id in self.present, f"dispatched to removed endpoint {ep.id}"
                assert ep.health is EndpointHealth.READY, ep
                assert d.req.model in ep.models, ep
                assert ep.has_room, ep
                assert self.pins.get(rid, ep.id) == ep.id
                assert self.sched.running_on(rid) == ep.id
                assert snap.get(ep.id) is not None
                self.state[rid] = State.RUNNING
                self.where[rid] = (ep.id, self.generation[ep.id])
            else:
                assert isinstance(d, Reject)
                assert d.error.status in (429, 503)
                self.state[rid] = State.REJECTED

    def step(self, ev: Event) -> None:
        if isinstance(ev, Submit):
            rid = RequestId(f"r{len(self.state):03d}")  # sorted ids are arrival order
            req = SchedRequest(
                id=rid,
                model=MODELS[ev.model],
                api=ApiKind.CHAT,
                arrival=self.clock.now(),
                slo=SLO(),
                prompt_tokens=8,
                max_tokens=None,
                stream=False,
            )
            exclude = frozenset() if ev.exclude is None else frozenset({self._spec(ev.exclude).id})
            if ev.pin is not None:
                by_load = sorted(self.sched.snapshot().endpoints, key=lambda e: (e.has_room, e.id))
                if by_load:
                    self.pins[rid] = by_load[ev.pin % len(by_load)].id
            self.state[rid] = State.QUEUED
            self.model[rid] = req.model
            d = self.sched.submit(req, exclude=exclude)
            if d is not None:
                assert not isinstance(d, Preempt)
                assert d.req.id == rid, "submit decides for its own request only"
                self.apply([d])
        elif isinstance(ev, Complete):
            running = sorted(r for r, s in self.state.items() if s is State.RUNNING)
            if running:
                rid = running[ev.pick % len(running)]
                self.state[rid] = State.COMPLETED
                self.apply(self.sched.complete(rid))
        elif isinstance(ev, Cancel):
            pool = sorted(r for r, s in self.state.items() if s is State.QUEUED or not ev.queued_only)
            if pool:
                rid = pool[ev.pick % len(pool)]
                was_queued = self.state[rid] is State.QUEUED
                assert self.sched.cancel(rid) is was_queued
                if was_queued:
                    self.state[rid] = State.CANCELLED
        elif isinstance(ev, Tick):
            self.clock.advance(ev.advance_s)
            self.apply(self.sched.tick())
        elif isinstance(ev, SetHealth):
            self.apply(self.sched.set_health(self._spec(ev.endpoint).id, ev.health))
        else:
            eid = self._spec(ev.endpoint).id
            if eid in self.present:
                self.present.discard(eid)
            else:
                self.present.add(eid)
                self.generation[eid] += 1
            self.apply(self.sched.sync_endpoints([s for s in self.specs if s.id in self.present]))

    def _spec(self, i: int) -> EndpointSpec:
        return self.specs[i % len(self.specs)]

    def check(self) -> None:
        snap = self.sched.snapshot()
        assert {e.id for e in snap.endpoints} == self.present
        for e in snap.endpoints:
            here = [
                r
                for r, s in self.state.items()
                if s is State.RUNNING and self.where[r] == (e.id, self.generation[e.id])
            ]
            assert 0 <= e.inflight <= e.cap, e  # (1)
            assert e.inflight == len(here), (e.id, e.inflight, here)  # (3)
        queued = Counter(self.model[r] for r, s in self.state.items() if s is State.QUEUED)
        assert {m: n for m, n in self.sched.queue_depths().items() if n} == dict(queued)

    def drain(self) -> None:
        """Let everything finish: every request must end up in exactly one terminal state."""
        for _ in range(len(self.state) + 1):
            for eid in sorted(self.present):
                self.apply(self.sched.set_health(eid, EndpointHealth.READY))
            running = sorted(r for r, s in self.state.items() if s is State.RUNNING)
            if not running:
                break
            for rid in running:
                self.state[rid] = State.COMPLETED
                self.apply(self.sched.complete(rid))
            self.check()
        self.clock.advance(MAX_WAIT_S + 1)
        self.apply(self.sched.tick())
        self.check()
        assert all(s in TERMINAL for s in self.state.values()), self.state  # (2)
        assert all(e.inflight == 0 for e in self.sched.snapshot().endpoints)
        assert not any(self.sched.queue_depths().values())


def run(specs: list[EndpointSpec], picker: str, seed: int, max_queue: int, script: list[Event]) -> None:
    clock = FakeClock()
    limits = QueueLimits(max_queue_per_model=max_queue, max_wait_s=MAX_WAIT_S, retry_after_s=1.0)
    pins: dict[RequestId, EndpointId] = {}
    sched = Scheduler(build_policy(picker, seed, pins), clock, limits)
    ledger = Ledger(sched, clock, specs, present={s.id for s in specs}, pins=pins)
    assert sched.sync_endpoints(specs) == []
    for s in specs:
        ledger.apply(sched.set_health(s.id, EndpointHealth.READY))
    ledger.check()
    for ev in script:
        ledger.step(ev)
        ledger.check()
    ledger.drain()


@settings(max_examples=100, deadline=None)
@given(
    specs=fleets(),
    picker=st.sampled_from(["max-score", "round-robin", "power-of-two"]),
    seed=st.integers(0, 2**16),
    max_queue=st.integers(1, 4),
    script=st.lists(events, min_size=4, max_size=20),
)
def test_scheduler_invariants_hold_over_random_event_sequences(
    specs: list[EndpointSpec], picker: str, seed: int, max_queue: int, script: list[Event]
) -> None:
    run(specs, picker, seed, max_queue, script)
