"""`bench simscale --shares`: every call the simulator makes into berth's telemetry (the loop's turns,
the scrapes, the prefix index told of a dispatch, the finish phase's records) is counted as
telemetry's, once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen.bench.simulator.sim_share import instrument
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions
from loadgen.fleetsim.sim import Simulation

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def _spy(obj: object, name: str, seen: Counter[str]) -> None:
    f: Callable[..., Any] = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen[name] += 1
        return f(*args, **kwargs)

    setattr(obj, name, counted)


def test_every_telemetry_call_of_a_run_is_counted_as_telemetrys() -> None:
    fleet = tuple(EndpointSpec(models=("m",), profile="fleet-7b", seed=i, id=f"e{i}") for i in range(4))
    sim = Simulation(
        SimOptions(
            policy=POLICIES / "coding-assistant.toml",
            fleet=fleet,
            workload="sharegpt-like",
            rate=4.0,
            duration_s=6.0,
            seed=5,
            models=("m",),
        )
    )
    seen: Counter[str] = Counter()
    _spy(sim.gw.telemetry, "step", seen)
    for name in ("scrape", "dispatched", "finish"):
        _spy(sim.gw, name, seen)
    shares = instrument(sim)
    sim.run()
    assert min(seen[name] for name in ("step", "scrape", "dispatched", "finish")) > 0
    assert shares.calls["telemetry"] == sum(seen.values())
    assert shares.seconds["telemetry"] > 0.0
