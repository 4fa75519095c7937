"""The benchmarks whose smoke run starts servers or engines (berth, simulated engines, redis-server), end to
end in their smoke form through `berth-loadgen bench NAME` (see tests/unit/test_bench_smoke.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadgen.bench.skeleton import Benchmark
from tests.unit.test_bench_smoke import run_smoke, smoke_cases


@pytest.mark.parametrize(("bench", "extra"), smoke_cases(processes=True))
def test_the_benchmark_runs_to_its_verdict(
    bench: Benchmark, extra: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if "redis-server" in bench.needs and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    run_smoke(bench, extra, tmp_path / "out", capsys)
