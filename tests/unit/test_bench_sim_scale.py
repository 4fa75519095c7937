"""The simulator's scale benchmark: how the curve is read (per-event cost, log-log slopes), and a tiny
run end to end (each point in a process of its own, a few seconds in all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.bench.simulator.sim_scale import ScaleConfig
from loadgen.bench.simulator.sim_scale import main as simscale_main
from loadgen.bench.simulator.sim_scale_report import curve_summary, loglog_slope, memory_model, verdicts


@pytest.mark.parametrize(
    ("xs", "ys", "slope"),
    [
        pytest.param([1.0, 10.0, 100.0], [2.0, 20.0, 200.0], 1.0, id="linear"),
        pytest.param([1.0, 10.0, 100.0], [1.0, 100.0, 10000.0], 2.0, id="quadratic"),
        pytest.param([5.0], [1.0], None, id="one-point"),
        pytest.param([5.0, 5.0], [1.0, 2.0], None, id="no-spread"),
    ],
)
def test_loglog_slope(xs: list[float], ys: list[float], slope: float | None) -> None:
    got = loglog_slope(xs, ys)
    assert got == (None if slope is None else pytest.approx(slope))


def _pt(endpoints: int, events: int, wall: float) -> dict[str, float | int]:
    return {"endpoints": endpoints, "events": events, "wall_s": wall, "requests": events // 20}


def test_the_curve_is_near_linear_when_wall_per_event_stays_flat() -> None:
    flat = curve_summary([_pt(10, 1000, 0.1), _pt(100, 10_000, 1.1), _pt(1000, 100_000, 12.0)])
    assert flat["near_linear"] is True
    assert flat["us_per_event"] == [100.0, 110.0, 120.0]
    steep = curve_summary([_pt(10, 1000, 0.1), _pt(100, 10_000, 3.0), _pt(1000, 100_000, 90.0)])
    assert steep["near_linear"] is False
    assert steep["slope_wall_vs_events"] > 1.4
    assert flat["slope_wall_vs_requests"] == pytest.approx(1.04, abs=0.01)


def _point(label: str, endpoints: int, requests: int, wall: float) -> dict[str, Any]:
    return {
        "label": label,
        "endpoints": endpoints,
        "requests": requests,
        "events": 20 * requests,
        "wall_s": wall,
        "cpu_s": wall,
        "policy": "default",
        "rss_base_mib": 60.0,
        "rss_peak_mib": 60.0 + requests / 1000,
    }


@pytest.mark.parametrize(
    ("wall", "curve_walls", "met"),
    [
        pytest.param(59.0, (1.0, 10.0, 100.0), ("MET", "MET"), id="both-met"),
        pytest.param(61.0, (1.0, 10.0, 100.0), ("NOT MET", "MET"), id="headline-slow"),
        pytest.param(30.0, (1.0, 15.0, 200.0), ("MET", "NOT MET"), id="curve-steep"),
    ],
)
def test_a_verdict_line_per_target(wall: float, curve_walls: tuple[float, ...], met: tuple[str, str]) -> None:
    head = _point("headline", 100, 100_000, wall)
    curve = [_point(f"curve-{n}", n, 30 * n, w) for n, w in zip((10, 100, 1000), curve_walls, strict=True)]
    lines = verdicts(head, curve)
    assert lines[0].startswith("VERDICT headline")
    assert lines[0].endswith(f"{met[0]} (target <= 60 s wall on one core)")
    assert lines[1].startswith("VERDICT curve")
    assert f": {met[1]} (target <= 1.05)" in lines[1]
    assert lines[2].startswith("STATED peak memory: 160 MiB RSS (headline")


@pytest.mark.parametrize(
    ("requests", "wall", "judged"),
    [
        pytest.param(99_633, 59.0, "MET (target <= 60 s wall on one core)", id="target-size-met"),
        pytest.param(99_633, 149.0, "NOT MET (target <= 60 s wall on one core)", id="target-size-slow"),
        pytest.param(
            20_000,
            30.0,
            "not judged (target <= 60 s wall on one core is for 100,000 requests; at this run's pace they "
            "would take about 150 s)",
            id="quick-run",
        ),
    ],
)
def test_a_shorter_headline_is_not_judged_against_the_target(requests: int, wall: float, judged: str) -> None:
    lines = verdicts(_point("headline", 100, requests, wall), [])
    assert lines[0].endswith(f": {judged}")


def _mem(endpoints: int, requests: int, peak: float) -> dict[str, float | int]:
    return {"endpoints": endpoints, "requests": requests, "rss_base_mib": 60.0, "rss_peak_mib": 60.0 + peak}


def test_memory_is_split_into_per_endpoint_and_per_request_growth() -> None:
    # 0.5 MiB per endpoint, 2 KiB per request
    pts = [_mem(100, 100_000, 50 + 2 * 100_000 / 1024), _mem(1000, 30_000, 500 + 2 * 30_000 / 1024)]
    model = memory_model(pts)
    assert model is not None
    assert model["per_endpoint_mib"] == pytest.approx(0.5, abs=1e-3)
    assert model["per_request_kib"] == pytest.approx(2.0, abs=1e-3)
    assert memory_model(pts[:1]) is None
    # the same requests per endpoint everywhere: the two parts cannot be told apart
    assert memory_model([_mem(10, 100, 1.0), _mem(20, 201, 2.5)]) is None


def test_headline_point_offers_the_requested_number_of_requests() -> None:
    p = ScaleConfig(
        out=Path("x"), rate_per_endpoint=0.5, headline_endpoints=100, headline_requests=100_000
    ).headline()
    assert p.rate == 50.0
    assert p.rate * p.duration_s == pytest.approx(100_000)
    curve = ScaleConfig(out=Path("x"), sizes=(10, 1000), curve_duration_s=60.0).curve()
    assert [(c.endpoints, c.rate) for c in curve] == [(10, 5.0), (1000, 500.0)]


def test_a_tiny_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "scale"
    rc = simscale_main(
        ["--out", str(out), "--headline-endpoints", "3", "--headline-requests", "30", "--sizes", "2,4",
         "--curve-duration", "8", "--rate-per-endpoint", "0.5", "--cpu", "", "--profile", "--shares"]
    )  # fmt: skip
    assert rc == 0
    doc = orjson.loads((out / "report.json").read_bytes())
    head = doc["headline"]
    assert head["endpoints"] == 3
    assert head["requests"] > 0
    assert head["events"] > head["requests"]
    assert head["rss_peak_mib"] >= head["rss_base_mib"] > 0
    assert [p["endpoints"] for p in doc["curve"]] == [2, 4]
    assert doc["curve_summary"]["us_per_event"][0] > 0
    text = (out / "report.md").read_text()
    assert "(a)" in text
    assert "(b)" in text
    assert "(c) memory" in text
    assert "PROFILED" in text
    assert "(d) where the wall time goes" in text
    assert "VERDICT headline" in text
    assert "VERDICT curve" in text
    assert "STATED peak memory" in text
    assert set(head["shares_s"]) == {"scheduler", "telemetry", "admission", "simulator"}
    assert "fleetsim/sim.py" in (out / "profile-curve-2.txt").read_text()
