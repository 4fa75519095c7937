"""Scaling in the instance state machine (Lifecycle.scale_out / scale_in / reclass) and the shared autoscale
loop (gateway.lifecycle.scaling.ScaleLoop) over a real scheduler, on a fake clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gateway.config.policy import load_default_policy
from gateway.core.clock import FakeClock
from gateway.core.slo import SloKind
from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineKind,
    InstanceClass,
    ModelName,
    RequestId,
)
from gateway.lifecycle.instances import (
    Action,
    DeviceSpec,
    InstanceState,
    JoinEndpoint,
    LeaveEndpoint,
    Lifecycle,
    LifecycleSettings,
    ModelSpec,
    NodeSpec,
    ReclassEndpoint,
    StartInstance,
    StopInstance,
)
from gateway.lifecycle.scaling import ScaleLoop
from gateway.sched.autoscale import Autoscale, AutoscaleSettings
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.interface import (
    FinishedCall,
    InstanceConfig,
    ScaleDecision,
    ScaleOut,
    ScaleState,
    ScaleView,
)
from gateway.sched.plugins.eviction.lru import LruEvictor
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec

GIB = 1 << 30
M = ModelName("m")
SPEC = ModelSpec(M, 10 * GIB, 1, 5.0, configs=(InstanceConfig("tp2", 2, 64),))
NODE = NodeSpec("n1", tuple(DeviceSpec(f"gpu{i}", 20 * GIB) for i in range(4)))
MIXED, BATCH = InstanceClass.MIXED, InstanceClass.BATCH


def make() -> Lifecycle:
    return Lifecycle(
        models={M: SPEC},
        nodes=[NODE],
        evictor=LruEvictor(),
        settings=LifecycleSettings(churn_guard_s=10, drain_timeout_s=5, load_deadline_s=100),
    )


def starts(actions: Sequence[Action]) -> list[StartInstance]:
    return [a for a in actions if isinstance(a, StartInstance)]


def ready(lc: Lifecycle, start: StartInstance, now: float) -> None:
    assert lc.started(start.instance, url="http://x", load_s=5.0, now=now) == [
        JoinEndpoint(start.instance, start.instance_class)
    ]


def test_scale_out_starts_many_instances_of_a_class_one_load_per_device() -> None:
    lc = make()
    out = starts(lc.scale_out(M, 0.0, instance_class=BATCH, count=3, reason="backlog"))
    assert len(out) == 3
    assert len({s.devices for s in out}) == 3  # one load per device
    assert all((s.instance_class, s.config, s.reason) == (BATCH, None, "backlog") for s in out)
    assert lc.free_devices() == 1
    for s in out:
        assert lc.get(s.instance).instance_class is BATCH  # type: ignore[union-attr]


def test_scale_out_places_on_free_room_only_and_never_evicts() -> None:
    lc = make()
    assert len(starts(lc.scale_out(M, 0.0, count=10))) == 4  # what fits
    assert lc.scale_out(M, 1.0, count=1) == []
    assert not any(i.state is InstanceState.DRAINING for i in lc.instances())


def test_scale_out_with_a_configuration_takes_its_devices() -> None:
    lc = make()
    [s] = starts(lc.scale_out(M, 0.0, config="tp2"))
    assert (len(s.devices), s.config) == (2, "tp2")
    assert lc.scale_out(M, 0.0, config="nope") == []


def test_scale_in_drains_then_stops_as_scaled_in() -> None:
    lc = make()
    [s] = starts(lc.scale_out(M, 0.0))
    ready(lc, s, 5.0)
    lc.dispatched(s.instance, 6.0)
    assert lc.scale_in(s.instance, 7.0) == [LeaveEndpoint(s.instance)]  # a request runs: drain first
    assert lc.get(s.instance).state is InstanceState.DRAINING  # type: ignore[union-attr]
    assert lc.finished(s.instance, 8.0) == [StopInstance(s.instance, "n1", "scaled_in", None)]


def test_scale_in_of_an_idle_instance_stops_it_at_once_and_a_draining_one_times_out() -> None:
    lc = make()
    a, b = starts(lc.scale_out(M, 0.0, count=2))
    ready(lc, a, 5.0)
    ready(lc, b, 5.0)
    assert lc.scale_in(a.instance, 6.0) == [
        LeaveEndpoint(a.instance),
        StopInstance(a.instance, "n1", "scaled_in"),
    ]
    lc.dispatched(b.instance, 6.0)
    lc.scale_in(b.instance, 7.0)
    assert StopInstance(b.instance, "n1", "scaled_in") in lc.tick(12.0)  # drain timeout 5 s


def test_scale_in_refuses_anything_but_a_ready_instance() -> None:
    lc = make()
    [s] = starts(lc.scale_out(M, 0.0))
    assert lc.scale_in(s.instance, 1.0) == []  # starting: cannot drain
    assert lc.scale_in("ghost", 1.0) == []


def test_reclass_changes_a_ready_instance_in_place() -> None:
    lc = make()
    [s] = starts(lc.scale_out(M, 0.0))
    assert lc.reclass(s.instance, BATCH, 1.0) == []  # not ready yet
    ready(lc, s, 5.0)
    assert lc.reclass(s.instance, BATCH, 6.0) == [ReclassEndpoint(s.instance, BATCH)]
    assert lc.reclass(s.instance, BATCH, 7.0) == []
    assert lc.get(s.instance).state is InstanceState.READY  # type: ignore[union-attr]


def test_eviction_still_stops_as_evicted_after_scaling() -> None:
    small = Lifecycle(
        models={M: SPEC, ModelName("o"): ModelSpec(ModelName("o"), 15 * GIB)},
        nodes=[NodeSpec("n1", (DeviceSpec("gpu0", 20 * GIB),))],
        evictor=LruEvictor(),
        settings=LifecycleSettings(churn_guard_s=0, drain_timeout_s=5, load_deadline_s=100),
    )
    [s] = starts(small.scale_out(M, 0.0))
    ready(small, s, 5.0)
    out = small.request(ModelName("o"), 10.0)
    assert StopInstance(s.instance, "n1", "evicted", "lru") in out


# ----------------------------------------------------------------------------- the loop
class Recorder:
    name = "recorder"

    def __init__(self, decisions: Sequence[ScaleDecision] = ()) -> None:
        self.decisions = list(decisions)
        self.views: list[ScaleView] = []

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]:
        self.views.append(view)
        return self.decisions


def loop_with(
    scaler: Recorder, *, dry_run: bool = False
) -> tuple[ScaleLoop, Lifecycle, Scheduler, FakeClock]:
    clock = FakeClock(0.0)
    sched = Scheduler(load_default_policy(default_registry()), clock)
    lc = make()
    loop = ScaleLoop(Autoscale(scaler, AutoscaleSettings(interval_s=5.0, dry_run=dry_run)), lc, sched)
    return loop, lc, sched, clock


def request(i: int, at: float) -> SchedRequest:
    return SchedRequest(
        id=RequestId(f"r{i}"),
        model=M,
        api=ApiKind.CHAT,
        arrival=at,
        slo=SLO(ttft_ms=2000.0),
        prompt_tokens=10,
        max_tokens=50,
        stream=True,
    )


def test_the_loop_views_instances_queue_and_rate_and_carries_out_decisions() -> None:
    scaler = Recorder([ScaleOut(M, BATCH, 2, None, "test")])
    loop, lc, sched, clock = loop_with(scaler)
    [s] = starts(lc.scale_out(M, 0.0))
    ready(lc, s, 5.0)
    eid = EndpointId(s.instance)
    sched.sync_endpoints([EndpointSpec(eid, "http://x", EngineKind.VLLM, frozenset({M}), cap=1)])
    sched.set_health(eid, EndpointHealth.READY)
    clock.set(10.0)
    for i in range(3):
        loop.arrived(request(i, 10.0), 10.0)
        sched.submit(request(i, 10.0))  # one runs (cap 1), two wait
    loop.finished(M, FinishedCall(SloKind.INTERACTIVE, 1.0, 3.0, 2.0, 0.5, True))
    out = loop.step(10.0, {s.instance: eid})
    assert [(a.instance_class, a.reason) for a in starts(out)] == [(BATCH, "test"), (BATCH, "test")]
    mv = scaler.views[0].models[M]
    [iv] = mv.instances
    assert (iv.state, iv.running_interactive, iv.cap, iv.endpoint) == (ScaleState.READY, 1, 1, eid)
    assert len(mv.queued) == 2
    assert mv.queued[0].ttft_deadline == 12.0
    assert mv.arrival_rate == 3 / 10.0
    assert len(mv.finished) == 1
    assert scaler.views[0].free_devices == 3
    assert loop.step(12.0, {}) == []  # not due: 5 s interval
    assert loop.runner.counters.started == 2


def test_the_loop_views_open_calls_on_their_measure() -> None:
    scaler = Recorder()
    loop, lc, sched, clock = loop_with(scaler)
    [s] = starts(lc.scale_out(M, 0.0))
    ready(lc, s, 5.0)
    eid = EndpointId(s.instance)
    sched.sync_endpoints([EndpointSpec(eid, "http://x", EngineKind.VLLM, frozenset({M}), cap=1)])
    sched.set_health(eid, EndpointHealth.READY)
    clock.set(10.0)
    sched.submit(request(0, 10.0))  # runs (cap 1); its first token at 10.5
    sched.progress(RequestId("r0"), 1, 10.5)
    sched.submit(request(1, 10.0))  # waits: its TTFT measure runs on
    with_deadline = dataclasses.replace(request(2, 11.0), slo=SLO(ttft_ms=2000.0, deadline_ms=5000.0))
    sched.submit(with_deadline)  # waits: measured end to end
    clock.set(14.0)
    loop.step(14.0, {s.instance: eid})
    calls = {c.id: (c.allotted_s, c.took_s) for c in scaler.views[0].models[M].open_calls}
    assert calls == {"r0": (2.0, 0.5), "r1": (2.0, 4.0), "r2": (5.0, 3.0)}


def test_the_loop_in_dry_run_decides_and_acts_on_nothing() -> None:
    scaler = Recorder([ScaleOut(M, MIXED, 1)])
    loop, lc, _, _ = loop_with(scaler, dry_run=True)
    assert loop.step(0.0, {}) == []
    assert lc.instances() == []
    assert [r.outcome for r in loop.runner.take_records()] == ["dry_run"]


def test_a_failed_scale_out_start_fails_no_request_while_others_serve_the_model() -> None:
    lc = make()
    [a] = starts(lc.scale_out(M, 0.0))
    ready(lc, a, 5.0)
    [b] = starts(lc.scale_out(M, 6.0))
    assert lc.start_failed(b.instance, "engine_exited", 7.0) == []
    # alone, a failed start is the model's load failing
    lc2 = make()
    [c] = starts(lc2.scale_out(M, 0.0))
    assert [type(x).__name__ for x in lc2.start_failed(c.instance, "engine_exited", 1.0)] == ["LoadFailed"]
