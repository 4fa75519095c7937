"""The benchmarks that need the engine venv, end to end in a small form through `berth-loadgen bench
NAME`: `vllm` (vLLM's own benchmark client through berth, in front of simulated engines) and
`predict-real` (berth's fitted model against a real vLLM on CPU). Each exits 0, leaves report.json and
report.md, and its last line is its verdict; the figures of such short runs are not judged."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.cli import main as loadgen_main

SMALL = {
    "vllm": ("--num-prompts", "8", "--request-rate", "8", "--max-concurrency", "4"),
    "predict-real": ("--requests", "8", "--max-prompt", "200", "--max-output", "32"),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_benchmark_runs_to_its_verdict(
    name: str, engine_python: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = BENCHMARKS[name]
    assert bench.live_test == "tests/engine/test_bench_engine_smoke.py"
    out = tmp_path / "out"
    assert loadgen_main(["bench", name, *SMALL[name], "--out", str(out)]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    expected = ("verdict: PASS", "verdict: FAIL") if bench.targets else ("verdict: none",)
    assert last.startswith(expected), last
    assert isinstance(orjson.loads((out / "report.json").read_bytes()), dict | list)
    assert (out / "report.md").read_text().strip()
