"""The batch figure's pieces on the fleet simulator: the batch fed `in_flight` lines at a time, the time
the spare capacity allows, and a small run end to end (every line answered once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.bench.batch_sim import FLEET_SEATS, Config, allowed_time, batch_tasks, bench, passed, schedule


def test_the_batch_is_fed_in_flight_lines_at_a_time() -> None:
    cfg = Config(Path("."), lines=10, in_flight=4)
    chains = batch_tasks(cfg, 100, cfg.in_flight)
    assert [len(t.calls) for t in chains] == [3, 3, 2, 2]  # every line once, in 4 chains from t = 0
    assert {t.at_s for t in chains} == {0.0}
    assert [t.index for t in chains] == [100, 101, 102, 103]
    call = chains[0].calls[0]
    assert (call.cls, call.slo_class, call.slo_headers) == ("batch", "batch", True)
    assert call.slo.e2e_ms == 24 * 3600 * 1000.0  # the window's end as the deadline


def test_the_runs_share_the_interactive_trace() -> None:
    cfg = Config(Path("."), lines=20, duration_s=30.0, in_flight=4)
    inter = list(schedule(cfg, "interactive"))
    both = [t for t in schedule(cfg, "both") if t.task_type == "interactive"]
    assert inter == both
    assert inter
    alone = schedule(cfg, "batch")
    assert len(alone) == min(cfg.lines, FLEET_SEATS)  # the batch alone fills the fleet
    assert all(t.task_type == "batch" for t in alone)


@pytest.mark.parametrize(
    ("tokens", "capacity", "interactive", "duration", "expected"),
    [
        pytest.param(500.0, 100.0, 50.0, 60.0, 10.0, id="within-the-chat"),
        pytest.param(5000.0, 100.0, 50.0, 60.0, 60.0 + 2000.0 / 100.0, id="after-the-chat-ends"),
        pytest.param(1000.0, 100.0, 100.0, 60.0, 60.0 + 10.0, id="no-spare-while-the-chat-runs"),
        pytest.param(1.0, 0.0, 0.0, 60.0, None, id="no-capacity"),
    ],
)
def test_allowed_time(
    tokens: float, capacity: float, interactive: float, duration: float, expected: float | None
) -> None:
    assert allowed_time(tokens, capacity, interactive, duration) == expected


def test_a_small_run_answers_every_line(tmp_path: Path) -> None:
    result = bench(Config(tmp_path, lines=40, rate=1.0, duration_s=10.0, in_flight=8), log=lambda _: None)
    both = result["figures"]["both"]
    assert both["batch_finished"] == both["batch_requests"] == 40
    assert result["figures"]["interactive"]["batch_requests"] == 0
    assert isinstance(passed(result), bool)
    assert (tmp_path / "report.md").read_text().startswith("# A 40-line batch")
