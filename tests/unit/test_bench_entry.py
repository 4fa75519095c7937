"""A benchmark's exit status says whether it ran, not whether its targets passed."""

from __future__ import annotations

import pytest

from loadgen.bench.entry import config_or_reason, run_bench


@pytest.mark.parametrize("verdict", [True, False], ids=["pass", "fail"])
def test_a_benchmark_that_ran_exits_0_and_prints_its_verdict(
    verdict: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_bench("demo", 3, lambda c: c * 2, passed=lambda r: (r == 6) is verdict) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("verdict: PASS" if verdict else "verdict: FAIL")


def test_a_refused_configuration_exits_2_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    def build() -> int:
        raise ValueError("--rates must be positive")

    cfg = config_or_reason(build)
    assert run_bench("demo", cfg, lambda c: c) == 2
    assert "berth-loadgen bench demo: --rates must be positive" in capsys.readouterr().err


def test_an_interrupted_benchmark_exits_130() -> None:
    def bench(_: int) -> int:
        raise KeyboardInterrupt

    assert run_bench("demo", 1, bench) == 130
