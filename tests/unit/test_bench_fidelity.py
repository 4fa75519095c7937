"""The fidelity benchmark's comparison: figures from a report and its calls, the checks of the simulator
against the live run (goodput absolute, P95 TTFT relative), the verdict, and the report, on synthetic
numbers (no run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.bench.simulator.fidelity import endpoint_ids, live_calls, sim_fleet
from loadgen.bench.simulator.fidelity_compare import (
    CallFigures,
    Check,
    SideFigures,
    Tolerances,
    compare,
    failed,
    pair,
    path_cost,
    side_figures,
    types_outside,
    verdict,
)
from loadgen.bench.simulator.fidelity_report import markdown


def calls(cls: str, ttfts: list[float], queue: float = 0.0, status: int = 200) -> list[CallFigures]:
    return [CallFigures(cls, status == 200, status, t, queue) for t in ttfts]


def report(tasks: dict[str, tuple[int, float]], request_goodput: float = 0.9) -> dict[str, Any]:
    return {
        "overall": {"goodput": request_goodput},
        "tasks": {name: {"count": n, "goodput": g} for name, (n, g) in tasks.items()},
    }


def side(goodput_a: float, ttft_scale: float = 1.0, queue: float = 0.0) -> SideFigures:
    """Two task types of 100 tasks each: `a` at `goodput_a`, `b` always met; TTFTs 1..100 ms x scale."""
    ttfts = [float(i) * ttft_scale for i in range(1, 101)]
    return side_figures(
        report({"a": (100, goodput_a), "b": (100, 1.0)}),
        calls("a", ttfts, queue) + calls("b", [2 * t for t in ttfts], queue),
    )


def test_side_figures_weigh_task_goodput_by_count_and_take_request_percentiles() -> None:
    s = side_figures(
        report({"a": (300, 0.5), "b": (100, 1.0)}),
        calls("a", [10.0] * 95 + [100.0] * 5, queue=4.0) + calls("b", [50.0], status=429),
    )
    assert s.goodput == pytest.approx((150 + 100) / 400)
    assert s.tasks == 400
    assert s.calls == 101
    assert s.refused == 1
    assert s.types["a"].ttft_p95_ms == pytest.approx(14.5)  # numpy's linear interpolation
    assert s.types["a"].service_p50_ms == pytest.approx(6.0)  # TTFT minus queue
    assert s.types["b"].ttft_p95_ms is None  # a refused call has no TTFT that counts
    assert s.types["b"].refused == 1


@pytest.mark.parametrize(
    ("live", "sim", "ok"),
    [
        # overall goodput = (a + 1) / 2: live 0.95
        pytest.param(side(0.90), side(0.94), True, id="goodput-within"),
        pytest.param(side(0.90), side(0.96), True, id="goodput-at-the-limit"),
        pytest.param(side(0.90), side(0.97), False, id="goodput-over"),
        pytest.param(side(0.90), side(0.83), False, id="goodput-under"),
        pytest.param(side(0.90), side(0.90, ttft_scale=1.15), True, id="ttft-at-the-limit"),
        pytest.param(side(0.90), side(0.90, ttft_scale=0.86), True, id="ttft-lower-within"),
        pytest.param(side(0.90), side(0.90, ttft_scale=1.2), False, id="ttft-over"),
        pytest.param(side(0.90), side(0.90, ttft_scale=0.8), False, id="ttft-under"),
    ],
)
def test_the_verdict_holds_goodput_absolute_and_ttft_relative(
    live: SideFigures, sim: SideFigures, ok: bool
) -> None:
    assert verdict(compare(live, sim)) is ok


def test_a_task_type_outside_the_ttft_band_is_reported_and_fails_only_when_judged() -> None:
    live = side_figures(
        report({"a": (100, 1.0), "b": (10, 1.0)}), calls("a", [100.0] * 100) + calls("b", [10.0])
    )
    sim = side_figures(
        report({"a": (100, 1.0), "b": (10, 1.0)}), calls("a", [100.0] * 100) + calls("b", [20.0])
    )
    checks = compare(live, sim)
    assert verdict(checks)
    assert [c.name for c in types_outside(checks)] == ["p95 TTFT b"]
    strict = compare(live, sim, Tolerances(per_type_ttft=True))
    assert [c.name for c in failed(strict)] == ["p95 TTFT b"]
    assert not verdict(strict)


def test_per_type_goodput_is_shown_not_judged() -> None:
    live = side_figures(report({"a": (100, 0.5), "b": (100, 1.0)}), calls("a", [1.0]) + calls("b", [1.0]))
    sim = side_figures(report({"a": (100, 0.55), "b": (100, 0.95)}), calls("a", [1.0]) + calls("b", [1.0]))
    checks = {c.name: c for c in compare(live, sim)}
    assert checks["goodput"].ok  # 0.75 on both sides
    assert not checks["goodput a"].ok  # 0.05 apart, but not part of the verdict
    assert not checks["goodput a"].gate
    assert verdict(list(checks.values()))


@pytest.mark.parametrize(
    ("check", "diff", "ok"),
    [
        pytest.param(Check("x", 0.9, 0.95, "abs", 0.03), 0.05, False, id="abs"),
        pytest.param(Check("x", 200.0, 230.0, "rel", 0.15), 0.15, True, id="rel-edge"),
        pytest.param(Check("x", None, 230.0, "rel", 0.15), None, False, id="missing-live"),
        pytest.param(Check("x", 0.0, 0.0, "rel", 0.15), 0.0, True, id="both-zero"),
        pytest.param(Check("x", 0.0, 1.0, "rel", 0.15), None, False, id="zero-live"),
    ],
)
def test_check_differences(check: Check, diff: float | None, ok: bool) -> None:
    assert check.diff == (None if diff is None else pytest.approx(diff))
    assert check.ok is ok


def test_side_figures_round_trip_through_json() -> None:
    s = side(0.8, queue=3.0)
    assert SideFigures.from_dict(orjson.loads(orjson.dumps(s.to_dict()))) == s


def test_path_cost_is_the_probe_types_service_time_difference() -> None:
    live = side_figures(report({"completion": (10, 1.0)}), calls("completion", [150.0] * 10, queue=10.0))
    sim = side_figures(report({"completion": (10, 1.0)}), calls("completion", [100.0] * 10, queue=0.0))
    p = pair("berth", 8.5, live, sim)
    assert path_cost(p)["service_p50_extra_ms"] == pytest.approx(40.0)


def test_the_report_names_every_verdict_and_the_failing_figure() -> None:
    good = pair("berth", 8.5, side(0.9), side(0.91), live_run={"cpu": {"berth": {"cpu_share": 0.4}}})
    bad = pair("round-robin", 10.5, side(0.9), side(0.9, ttft_scale=1.5))
    text = markdown([good, bad], {"setting": "test", "speed": 2.0, "left_out": ["network"]})
    assert "| berth | 8.5 |" in text
    assert "PASS" in text
    assert "FAIL" in text
    assert "round-robin at 10.5: FAIL on p95 TTFT" in text
    assert "1 of 2 comparisons pass" in text
    assert "- network" in text
    assert "40%" in text  # berth's CPU share


def test_the_report_lists_task_types_outside_the_band_beside_a_pass() -> None:
    live = side_figures(
        report({"a": (100, 1.0), "b": (10, 1.0)}), calls("a", [100.0] * 100) + calls("b", [10.0])
    )
    sim = side_figures(
        report({"a": (100, 1.0), "b": (10, 1.0)}), calls("a", [100.0] * 100) + calls("b", [20.0])
    )
    text = markdown([pair("berth", 8.5, live, sim)], {"setting": "test", "speed": 2.0})
    assert "| PASS | no |" in text
    assert "berth at 8.5: per-type P95 TTFT outside ±15 %: b +100%" in text


def test_live_calls_scale_latencies_back_by_the_speed(tmp_path: Path) -> None:
    rec = tmp_path / "record.jsonl"
    lines = [
        {
            "class": "completion",
            "observed": {"ok": True, "status": 200, "ttft_ms": 100.0, "queue_ms": 5.0, "e2e_ms": 300.0},
        },
        {
            "class": "generation",
            "observed": {"ok": False, "status": 429, "ttft_ms": None, "queue_ms": None, "e2e_ms": None},
        },
    ]
    rec.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    got = live_calls(rec, 2.0)
    assert got[0] == CallFigures("completion", True, 200, 200.0, 10.0, 600.0)
    assert got[1] == CallFigures("generation", False, 429, None, None, None)


def test_the_simulated_fleet_is_the_live_one_under_the_live_ids() -> None:
    fleet = sim_fleet(2, 1)
    assert [s.id for s in fleet] == endpoint_ids(2, 1) == ["a00", "a01", "b02"]
    assert [s.models for s in fleet] == [("code-a-7b",), ("code-a-7b",), ("code-b-7b",)]
    assert {s.scheduling_policy for s in fleet} == {"priority"}
    assert {s.speed for s in fleet} == {1.0}
