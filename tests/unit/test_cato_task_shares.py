"""cato-sla counts each task call against its own share of the task SLA (CATO's allotted time per step),
not against the rest of the task SLA its deadline holds: from admission (the task clock) through the
scheduler and the autoscale loop's view to the scaler, on a fake clock.

A generation task (SLA 10 s, steps 0.8 / 0.2, measured to the first token of its last call) generates
on `code-a`, then validates on `code-b`. A late generation leaves the validation less than nothing of
the task SLA, but the validation itself is allotted 2 s to its first token: it counts only when it takes
longer than that (by `max_exceeded_proportion`) itself.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.admission.classify import to_sched_request
from gateway.admission.state import SloAdmission
from gateway.config import parse_policy_text
from gateway.core.clock import FakeClock
from gateway.core.slo import Allotment
from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineKind,
    ModelName,
    ParsedRequest,
    RequestId,
)
from gateway.lifecycle.autoscaler import LiveAutoscaler
from gateway.lifecycle.instances import (
    DeviceSpec,
    JoinEndpoint,
    Lifecycle,
    LifecycleSettings,
    ModelSpec,
    NodeSpec,
    StartInstance,
)
from gateway.lifecycle.scaling import ScaleLoop
from gateway.sched.autoscale import Autoscale, AutoscaleSettings
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.cato_sla import CatoSlaParams, CatoSlaScaler
from gateway.sched.plugins.autoscale.interface import FinishedCall, allotted
from gateway.sched.plugins.eviction.lru import LruEvictor
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec
from gateway.telemetry.records import FinishedRequest

GIB = 1 << 30
A, B = ModelName("code-a"), ModelName("code-b")
POLICY = """name = "t"

[ordering]
plugin = "fcfs"

[placement]
picker = { plugin = "round-robin" }

[slo]
default_class = "generation"

[[slo.classes]]
name = "generation"
kind = "interactive"
task_sla_ms = 10000.0
task_metric = "ttft"
steps = [0.8, 0.2]
"""


class Fleet:
    """code-a and code-b, one ready instance each (cap 1), cato-sla counting (never scaling: its
    threshold is out of reach), the autoscale loop stepped by hand."""

    def __init__(self) -> None:
        self.clock = FakeClock(0.0)
        self.sched = Scheduler(parse_policy_text(POLICY, "t.toml", default_registry()), self.clock)
        self.life = Lifecycle(
            models={m: ModelSpec(m, 10 * GIB, 1, 5.0) for m in (A, B)},
            nodes=[NodeSpec("n1", tuple(DeviceSpec(f"gpu{i}", 20 * GIB) for i in range(2)))],
            evictor=LruEvictor(),
            settings=LifecycleSettings(),
        )
        self.scaler = CatoSlaScaler(CatoSlaParams(max_exceeded_proportion=0.2, max_exceeded_times=1000))
        self.loop = ScaleLoop(
            Autoscale(self.scaler, AutoscaleSettings(interval_s=1.0)), self.life, self.sched
        )
        self.endpoints: dict[str, EndpointId] = {}
        specs = []
        for m in (A, B):
            [start] = [a for a in self.life.scale_out(m, 0.0) if isinstance(a, StartInstance)]
            assert self.life.started(start.instance, url="http://x", load_s=5.0, now=0.0) == [
                JoinEndpoint(start.instance, start.instance_class)
            ]
            eid = self.endpoints[start.instance] = EndpointId(str(m))
            specs.append(EndpointSpec(eid, f"http://{m}", EngineKind.VLLM, frozenset({m}), cap=1))
        self.sched.sync_endpoints(specs)
        for eid in self.endpoints.values():
            self.sched.set_health(eid, EndpointHealth.READY)
        self.admission = SloAdmission()
        self.n = 0

    def call(self, model: ModelName, task: str) -> SchedRequest:
        """A call of generation task `task` arrives now (admitted as the front admits it) and is
        submitted."""
        now = self.clock.now()
        parsed = ParsedRequest(ApiKind.CHAT, {"model": model}, model, True, False, 50, 400)
        resolved = self.admission.resolve(
            [("x-berth-task-id", task)], None, parsed, served=model, now=now, policy=self.sched.policy.slo
        )
        assert resolved.task is not None
        self.n += 1
        req = to_sched_request(
            f"r{self.n}", parsed, model, now, slo=resolved.slo, allotment=resolved.task.allotment
        )
        self.sched.submit(req)
        self.loop.arrived(req, now)
        return req

    def first_token(self, req: SchedRequest) -> None:
        self.sched.progress(req.id, 1, self.clock.now())

    def finish(self, req: SchedRequest, ttft_s: float) -> None:
        now = self.clock.now()
        self.sched.complete(req.id)
        e2e, allotted_s = allotted(req.slo, req.allotment)
        took = now - req.arrival if e2e else ttft_s
        self.loop.finished(
            req.model,
            FinishedCall(
                self.sched.policy.slo.class_of(req.slo.slo_class).kind,
                req.arrival,
                now,
                allotted_s,
                took,
                None,
                req.id,
            ),
        )

    def step(self) -> dict[ModelName, int]:
        """One autoscale round now: the violations cato-sla has counted per model so far."""
        self.loop.step(self.clock.now(), self.endpoints)
        return {m: self.scaler.violations.get(m, 0) for m in (A, B)}


def test_a_validation_after_a_late_generation_is_not_counted_against_its_own_model() -> None:
    f = Fleet()
    gen = f.call(A, "t1")  # allotted 8 s end to end; the task's deadline for it is also 8 s
    assert gen.slo.deadline_ms == 8000.0
    f.clock.set(11.0)  # the generation ran 11 s: past 8 · 1.2
    f.first_token(gen)
    f.finish(gen, 0.5)
    assert f.step() == {A: 1, B: 0}
    val = f.call(B, "t1")  # 1 s past the task's deadline when it arrives ...
    assert val.slo.ttft_ms == -1000.0
    f.clock.set(12.0)  # ... and still waiting for its first token 1 s on: within its own 2 s
    assert f.step() == {A: 1, B: 0}
    f.first_token(val)
    f.clock.set(13.0)
    f.finish(val, 1.0)
    assert f.step() == {A: 1, B: 0}  # finished within its share: code-b did nothing wrong


def test_a_validation_that_overruns_its_own_share_is_counted_once() -> None:
    f = Fleet()
    gen = f.call(A, "t1")
    f.clock.set(1.0)  # a quick generation
    f.first_token(gen)
    f.finish(gen, 0.2)
    blocker = f.call(B, "t0")  # a validation of another task takes code-b's one seat ...
    val = f.call(B, "t1")  # ... so this one waits; its task has 9 s left, its own share is 2 s
    assert val.slo.ttft_ms == 9000.0
    assert f.step() == {A: 0, B: 0}
    f.clock.set(3.5)  # 2.5 s without a first token: past 2 · 1.2 while still queued
    assert f.step() == {A: 0, B: 1}
    f.first_token(blocker)
    f.finish(blocker, 0.0)
    f.clock.set(4.0)
    f.first_token(val)
    f.finish(val, 3.0)
    assert f.step() == {A: 0, B: 1}  # counted while open, not again at its finish


def test_the_live_finish_record_carries_the_share_to_the_scaler() -> None:
    """The live daemon reports a finish through `FinishedRequest` (the front's finish phase): a
    validation that took 3 s to its first token after its task's deadline passed is measured against
    its own 2 s share, and one that took 1 s is not counted."""
    clock = FakeClock(0.0)
    policy = POLICY + (
        '\n[autoscale]\nplugin = "cato-sla"\n'
        "params = { max_exceeded_proportion = 0.2, max_exceeded_times = 1000 }\ninterval_s = 1.0\n"
    )
    sched = Scheduler(parse_policy_text(policy, "t.toml", default_registry()), clock)
    life = Lifecycle(
        models={B: ModelSpec(B, 10 * GIB, 1, 5.0)},
        nodes=[NodeSpec("n1", (DeviceSpec("gpu0", 20 * GIB),))],
        evictor=LruEvictor(),
        settings=LifecycleSettings(),
    )
    live = LiveAutoscaler(life, sched, CollectorRegistry())
    share = Allotment(2.0, e2e=False)
    for rid, ttft in (("late", 3.0), ("ok", 1.0)):
        live.finished(
            FinishedRequest(
                str(B),
                "generation",
                SLO("generation", ttft_ms=-500.0),
                True,
                True,
                None,
                1,
                10.0,
                10.0,
                10.0 + ttft,
                12.0,
                400,
                None,
                100,
                20,
                (),
                None,
                RequestId(rid),
                share,
            ),
            sched.policy.slo,
        )
    live.step(12.0, {})
    assert live.loop is not None
    scaler = live.loop.runner.scaler
    assert isinstance(scaler, CatoSlaScaler)
    assert scaler.violations == {B: 1}
