"""The batch figure's pieces on the fleet simulator: the batch fed `in_flight` lines at a time, the time
the spare capacity allows, and a small run end to end (every line answered once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.bench.scheduling.batch_sim import FLEET_SEATS, Config, allowed_time, bench, passed, schedule


def test_the_batch_is_fed_in_flight_lines_at_a_time() -> None:
    cfg = Config(Path("."), lines=10, duration_s=30.0, in_flight=4)
    first, rest = schedule(cfg, "both")
    inter = [t for t in first if t.task_type == "interactive"]
    lines = [t for t in first if t.task_type == "batch"]
    assert [t.index for t in lines] == [len(inter) + i for i in range(4)]  # the first 4 lines at t = 0
    assert {t.at_s for t in lines} == {0.0}
    assert [t.index for t in rest] == [len(inter) + i for i in range(4, 10)]  # fed as lines end
    call = lines[0].calls[0]
    assert (call.cls, call.slo_class, call.slo_headers) == ("batch", "batch", True)
    assert call.slo.e2e_ms == 24 * 3600 * 1000.0  # the window's end as the deadline


def test_the_runs_share_the_interactive_trace() -> None:
    cfg = Config(Path("."), lines=20, duration_s=30.0, in_flight=4)
    inter, none = schedule(cfg, "interactive")
    both = [t for t in schedule(cfg, "both")[0] if t.task_type == "interactive"]
    assert list(inter) == both
    assert inter
    assert none == []
    alone, rest = schedule(cfg, "batch")
    assert len(alone) == min(cfg.lines, FLEET_SEATS)  # the batch alone fills the fleet
    assert all(t.task_type == "batch" for t in alone)
    assert rest == []


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
