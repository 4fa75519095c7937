"""The workloads with prefix structure against a simulated endpoint over loopback HTTP: every request
succeeds, and the engine counts exactly the prompt tokens each call states (block boundaries are exact
there)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loadgen.engine_sim import EndpointSpec, SimFleet
from loadgen.runner import RunOptions, run_workload
from loadgen.workloads import WorkloadOptions

FIXTURE = Path(__file__).parents[1] / "unit" / "data" / "mooncake_small.jsonl"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    spec = EndpointSpec(models=("m",), profile="test-fast", speed=10.0, load_time_s=0.0, max_model_len=32_768)
    async with SimFleet([spec]) as f:
        yield f


@pytest.mark.parametrize(
    ("workload", "options", "duration"),
    [
        (f"mooncake:{FIXTURE}", WorkloadOptions(time_scale=0.05, slo_ttft_ms=5000.0), 0.0),
        ("chat", WorkloadOptions(sessions=3, turns=(2, 3), think_time_s=0.0, system_tokens=(50, 90)), 0.5),
        ("coding:pattern2", WorkloadOptions(sessions=2, context_tokens=(300, 600)), 0.5),
    ],
    ids=["mooncake", "chat", "coding"],
)
async def test_prompt_tokens_are_exact_on_the_simulator(
    fleet: SimFleet, workload: str, options: WorkloadOptions, duration: float
) -> None:
    run = RunOptions(
        target=fleet.urls[0],
        workload=workload,
        workload_options=options,
        rate=8.0,
        duration_s=duration,
        seed=2,
        gap_scale=0.0,
    )
    report = await run_workload(run)
    assert report.requests
    assert all(r.ok for r in report.requests), [r.error for r in report.requests]
    stats = fleet.endpoint(0).state()["stats"]
    assert stats["prompt_tokens"] == sum(r.prompt_tokens for r in report.requests)
    assert report.data["run"]["workload_options"] == options.to_dict()
