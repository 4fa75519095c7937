"""What the configuration choice costs its caller (the autoscale round; on the live daemon, its event
loop), at 24 and 48 devices of MaaSO's setting (`loadgen.bench.lifecycle.maaso`: five configurations, their
profiled curves, the sub-cluster split), with the model's mix read from a minute of the `maaso`
workload's requests (deadline factors 0.8-1.5, decode lengths 300-1000: ~60 kinds):

- `inline`: one `ConfigChooser.choose` of 4 instances computing the whole choice where it is asked for
  (the simulator; the placement search and one `next_config` per instance);
- `live, plan ready`: one `choose` of 4 instances on the live daemon with the plan for the fleet ready
  (computed off the loop after the previous round, `ThreadPlans`): following it;
- `live, not ready`: the same without a plan for this fleet (the runner holds the scale-out a round);
- `live, asking for a plan`: what the loop pays after a round to ask for the next plan
  (`ConfigChooser.prepare`: the mix, the profiles, the inputs handed to the worker thread; the plan's
  computation itself is the worker thread's, and costs about the inline figure for the whole room);
- then how late a 1 ms ticker on the event loop wakes while `ThreadPlans` plans the whole room in its
  worker thread (which holds the GIL meanwhile).

    berth-loadgen diag choice-cost [--repeat N]

Prints the median wall time of each, a third of the devices running the default configuration. A
wall-clock measurement: run it on a quiet machine (`flock /tmp/berth-heavy.lock`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

from gateway.config import parse_policy_text
from gateway.core.clock import FakeClock
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import SLO, ApiKind, InstanceClass, ModelName, RequestId
from gateway.lifecycle.choice_plan import ChoiceInputs, ChoicePlan, plan_choice
from gateway.lifecycle.config_choice import REPLAN_S
from gateway.lifecycle.instances import DeviceSpec, Lifecycle, LifecycleSettings, ModelSpec, NodeSpec
from gateway.lifecycle.placements import ThreadPlans
from gateway.lifecycle.scaling import ScaleLoop
from gateway.sched.autoscale import Autoscale, AutoscaleSettings
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.interface import InstanceConfig, ScaleDecision, ScaleOut, ScaleView
from gateway.sched.plugins.eviction.lru import LruEvictor
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from loadgen.bench.lifecycle import maaso_setup

M: Final = ModelName(maaso_setup.MODEL)
GIB: Final = 1 << 30
ASK: Final = 4


class _Never:
    name = "never"

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]:
        return []


class _Ahead:
    """A `PlanAhead` stand-in: the plan it is given (None: not ready); `compute` only takes the inputs
    (the worker thread's part is not the loop's cost)."""

    def __init__(self) -> None:
        self.plan: ChoicePlan | None = None
        self.asked: list[ChoiceInputs] = []

    def compute(self, model: ModelName, inputs: ChoiceInputs) -> bool:
        self.asked.append(inputs)
        return True

    def latest(self, model: ModelName) -> ChoicePlan | None:
        return self.plan


def _loop(devices: int, ahead: _Ahead | None) -> tuple[ScaleLoop, Lifecycle, FakeClock]:
    """MaaSO's model with a minute of its traffic seen and a third of the devices running tp1-b32."""
    clock = FakeClock(0.0)
    policy = maaso_setup.policy_text() + maaso_setup.autoscale_text()
    sched = Scheduler(parse_policy_text(policy, "maaso.toml", default_registry()), clock)
    spec = ModelSpec(
        M,
        20 * GIB,
        1,
        maaso_setup.LOAD_S,
        configs=tuple(InstanceConfig(c.name, c.devices, c.max_batch) for c in maaso_setup.CANDIDATES),
        default_config="tp1-b32",
    )
    nodes = [
        NodeSpec(f"n{k}", tuple(DeviceSpec(f"gpu{i}", 30 * GIB) for i in range(8)))
        for k in range(devices // 8)
    ]
    lc = Lifecycle(models={M: spec}, nodes=nodes, evictor=LruEvictor(), settings=LifecycleSettings())
    loop = ScaleLoop(
        Autoscale(_Never(), AutoscaleSettings()),
        lc,
        sched,
        priors={M: {c.name: maaso_setup.profile(c) for c in maaso_setup.CANDIDATES}},
        ahead=ahead,
    )
    rng = random.Random(0)
    t_slot_ms = maaso_setup.t_slot_s() * 1000.0
    for i in range(int(9.0 * 60)):
        at = i / 9.0
        decode = rng.randint(300, 1000)
        factor = rng.uniform(0.8, 1.5)
        req = SchedRequest(
            id=RequestId(f"r{i}"),
            model=M,
            api=ApiKind.CHAT,
            arrival=at,
            slo=SLO(deadline_ms=factor * decode * t_slot_ms),
            prompt_tokens=rng.randint(100, 400),
            max_tokens=decode,
            stream=True,
        )
        loop.arrived(req, at)
    clock.set(60.0)
    for _ in range(devices // 3):
        lc.scale_out(M, 0.0, config="tp1-b32")
    loop.configs.observe()
    return loop, lc, clock


def _median(f: Callable[[], object], repeat: int) -> float:
    f()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(devices: int, repeat: int) -> dict[str, float]:
    """Median seconds of each way (module docstring)."""
    ask = ScaleOut(M, InstanceClass.MIXED, ASK, None, "micro")
    out: dict[str, float] = {}
    loop, _, clock = _loop(devices, None)
    view = loop.view(clock.now(), {})
    out["inline"] = _median(lambda: loop.configs.choose(view, ask, view.free_devices, ()), repeat)
    ahead = _Ahead()
    loop, _, clock = _loop(devices, ahead)
    view = loop.view(clock.now(), {})
    out["live, not ready"] = _median(lambda: loop.configs.choose(view, ask, view.free_devices, ()), repeat)
    bounds = {M: 1 << 20}
    loop.configs.prepare(view, bounds)
    ahead.plan = plan_choice(ahead.asked[-1])  # the worker thread's part, outside the timing
    got = loop.configs.choose(view, ask, view.free_devices, ())
    if not got or any(p.config is None for p in got):
        raise RuntimeError(f"the plan was not followed: {got}")
    out["live, plan ready"] = _median(lambda: loop.configs.choose(view, ask, view.free_devices, ()), repeat)
    later = [view.now]

    def prepare() -> None:  # a new question each time (an unchanged fleet is asked again after REPLAN_S)
        later[0] += REPLAN_S
        loop.configs.prepare(dataclasses.replace(view, now=later[0]), bounds)

    out["live, asking for a plan"] = _median(prepare, repeat)
    return out


async def _lag_while_planning(devices: int) -> tuple[float, list[float]]:
    """The seconds `ThreadPlans` takes for the whole room's plan, and how late a 1 ms ticker on the event
    loop woke meanwhile (the worker thread holds the GIL while it plans)."""
    ahead = _Ahead()
    loop, _, clock = _loop(devices, ahead)
    loop.configs.prepare(loop.view(clock.now(), {}), {M: 1 << 20})
    supervisor = TaskSupervisor()
    plans = ThreadPlans(supervisor)
    lags: list[float] = []
    planning = True

    async def ticker() -> None:
        last = time.perf_counter()
        while planning:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            lags.append(max(0.0, now - last - 0.001))
            last = now

    try:
        tick = supervisor.spawn("lag-ticker", ticker, restart=False)
        await asyncio.sleep(0.02)
        lags.clear()
        t0 = time.perf_counter()
        plans.compute(M, ahead.asked[-1])
        await plans.settled()
        took = time.perf_counter() - t0
        planning = False
        await tick
    finally:
        await supervisor.close()
    return took, sorted(lags)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen diag choice-cost", description=__doc__)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    print(f"one choose of {ASK} instances, and one ask for a plan; median of {a.repeat} (ms)")
    cols = ("inline", "live, plan ready", "live, not ready", "live, asking for a plan")
    print("| devices | " + " | ".join(cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    for devices in (24, 48):
        got = measure(devices, a.repeat)
        print(f"| {devices} | " + " | ".join(f"{got[c] * 1000.0:.3f}" for c in cols) + " |")
    print()
    print("the event loop while the worker thread plans the whole room (a 1 ms ticker's lateness, ms)")
    print("| devices | plan (ms) | ticks | lag p50 | lag max |")
    print("| --- | --- | --- | --- | --- |")
    for devices in (24, 48):
        took, lags = asyncio.run(_lag_while_planning(devices))
        mid = lags[len(lags) // 2] if lags else 0.0
        top = lags[-1] if lags else 0.0
        print(f"| {devices} | {took * 1000.0:.0f} | {len(lags)} | {mid * 1000.0:.2f} | {top * 1000.0:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
