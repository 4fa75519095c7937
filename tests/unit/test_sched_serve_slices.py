"""Serving in slices (`gateway.sched.slices`): one call tries at most `serve_slice` requests, `owed` says
when serving is left to do, and `serve` goes on from where the call stopped. Carried on at once, the
slices make the decisions of one uncut serve (hypothesis, against a scheduler whose slice is unbounded),
and the live driver carries them on over the event loop's turns."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from gateway.core.types import SLO, ApiKind, EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.dispatch.driver import SchedulerDriver
from gateway.sched.decisions import Decision, Dispatch, Preempt, Reject
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits

M = ModelName("m")
N = ModelName("n")
UNBOUNDED = 10**9


@dataclass
class Pins:
    """A request-specific filter: a pinned request runs only on its endpoint (so a queue's head can fit
    nowhere while requests behind it fit); counts the requests it is asked about."""

    to: dict[RequestId, EndpointId] = field(default_factory=dict)
    asked: list[RequestId] = field(default_factory=list)
    name: str = "pins"

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        self.asked.append(req.id)
        pin = self.to.get(req.id)
        return [e for e in candidates if pin is None or e.id == pin]


def make(pins: Pins, *, lookahead: int, caps: Sequence[int], slice_: int) -> tuple[Scheduler, FakeClock]:
    reg = default_registry()
    pol = Policy(
        name="sliced",
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="ordering"),
        profile=SchedulerProfile(
            filters=(pins,),
            scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
            picker=reg.build(PluginKind.PICKER, "max-score", None, path="picker"),
        ),
        lookahead=lookahead,
    )
    clock = FakeClock()
    sched = Scheduler(pol, clock, QueueLimits(max_queue_per_model=64, max_wait_s=5.0, retry_after_s=1.0))
    sched.serve_slice = slice_
    specs = [
        EndpointSpec(
            id=EndpointId(f"e{i}"),
            url=f"http://e{i}:8000",
            engine=EngineKind.VLLM,
            models=frozenset({M, N}) if i % 2 else frozenset({M}),
            cap=cap,
        )
        for i, cap in enumerate(caps)
    ]
    sched.sync_endpoints(specs)
    for s in specs:
        sched.set_health(s.id, EndpointHealth.READY)
    return sched, clock


def req(name: str, clock: FakeClock, model: ModelName = M) -> SchedRequest:
    return SchedRequest(
        id=RequestId(name),
        model=model,
        api=ApiKind.CHAT,
        arrival=clock.now(),
        slo=SLO(),
        prompt_tokens=8,
        max_tokens=None,
        stream=False,
    )


def seen(ds: Sequence[Decision]) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for d in ds:
        if isinstance(d, Dispatch):
            out.append(("dispatch", d.req.id, d.endpoint.id))
        elif isinstance(d, Reject):
            out.append(("reject", d.req.id, d.error.code))
        else:
            assert isinstance(d, Preempt)
            out.append(("preempt", d.victim.id, d.endpoint.id))
    return out


def ids(ds: Sequence[Decision]) -> list[str]:
    """The requests dispatched by `ds`, in order."""
    out: list[str] = []
    for d in ds:
        assert isinstance(d, Dispatch), d
        out.append(d.req.id)
    return out


def owes(sched: Scheduler) -> bool:
    """`sched.owed`, read anew at each assertion (not narrowed by the one before)."""
    return sched.owed


def drained(sched: Scheduler, ds: list[Decision]) -> list[Decision]:
    """`ds` and every slice the call left to do, carried on at once (as the simulator does)."""
    out = list(ds)
    while sched.owed:
        out += sched.serve()
    return out


# ----------------------------------------------------------------- scripted
def test_a_completion_that_frees_room_for_many_places_them_one_slice_a_call() -> None:
    pins = Pins()
    sched, clock = make(pins, lookahead=2, caps=(1, 1, 1, 1, 1, 1, 1, 1), slice_=3)
    running = [sched.submit(req(f"r{i}", clock)) for i in range(8)]
    assert all(isinstance(d, Dispatch) for d in running)
    # The head may run on e0 only; seven behind it could run anywhere.
    pins.to[RequestId("head")] = EndpointId("e0")
    for name in ("head", *(f"q{i}" for i in range(7))):
        assert sched.submit(req(name, clock)) is None
    for i in range(1, 8):  # seats free everywhere but e0: nothing is served by a tick yet
        clock.advance(0.0)
        sched._fleet.complete(RequestId(f"r{i}"))  # seats freed without serving
    pins.asked.clear()
    first = sched.complete(RequestId("r0"))  # e0 frees too: the head fits, then the rest
    assert seen(first) == [("dispatch", "head", "e0"), ("dispatch", "q0", "e1"), ("dispatch", "q1", "e2")]
    assert owes(sched)
    assert pins.asked == ["head", "q0", "q1"]
    second = sched.serve()
    assert ids(second) == ["q2", "q3", "q4"]
    third = sched.serve()
    assert ids(third) == ["q5", "q6"]  # q7 does not exist; every seat is taken now
    assert not owes(sched)
    assert sched.serve() == []


def test_a_slice_carries_the_requests_its_serve_passed_over() -> None:
    """A head that fits nowhere is passed over (lookahead) and not tried again by the next slice."""
    pins = Pins()
    sched, clock = make(pins, lookahead=4, caps=(1, 4), slice_=2)
    pins.to[RequestId("busy")] = EndpointId("e0")
    assert isinstance(sched.submit(req("busy", clock)), Dispatch)
    pins.to[RequestId("stuck")] = pins.to[RequestId("x")] = EndpointId("e0")
    for name in ("stuck", "a", "b", "x", "c"):  # all wait behind the head, which fits nowhere
        assert sched.submit(req(name, clock)) is None
    pins.asked.clear()
    clock.advance(1.0)  # past the fits-nowhere memo's time (gateway.sched.unfit): each try asks the filter
    assert ids(sched.tick()) == ["a"]  # stuck passed over, a placed: the slice is spent
    assert pins.asked == ["stuck", "a"]
    assert owes(sched)
    pins.asked.clear()
    assert ids(sched.serve()) == ["b"]  # x passed over too
    assert pins.asked == ["b", "x"]
    assert owes(sched)
    pins.asked.clear()
    assert ids(sched.serve()) == ["c"]
    assert pins.asked == ["c"]  # stuck and x are not tried again by this serve
    assert not owes(sched)  # its second try found only requests passed over: the serve is done


def test_a_tick_while_a_serve_is_owed_serves_in_queue_order() -> None:
    pins = Pins()
    sched, clock = make(pins, lookahead=0, caps=(2, 2, 2), slice_=1)
    for i in range(6):
        assert isinstance(sched.submit(req(f"r{i}", clock)), Dispatch)
    for name in ("a", "b", "c"):
        assert sched.submit(req(name, clock)) is None
    for i in range(1, 3):
        sched._fleet.complete(RequestId(f"r{i}"))  # seats freed without serving
    assert ids(sched.complete(RequestId("r0"))) == ["a"]
    assert owes(sched)
    assert ids(sched.tick()) == ["b"]  # the daemon's ticker came first: it goes on with the owed serve
    assert owes(sched)
    assert ids(sched.serve()) == ["c"]
    assert sched.serve() == []
    assert not owes(sched)


def test_models_left_unserved_by_a_spent_call_are_served_in_order() -> None:
    """A serve cut again goes on before the serves owed behind it (the uncut call's order)."""
    pins = Pins()
    sched, clock = make(pins, lookahead=0, caps=(2, 2), slice_=1)
    for name in ("r0", "r1", "r2"):
        assert isinstance(sched.submit(req(name, clock)), Dispatch)
    assert isinstance(sched.submit(req("r3", clock, N)), Dispatch)
    for name in ("m1", "m2", "m3"):
        assert sched.submit(req(name, clock)) is None
    assert sched.submit(req("n1", clock, N)) is None
    for name in ("r0", "r1", "r2", "r3"):
        sched._fleet.complete(RequestId(name))  # seats freed without serving
    assert ids(sched.tick()) == ["m1"]
    assert ids(sched.serve()) == ["m2"]
    assert ids(sched.serve()) == ["m3"]
    assert ids(sched.serve()) == ["n1"]
    assert not owes(sched)


def test_serves_asked_for_while_one_is_owed_go_on_with_it_past_a_head_that_fits_nowhere() -> None:
    """A head of `lookahead` requests that fit nowhere, and a completion before each owed slice's turn
    (the daemon under load): each completion's serve goes on with the owed one, so the requests behind
    the head are placed. Started from the head each time, every call would try the head's first request
    and place nothing."""
    pins = Pins()
    sched, clock = make(pins, lookahead=4, caps=(1,) * 8, slice_=1)
    for i in range(8):
        pins.to[RequestId(f"r{i}")] = EndpointId(f"e{i}")
        assert isinstance(sched.submit(req(f"r{i}", clock)), Dispatch)
    heads = [f"h{i}" for i in range(4)]
    for name in heads:
        pins.to[RequestId(name)] = EndpointId("e0")  # e0 stays busy: they fit nowhere
    for name in (*heads, "a", "b"):
        assert sched.submit(req(name, clock)) is None
    placed: list[str] = []
    asked: list[str] = []
    for i in range(1, 8):
        pins.asked.clear()
        placed += ids(sched.complete(RequestId(f"r{i}")))  # owed slices never get their own turn
        asked += pins.asked
    assert placed == ["a", "b"]
    assert asked[:6] == [*heads, "a", "b"]  # one try a call, going on from where the last one stopped


def test_a_tick_goes_on_with_the_owed_serve() -> None:
    pins = Pins()
    sched, clock = make(pins, lookahead=4, caps=(1, 1, 1), slice_=1)
    for i in range(3):
        pins.to[RequestId(f"r{i}")] = EndpointId(f"e{i}")
        assert isinstance(sched.submit(req(f"r{i}", clock)), Dispatch)
    pins.to[RequestId("stuck")] = EndpointId("e0")
    for name in ("stuck", "a", "b"):
        assert sched.submit(req(name, clock)) is None
    sched._fleet.complete(RequestId("r2"))  # a seat freed without serving
    pins.asked.clear()
    assert sched.complete(RequestId("r1")) == []  # stuck tried, fits nowhere: the slice is spent
    assert owes(sched)
    assert ids(sched.tick()) == ["a"]  # goes on past stuck
    assert ids(sched.tick()) == ["b"]
    assert pins.asked == ["stuck", "a", "b"]


async def test_the_live_driver_carries_the_slices_on_over_the_loop_turns() -> None:
    pins = Pins()
    sched, clock = make(pins, lookahead=0, caps=(1, 1, 1, 1, 1), slice_=2)
    driver = SchedulerDriver(sched)
    held = [await driver.acquire(req(f"r{i}", clock)) for i in range(5)]
    assert len(held) == 5
    waiting = [asyncio.ensure_future(driver.acquire(req(f"w{i}", clock))) for i in range(5)]
    await asyncio.sleep(0)
    assert driver.waiting == 5
    for i in range(1, 5):
        sched._fleet.complete(RequestId(f"r{i}"))  # seats freed without serving
    driver.release(RequestId("r0"))
    # the first slice at once, the next on the loop's following turns
    await asyncio.sleep(0)
    done_first = sum(w.done() for w in waiting)
    assert done_first == 2
    for _ in range(6):
        await asyncio.sleep(0)
    assert [w.result().req.id for w in waiting] == ["w0", "w1", "w2", "w3", "w4"]
    assert not owes(sched)
    assert driver.times.calls["serve"].count >= 2


# ----------------------------------------------------------------- sliced == uncut
@dataclass(frozen=True)
class Submit:
    model: int
    pin: int | None


@dataclass(frozen=True)
class Complete:
    pick: int
    bulk: int  # completions whose seats free without serving first (so one call has much to place)


@dataclass(frozen=True)
class Tick:
    advance_s: float


@dataclass(frozen=True)
class Health:
    endpoint: int
    ready: bool


Event = Submit | Complete | Tick | Health
events = st.one_of(
    st.builds(Submit, st.sampled_from([0, 0, 1]), st.none() | st.integers(0, 5)),
    st.builds(Submit, st.just(0), st.none()),
    st.builds(Complete, st.integers(0, 30), st.integers(0, 4)),
    st.builds(Tick, st.sampled_from([0.0, 0.5, 6.0])),
    st.builds(Health, st.integers(0, 5), st.booleans()),
)


def play(
    script: Sequence[Event], *, lookahead: int, caps: Sequence[int], slice_: int
) -> list[list[tuple[str, str, str]]]:
    """The decisions of every event, with the slices carried on at once after each call."""
    pins = Pins()
    sched, clock = make(pins, lookahead=lookahead, caps=caps, slice_=slice_)
    ids = [EndpointId(f"e{i}") for i in range(len(caps))]
    running: list[RequestId] = []
    out: list[list[tuple[str, str, str]]] = []

    def note(ds: list[Decision]) -> None:
        for d in ds:
            if isinstance(d, Dispatch):
                running.append(d.req.id)
        out.append(seen(ds))

    for k, ev in enumerate(script):
        if isinstance(ev, Submit):
            name = RequestId(f"s{k:03d}")
            if ev.pin is not None:
                pins.to[name] = ids[ev.pin % len(ids)]
            d = sched.submit(req(name, clock, (M, N)[ev.model]))
            note(drained(sched, [] if d is None else [d]))
        elif isinstance(ev, Complete):
            if not running:
                continue
            for _ in range(min(ev.bulk, len(running) - 1)):
                sched._fleet.complete(running.pop(0))  # seats freed without serving
            rid = running.pop(ev.pick % len(running))
            note(drained(sched, sched.complete(rid)))
        elif isinstance(ev, Tick):
            clock.advance(ev.advance_s)
            note(drained(sched, sched.tick()))
        else:
            health = EndpointHealth.READY if ev.ready else EndpointHealth.UNHEALTHY
            note(drained(sched, sched.set_health(ids[ev.endpoint % len(ids)], health)))
    return out


@settings(max_examples=150, deadline=None)
@given(
    script=st.lists(events, min_size=5, max_size=40),
    lookahead=st.integers(0, 4),
    caps=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    slice_=st.integers(1, 3),
)
def test_slices_carried_on_at_once_decide_as_one_uncut_serve(
    script: list[Event], lookahead: int, caps: list[int], slice_: int
) -> None:
    assert play(script, lookahead=lookahead, caps=caps, slice_=slice_) == play(
        script, lookahead=lookahead, caps=caps, slice_=UNBOUNDED
    )
