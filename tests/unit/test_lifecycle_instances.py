"""The instance state machine (gateway.lifecycle.instances): playbooks on a fake clock, and properties."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import ModelName
from gateway.lifecycle.instances import (
    RESIDENT,
    Action,
    Demand,
    DeviceSpec,
    InstanceState,
    JoinEndpoint,
    LeaveEndpoint,
    Lifecycle,
    LifecycleSettings,
    LoadFailed,
    ModelSpec,
    NodeSpec,
    StartInstance,
    StopInstance,
)
from gateway.sched.plugins.eviction.cace import CaceEvictor, CaceParams
from gateway.sched.plugins.eviction.lru import LruEvictor

GIB = 1 << 30
A, B, C, BIG = ModelName("a"), ModelName("b"), ModelName("c"), ModelName("big")
MODELS = {
    A: ModelSpec(A, 10 * GIB, load_s=5),
    B: ModelSpec(B, 10 * GIB, load_s=5),
    C: ModelSpec(C, 10 * GIB, load_s=50),
    BIG: ModelSpec(BIG, 100 * GIB),
}
NODE = NodeSpec("n1", (DeviceSpec("gpu0", 20 * GIB),))  # holds two of a, b, c


def make(
    settings_: LifecycleSettings | None = None, demand: Demand | None = None, cace: bool = False
) -> Lifecycle:
    return Lifecycle(
        models=MODELS,
        nodes=[NODE],
        evictor=CaceEvictor(CaceParams()) if cace else LruEvictor(),
        settings=settings_ or LifecycleSettings(churn_guard_s=10, drain_timeout_s=5, load_deadline_s=100),
        demand=(lambda: demand) if demand is not None else Demand,
    )


def start_of(actions: Sequence[Action]) -> StartInstance:
    starts = [a for a in actions if isinstance(a, StartInstance)]
    assert len(starts) == 1, actions
    return starts[0]


def load(lc: Lifecycle, model: ModelName, now: float) -> str:
    s = start_of(lc.request(model, now))
    assert lc.started(s.instance, url="http://x", load_s=3.0, now=now + 3) == [JoinEndpoint(s.instance)]
    return s.instance


def test_cold_start_then_join_the_load_in_progress() -> None:
    lc = make()
    s = start_of(lc.request(A, 0))
    assert (s.model, s.node, s.devices) == (A, "n1", ("gpu0",))
    assert lc.request(A, 1) == []  # a second request joins the same load
    assert lc.get(s.instance).state is InstanceState.STARTING  # type: ignore[union-attr]
    assert lc.started(s.instance, url="http://x", load_s=2.5, now=3) == [JoinEndpoint(s.instance)]
    inst = lc.get(s.instance)
    assert inst is not None
    assert inst.state is InstanceState.READY
    assert inst.load_s == 2.5
    assert lc.request(A, 4) == []
    assert lc.wanted() == {}


def test_failed_load_fails_the_model_and_frees_its_room() -> None:
    lc = make()
    s = start_of(lc.request(A, 0))
    assert lc.start_failed(s.instance, "engine_exited: boom", 2) == [LoadFailed(A, "engine_exited: boom")]
    assert lc.wanted() == {}
    start_of(lc.request(A, 3))  # a later request tries again


def test_one_load_per_device() -> None:
    lc = make()
    start_of(lc.request(A, 0))
    assert lc.request(B, 0) == []  # gpu0 is loading a; b waits, it does not start beside it
    assert B in lc.wanted()
    a = lc.instances()[0].id
    acts = lc.started(a, url="http://x", load_s=1, now=1)
    assert acts[0] == JoinEndpoint(a)
    assert start_of(acts[1:]).model == B


def test_swap_evicts_idle_victim_drains_then_starts() -> None:
    lc = make()
    a = load(lc, A, 0)
    b = load(lc, B, 10)
    lc.dispatched(a, 20)
    lc.finished(a, 21)
    acts = lc.request(C, 40)  # room for two: one must go; LRU takes b (used at 13) over a (21)
    assert acts == [LeaveEndpoint(b), StopInstance(b, "n1", "evicted", "lru")]
    pending = next(i for i in lc.instances() if i.model == C)
    assert pending.state is InstanceState.PENDING
    assert pending.victims == {b}
    assert lc.request(C, 41) == []  # joins the pending load
    assert start_of(lc.stopped(b, 42)).instance == pending.id


def test_victim_with_requests_in_flight_is_never_chosen() -> None:
    lc = make()
    a = load(lc, A, 0)
    b = load(lc, B, 10)
    lc.dispatched(b, 30)  # b busy; a idle since 3
    acts = lc.request(C, 40)
    assert LeaveEndpoint(a) in acts
    assert all(getattr(x, "instance", None) != b for x in acts)


def test_draining_victim_stops_when_its_last_request_ends_or_at_the_drain_timeout() -> None:
    lc = make(LifecycleSettings(churn_guard_s=0, min_idle_s=0, drain_timeout_s=5))
    a = load(lc, A, 0)
    b = load(lc, B, 0)
    acts = lc.request(C, 20)
    victim = next(x.instance for x in acts if isinstance(x, LeaveEndpoint))
    # It was idle when chosen, so it is stopping at once; a victim still draining stops at its timeout.
    assert StopInstance(victim, "n1", "evicted", "lru") in acts
    assert {a, b} >= {victim}


def test_churn_guard_and_pinned_models_are_never_evicted() -> None:
    lc = make(LifecycleSettings(churn_guard_s=100, pinned=frozenset({A}), load_deadline_s=300))
    load(lc, A, 0)
    load(lc, B, 0)
    assert lc.request(C, 50) == []  # b loaded 47 s ago: guarded; a pinned
    assert C in lc.wanted()
    acts = lc.tick(200)  # b is past the guard now
    assert any(isinstance(x, StopInstance) and lc.get(x.instance).model == B for x in acts)  # type: ignore[union-attr]


def test_wanted_model_fails_at_the_load_deadline() -> None:
    lc = make(LifecycleSettings(churn_guard_s=1000, load_deadline_s=30))
    load(lc, A, 0)
    load(lc, B, 0)
    assert lc.request(C, 10) == []
    assert lc.tick(20) == []
    [failed] = lc.tick(41)
    assert isinstance(failed, LoadFailed)
    assert failed.model == C
    assert "load deadline" in failed.reason
    assert lc.wanted() == {}


def test_starting_without_an_answer_fails_at_the_load_deadline() -> None:
    lc = make(LifecycleSettings(load_deadline_s=30))
    s = start_of(lc.request(A, 0))
    acts = lc.tick(31)
    failed = acts[0]
    assert isinstance(failed, LoadFailed)
    assert failed.model == A
    assert "load deadline" in failed.reason
    assert StopInstance(s.instance, "n1", "load_deadline") in acts


def test_a_model_that_can_never_fit_fails_at_once() -> None:
    [failed] = make().request(BIG, 0)
    assert isinstance(failed, LoadFailed)
    assert "even when empty" in failed.reason


def test_crash_leaves_the_endpoint_set_and_a_new_request_reloads() -> None:
    lc = make()
    a = load(lc, A, 0)
    assert lc.crashed(a, "engine exited", 5) == [LeaveEndpoint(a), StopInstance(a, "n1", "crashed")]
    assert lc.stopped(a, 6) == []
    start_of(lc.request(A, 7))


def test_adopted_engine_joins_and_counts_its_memory() -> None:
    lc = make()
    assert lc.adopt(
        iid="a-9",
        model=A,
        node="n1",
        devices=["gpu0"],
        memory_bytes=10 * GIB,
        url="http://x",
        load_s=4,
        now=0,
    ) == [JoinEndpoint("a-9")]
    assert lc.request(A, 1) == []
    assert lc.ready_instance(A) is not None


def test_cace_keeps_the_model_the_queue_needs_next() -> None:
    # a and b equally idle and cheap; the queue's window wants b soon: CACE evicts a, LRU would evict b.
    lc = make(LifecycleSettings(churn_guard_s=0), demand=Demand(window=(C, B)), cace=True)
    a = load(lc, A, 0)
    b = load(lc, B, 0)
    lc.get(a).last_used = lc.get(b).last_used = 3  # type: ignore[union-attr]
    acts = lc.request(C, 20)
    assert LeaveEndpoint(a) in acts
    assert LeaveEndpoint(b) not in acts


# ----------------------------------------------------------------------------- properties
EVENTS = st.lists(
    st.tuples(
        st.sampled_from(
            ["request", "dispatch", "finish", "ok", "fail", "refuse", "stopped", "tick", "crash"]
        ),
        st.sampled_from([A, B, C]),
        st.integers(0, 5),
        st.floats(0, 30),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.booleans())
def test_never_over_commits_never_evicts_busy_and_every_wanted_model_is_owned(
    events: list[tuple[str, ModelName, int, float]], cace: bool
) -> None:
    lc = Lifecycle(
        models=MODELS,
        nodes=[NodeSpec("n1", (DeviceSpec("gpu0", 20 * GIB), DeviceSpec("gpu1", 10 * GIB)))],
        evictor=CaceEvictor(CaceParams()) if cace else LruEvictor(),
        settings=LifecycleSettings(churn_guard_s=5, drain_timeout_s=3, load_deadline_s=60),
        demand=lambda: Demand(window=(A, B), expected_output={C: 3000.0}),
    )
    now = 0.0
    inflight: dict[str, int] = {}
    for kind, model, pick, dt in events:
        now += dt
        insts = lc.instances()
        target = insts[pick % len(insts)] if insts else None
        acts: list[Action] = []
        if kind == "request":
            acts = lc.request(model, now)
        elif target is None:
            continue
        elif kind == "dispatch" and target.state is InstanceState.READY:
            lc.dispatched(target.id, now)
            inflight[target.id] = inflight.get(target.id, 0) + 1
        elif kind == "finish" and inflight.get(target.id, 0) > 0:
            inflight[target.id] -= 1
            acts = lc.finished(target.id, now)
        elif kind == "ok" and target.state is InstanceState.STARTING:
            acts = lc.started(target.id, url="http://x", load_s=dt, now=now)
        elif kind == "fail" and target.state is InstanceState.STARTING:
            acts = lc.start_failed(target.id, "boom", now)
        elif kind == "refuse" and target.state is InstanceState.STARTING:
            acts = lc.start_refused(target.id, "insufficient_memory", now, agent_free={"gpu0": pick * GIB})
        elif kind == "stopped" and target.state is InstanceState.STOPPING:
            acts = lc.stopped(target.id, now)
        elif kind == "crash":
            acts = lc.crashed(target.id, "died", now)
        elif kind == "tick":
            acts = lc.tick(now)
        for act in acts:
            if isinstance(act, StopInstance) and act.reason == "evicted":
                # An eviction never stops an instance with requests in flight (the drain timeout aside).
                inst = lc.get(act.instance)
                assert inst is not None
                assert inflight.get(act.instance, 0) == 0 or now >= (inst.drain_deadline or 0)
        # Resident memory never exceeds a device's capacity; one load per device.
        for dev in lc.nodes()[0].devices:
            on = [i for i in lc.instances() if dev.name in i.devices and i.state in RESIDENT]
            assert sum(i.memory_bytes for i in on) <= dev.capacity_bytes
            assert sum(1 for i in on if i.state is InstanceState.STARTING) <= 1
        # Every wanted model has no instance in progress (else it would have joined it).
        for m in lc.wanted():
            assert not any(
                i.model == m and i.state in (InstanceState.PENDING, InstanceState.STARTING)
                for i in lc.instances()
            )


def test_before_any_agent_answered_a_request_waits_then_starts_when_nodes_are_known() -> None:
    lc = Lifecycle(models=MODELS, nodes=[], evictor=LruEvictor())
    assert lc.request(A, 0) == []
    assert A in lc.wanted()
    lc.set_nodes([NODE])
    assert start_of(lc.tick(1)).model == A
