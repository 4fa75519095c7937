"""The autoscale loop chooses new instances' configurations by the model's SLO mix (MaaSO's placer through
the runner's `ConfigChoice`): the shared `ScaleLoop` over a real scheduler and lifecycle, on a fake clock.

The model has a small-batch configuration on two devices (`tp2-b8`: 170 tokens/s alone) and a large one on
one (`tp1-b64`, the default: 100 alone, 30 at 64), as MaaSO's candidates pair parallelism with batch sizes.
t_slot is 10 ms (a plain instance alone), so a 100-token request of deadline factor 0.8 needs 125 tokens/s
(only a lightly loaded `tp2-b8` gives it) and one of factor 3 needs 33 (a `tp1-b64` up to ~55 running).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import parse_policy_text
from gateway.config.schema import PerfPriorConfig, TelemetryConfig
from gateway.core.clock import FakeClock
from gateway.core.tasks import TaskSupervisor
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
from gateway.lifecycle import placements
from gateway.lifecycle.autoscaler import LiveAutoscaler
from gateway.lifecycle.choice_plan import ChoiceInputs, ChoicePlan, plan_choice
from gateway.lifecycle.config_choice import PlanAhead
from gateway.lifecycle.instances import (
    DeviceSpec,
    Lifecycle,
    LifecycleSettings,
    ModelSpec,
    NodeSpec,
    StartInstance,
)
from gateway.lifecycle.placements import ThreadPlans
from gateway.lifecycle.scaling import ScaleLoop
from gateway.sched.autoscale import Autoscale, AutoscaleSettings
from gateway.sched.heterogeneous import ConfigProfile, Placer, RequestKind, TrafficMix
from gateway.sched.perf import default_prior
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.interface import InstanceConfig, ScaleDecision, ScaleOut, ScaleView
from gateway.sched.plugins.eviction.lru import LruEvictor
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointEstimates
from gateway.sched.types import EndpointSpec
from gateway.telemetry.live import LiveTelemetry

GIB = 1 << 30
M = ModelName("m")
T_SLOT_MS = 10.0
MIXED = InstanceClass.MIXED
CURVE = dataclasses.replace(default_prior(), thr1=100.0, alpha=20.0, beta=0.5)
WIDE = dataclasses.replace(CURVE, thr1=170.0, alpha=34.0)
CONFIGS = (InstanceConfig("tp2-b8", 2, 8), InstanceConfig("tp1-b64", 1, 64))
SPEC = ModelSpec(M, 10 * GIB, 1, 5.0, configs=CONFIGS, default_config="tp1-b64")
NODE = NodeSpec("n1", tuple(DeviceSpec(f"gpu{i}", 20 * GIB) for i in range(8)))
SPLIT = f"strict_below = 1.1, strict_max_batch = 8, t_slot_ms = {T_SLOT_MS}"
POLICY = f"""
name = "maaso"
[ordering]
plugin = "edf"
[placement]
picker = {{ plugin = "max-score" }}
filters = [
    {{ plugin = "sub-cluster", params = {{ {SPLIT} }} }},
]
[[placement.scorers]]
plugin = "least-outstanding"
weight = 1.0
"""


class Asks:
    """A scaler that asks for `count` mixed instances of the model every round, naming no configuration."""

    name = "asks"

    def __init__(self, count: int) -> None:
        self.count = count

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]:
        return [ScaleOut(M, MIXED, self.count, None, "wanted")]


def make(
    count: int, spec: ModelSpec = SPEC, *, dry_run: bool = False, ahead: PlanAhead | None = None
) -> tuple[ScaleLoop, Lifecycle, Scheduler, FakeClock]:
    clock = FakeClock(0.0)
    sched = Scheduler(parse_policy_text(POLICY, "maaso.toml", default_registry()), clock)
    lc = Lifecycle(
        models={M: spec},
        nodes=[NODE],
        evictor=LruEvictor(),
        settings=LifecycleSettings(load_deadline_s=100),
    )
    autoscale = Autoscale(Asks(count), AutoscaleSettings(interval_s=5.0, dry_run=dry_run))
    loop = ScaleLoop(autoscale, lc, sched, priors={M: {"tp2-b8": WIDE, "tp1-b64": CURVE}}, ahead=ahead)
    return loop, lc, sched, clock


def request(i: int, at: float, factor: float) -> SchedRequest:
    return SchedRequest(
        id=RequestId(f"r{i}"),
        model=M,
        api=ApiKind.CHAT,
        arrival=at,
        slo=SLO(deadline_ms=factor * 100 * T_SLOT_MS),
        prompt_tokens=50,
        max_tokens=100,
        stream=True,
    )


def feed(
    loop: ScaleLoop, clock: FakeClock, *, rate: float, strict_share: float, seconds: float = 30.0
) -> None:
    """Requests at `rate`/s for `seconds`: in every ten, `strict_share` x 10 of factor 0.8, the rest 3."""
    for i in range(int(rate * seconds)):
        at = i / rate
        clock.set(at)
        loop.arrived(request(i, at, 0.8 if i % 10 < round(strict_share * 10) else 3.0), at)
    clock.set(seconds)


def starts(actions: object) -> list[StartInstance]:
    return [a for a in actions if isinstance(a, StartInstance)]  # type: ignore[attr-defined]


def configs_of(actions: object) -> list[str | None]:
    return sorted((s.config for s in starts(actions)), key=str)


@pytest.mark.parametrize(
    ("strict_share", "rate", "expected"),
    [
        pytest.param(0.9, 6.0, "tp2-b8", id="strict-heavy: small batches"),
        # (at 6/s four tp2-b8 would serve a relaxed mix too, faster: the placer then runs them alone)
        pytest.param(0.1, 40.0, "tp1-b64", id="relaxed-heavy: large batches"),
    ],
)
def test_the_mix_chooses_the_configurations(strict_share: float, rate: float, expected: str) -> None:
    loop, _, _, clock = make(3)
    feed(loop, clock, rate=rate, strict_share=strict_share)
    out = loop.step(clock.now(), {})
    got = configs_of(out)
    assert len(got) == 3
    assert got.count(expected) >= 2, got
    records = loop.runner.take_records()
    assert all(isinstance(r.decision, ScaleOut) and r.decision.config is not None for r in records)
    assert any(f"config {expected} (+" in r.decision.reason for r in records if r.decision is not None)
    assert all(r.decision.reason.startswith("wanted; ") for r in records if r.decision is not None)
    mix = loop.configs.last[M].mix
    assert mix.rate == pytest.approx(rate, rel=0.05)
    strict = sum(k.share for k in mix.kinds if k.factor < 1.1)
    assert strict == pytest.approx(strict_share, abs=0.02)


def test_without_a_deadline_seen_the_default_configuration_starts_and_the_reason_says_so() -> None:
    loop, _, _, _ = make(2)
    out = loop.step(0.0, {})
    assert configs_of(out) == [None, None]
    [r] = loop.runner.take_records()
    assert isinstance(r.decision, ScaleOut)
    assert (r.decision.count, r.decision.config, r.outcome) == (2, None, "acted")
    assert r.decision.reason == "wanted; default configuration: no request with a deadline seen yet"


def test_no_gain_starts_the_default_configuration_with_the_reason() -> None:
    loop, lc, _, clock = make(1)
    feed(loop, clock, rate=0.2, strict_share=0.0)  # a trickle of relaxed requests
    for _ in range(6):  # what runs serves it all already
        lc.scale_out(M, 0.0, config="tp1-b64")
    out = loop.step(clock.now(), {})
    assert configs_of(out) == [None]
    [r] = loop.runner.take_records()
    assert r.decision is not None
    assert r.decision.reason == "wanted; default configuration: no configuration raises the serving score"


def test_a_model_with_one_configuration_is_left_as_the_scaler_asked() -> None:
    loop, _, _, clock = make(2, ModelSpec(M, 10 * GIB, 1, 5.0))
    feed(loop, clock, rate=3.0, strict_share=0.9)
    assert configs_of(loop.step(clock.now(), {})) == [None, None]
    [r] = loop.runner.take_records()
    assert r.decision == ScaleOut(M, MIXED, 2, None, "wanted")
    assert M not in loop.configs.last


def test_each_part_is_checked_with_its_own_devices_and_dry_run_records_the_choice() -> None:
    loop, lc, _, clock = make(3, dry_run=True)
    feed(loop, clock, rate=6.0, strict_share=0.9)
    assert loop.step(clock.now(), {}) == []
    assert lc.instances() == []
    records = loop.runner.take_records()
    assert {r.outcome for r in records} == {"dry_run"}
    assert sum(r.decision.count for r in records if isinstance(r.decision, ScaleOut)) == 3
    assert all(isinstance(r.decision, ScaleOut) and r.decision.config for r in records)


def test_a_fitted_curve_of_a_running_configuration_replaces_its_prior() -> None:
    loop, lc, sched, clock = make(1)
    [s] = starts(lc.scale_out(M, 0.0, config="tp2-b8"))
    lc.started(s.instance, url="http://x", load_s=5.0, now=1.0)
    eid = EndpointId(s.instance)
    sched.sync_endpoints(
        [EndpointSpec(eid, "http://x", EngineKind.VLLM, frozenset({M}), cap=8, max_batch=8, config="tp2-b8")]
    )
    sched.set_health(eid, EndpointHealth.READY)
    fitted = dataclasses.replace(WIDE, thr1=300.0, alpha=1.0, n_throughput=40)
    sched.set_estimates(eid, EndpointEstimates(perf=fitted))
    feed(loop, clock, rate=3.0, strict_share=0.5)
    loop.step(clock.now(), {s.instance: eid})
    choice = loop.configs.last[M]
    assert choice.fitted == ("tp2-b8",)
    by = {p.name: p for p in choice.profiles}
    assert (by["tp2-b8"].thr1, by["tp1-b64"].thr1) == (300.0, 100.0)


# --------------------------------------------------------------------- where the choice is computed
async def test_the_live_plan_is_computed_on_a_worker_thread_one_per_model_and_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[int] = []

    def recording(inputs: ChoiceInputs) -> ChoicePlan:
        threads.append(threading.get_ident())
        return plan_choice(inputs)

    monkeypatch.setattr(placements, "plan_choice", recording)
    supervisor = TaskSupervisor()
    plans = ThreadPlans(supervisor)
    profiles = (
        ConfigProfile.from_perf("tp2-b8", 2, 8, WIDE, prompt_tokens=50.0),
        ConfigProfile.from_perf("tp1-b64", 1, 64, CURVE, prompt_tokens=50.0),
    )
    mix = TrafficMix(6.0, T_SLOT_MS / 1000.0, (RequestKind(0.9, 0.8, 100.0), RequestKind(0.1, 3.0, 100.0)))
    inputs = ChoiceInputs(Placer(profiles, strict_below=1.1, strict_max_batch=8), mix, (), 8, 4)
    try:
        assert plans.compute(M, inputs)
        assert not plans.compute(M, inputs)  # one per model at a time
        assert plans.latest(M) is None  # none completed yet
        await plans.settled()
        assert len(threads) == 1
        assert threads[0] != threading.get_ident()  # not the event loop's thread
        plan = plans.latest(M)
        assert plan is not None
        assert plan == plan_choice(inputs)  # what the simulator computes where it is asked
        assert plan.steps
    finally:
        await supervisor.close()


def records_of(loop: ScaleLoop) -> list[tuple[str, str | None, int, str]]:
    out: list[tuple[str, str | None, int, str]] = []
    for r in loop.runner.take_records():
        assert isinstance(r.decision, ScaleOut)
        out.append((r.outcome, r.decision.config, r.decision.count, r.note or r.decision.reason))
    return out


async def test_the_live_loop_holds_a_scale_out_until_its_plan_is_ready_and_chooses_as_inline() -> None:
    supervisor = TaskSupervisor()
    plans = ThreadPlans(supervisor)
    loop, _, _, clock = make(2, ahead=plans)
    inline, _, _, inline_clock = make(2)
    for lp, ck in ((loop, clock), (inline, inline_clock)):
        feed(lp, ck, rate=6.0, strict_share=0.9)
    try:
        assert starts(loop.step(clock.now(), {})) == []  # no plan yet: held, and one is computed
        assert records_of(loop) == [("refused", None, 2, "config_choice_pending")]
        await plans.settled()
        clock.advance(5.0)
        live = configs_of(loop.step(clock.now(), {}))
        inline_clock.advance(5.0)
        assert live == configs_of(inline.step(inline_clock.now(), {}))  # the same choice
        assert len(live) == 2
        assert all(c is not None for c in live)
        assert all(o == "acted" and "devices place" in why for o, _, _, why in records_of(loop))
    finally:
        await supervisor.close()


async def test_a_live_plan_continues_over_the_instances_it_started_and_not_over_others() -> None:
    supervisor = TaskSupervisor()
    plans = ThreadPlans(supervisor)
    loop, lc, _, clock = make(1, ahead=plans)
    feed(loop, clock, rate=6.0, strict_share=0.9)
    try:
        loop.step(clock.now(), {})  # held; a plan for the empty fleet is computed
        await plans.settled()
        plan = plans.latest(M)
        assert plan is not None
        assert len(plan.steps) >= 3
        first, second = plan.steps[0].config, plan.steps[1].config
        clock.advance(5.0)
        assert configs_of(loop.step(clock.now(), {})) == [first]  # a plan for the fleet after it is asked
        clock.advance(5.0)  # ... not completed yet: the first plan goes on from its second step
        assert configs_of(loop.step(clock.now(), {})) == [second]
        await plans.settled()
        lc.scale_out(M, clock.now(), config="tp1-b64")  # an instance no plan counted on
        clock.advance(5.0)
        assert starts(loop.step(clock.now(), {})) == []
        assert records_of(loop)[-1] == ("refused", None, 1, "config_choice_pending")
    finally:
        await supervisor.close()


def test_the_live_loop_plans_with_the_gateways_telemetry_prior_and_follows_its_reload() -> None:
    """Live, a configuration neither fitted nor given a prior of its own is planned with the gateway's
    `[telemetry.prior]` (what every endpoint's model starts from), not the generic prior; a reload of
    `[telemetry]` changes it."""
    clock = FakeClock(0.0)
    policy = POLICY + '[autoscale]\nplugin = "queue-length"\n'
    sched = Scheduler(parse_policy_text(policy, "maaso.toml", default_registry()), clock)
    lc = Lifecycle(models={M: SPEC}, nodes=[NODE], evictor=LruEvictor(), settings=LifecycleSettings())
    tel = LiveTelemetry(sched, clock, TelemetryConfig(prior=PerfPriorConfig(thr1=55.0, alpha=5.0)))
    live = LiveAutoscaler(lc, sched, CollectorRegistry(), prior=lambda: tel.fleet.settings.prior)
    assert live.loop is not None

    def planned() -> dict[str, tuple[float, float]]:
        assert live.loop is not None
        profiles, fitted = live.loop.configs.profiles(live.loop.view(clock.now(), {}).models[M])
        assert fitted == ()
        return {p.name: (p.thr1, p.alpha) for p in profiles}

    assert default_prior().thr1 != 55.0
    assert planned() == {"tp2-b8": (55.0, 5.0), "tp1-b64": (55.0, 5.0)}
    tel.reconfigure(TelemetryConfig(prior=PerfPriorConfig(thr1=80.0)))
    assert planned() == {c: (80.0, default_prior().alpha) for c in ("tp2-b8", "tp1-b64")}
