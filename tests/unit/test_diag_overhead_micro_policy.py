"""`diag overhead-micro --policy` takes a shipped preset's name and refuses anything else up front."""

from __future__ import annotations

import pytest

from loadgen.diag import overhead_micro


def test_unknown_policy_named_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        overhead_micro.main(["--pieces", "fleet_100", "--policy", "policies/aladdin.toml", "--rounds", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--policy 'policies/aladdin.toml'" in err
    assert "coding-assistant" in err
    assert "chat-and-batch" in err


def test_fleet_piece_requests_arrive_when_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a preset, the clock moves 5 ms a request: a run longer than the first-token target (500
    requests, 2.5 s against 2 s) must still measure requests admitted as feasible (each arrives when it
    is submitted), which the piece checks from the scheduler's admission counts."""
    from pathlib import Path

    from loadgen.diag.overhead_micro_sched import POLICY_STEP_S, POLICY_TTFT_MS, bench_sched

    n = 500
    assert n * POLICY_STEP_S * 1000 > POLICY_TTFT_MS
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert bench_sched(n, 8, stream=False, endpoints=4, policy="coding-assistant") > 0
