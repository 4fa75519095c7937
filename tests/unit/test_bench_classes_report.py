"""The classes benchmark's report says where (a)'s interactive attainment falls below 0.90."""

from __future__ import annotations

from typing import Any

from loadgen.bench.scheduling.classes_report import crossing


def runs(attainment: dict[float, list[float]]) -> list[dict[str, Any]]:
    return [
        {"config": "a-least-outstanding", "rate": rate, "interactive_attainment": a}
        for rate, values in attainment.items()
        for a in values
    ]


def test_the_crossing_between_two_rates_of_the_sweep() -> None:
    text = crossing(runs({1.0: [0.97, 0.95], 2.0: [0.85, 0.91], 3.0: [0.1]}), [3.0, 1.0, 2.0])
    assert "between 1 and 2 req/s" in text
    assert "judged at 2." in text


def test_below_already_at_the_lowest_rate() -> None:
    text = crossing(runs({0.25: [0.36], 1.0: [0.3]}), [0.25, 1.0])
    assert "already at the lowest rate, 0.25 req/s" in text


def test_never_below() -> None:
    assert "no target rate" in crossing(runs({1.0: [0.95]}), [1.0])
