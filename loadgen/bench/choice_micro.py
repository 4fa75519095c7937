"""What the configuration choice costs the caller of `ConfigChooser.choose` (the autoscale round; on the
live daemon, its event loop), at 24 and 48 devices of MaaSO's setting (`loadgen.bench.maaso`: five
configurations, their profiled curves, the sub-cluster split), with the model's mix read from a minute
of the `maaso` workload's requests (deadline factors 0.8-1.5, decode lengths 300-1000: ~60 kinds):

- `inline`: the placement search where it is asked for (the simulator; the live daemon before it moved);
- `live, no placement yet`: the live daemon's first round (`ThreadPlacements` has none completed: the
  best next step alone);
- `live, placement ready`: the live daemon's rounds after (the completed placement followed).

    python -m loadgen.bench.choice_micro [--repeat N]

Prints the median wall time of one `choose` asking for 4 instances, a third of the devices running the
default configuration. A wall-clock measurement: run it on a quiet machine (`flock /tmp/berth-heavy.lock`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Final

from gateway.config import parse_policy_text
from gateway.core.clock import FakeClock
from gateway.core.types import SLO, ApiKind, InstanceClass, ModelName, RequestId
from gateway.lifecycle.instances import DeviceSpec, Lifecycle, LifecycleSettings, ModelSpec, NodeSpec
from gateway.lifecycle.placements import InlinePlacements, Placements, PlacementSearch
from gateway.lifecycle.scaling import ScaleLoop
from gateway.sched.autoscale import Autoscale, AutoscaleSettings
from gateway.sched.heterogeneous import Placement, TrafficMix
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.interface import InstanceConfig, ScaleDecision, ScaleOut, ScaleView
from gateway.sched.plugins.eviction.lru import LruEvictor
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from loadgen.bench import maaso

M: Final = ModelName(maaso.MODEL)
GIB: Final = 1 << 30
ASK: Final = 4


class _Never:
    name = "never"

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]:
        return []


class _NotYet:
    """The live daemon before its first search completes."""

    def placement(
        self, model: ModelName, placer: PlacementSearch, mix: TrafficMix, devices: int
    ) -> Placement | None:
        return None


class _Ready:
    """The live daemon once a search completed: its placement (computed here, outside the timing)."""

    def __init__(self) -> None:
        self.done: Placement | None = None

    def placement(
        self, model: ModelName, placer: PlacementSearch, mix: TrafficMix, devices: int
    ) -> Placement | None:
        if self.done is None:
            self.done = placer.place(mix, devices)
        return self.done


def measure(devices: int, placements: Placements, repeat: int) -> float:
    """Median seconds of one `choose` of ASK instances."""
    clock = FakeClock(0.0)
    policy = maaso.policy_text() + maaso.autoscale_text()
    sched = Scheduler(parse_policy_text(policy, "maaso.toml", default_registry()), clock)
    spec = ModelSpec(
        M,
        20 * GIB,
        1,
        maaso.LOAD_S,
        configs=tuple(InstanceConfig(c.name, c.devices, c.max_batch) for c in maaso.CANDIDATES),
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
        priors={M: {c.name: maaso.profile(c) for c in maaso.CANDIDATES}},
        placements=placements,
    )
    rng = random.Random(0)
    t_slot_ms = maaso.t_slot_s() * 1000.0
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
    view = loop.view(clock.now(), {})
    ask = ScaleOut(M, InstanceClass.MIXED, ASK, None, "micro")
    loop.configs.choose(view, ask, view.free_devices, ())  # warm (and a ready placement computed)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        loop.configs.choose(view, ask, view.free_devices, ())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.bench.choice_micro", description=__doc__)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    print(f"one choose of {ASK} instances, median of {a.repeat} (ms)")
    print("| devices | inline (placement on the caller) | live, no placement yet | live, placement ready |")
    print("| --- | --- | --- | --- |")
    for devices in (24, 48):
        row = [measure(devices, p, a.repeat) * 1000.0 for p in (InlinePlacements(), _NotYet(), _Ready())]
        print(f"| {devices} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
