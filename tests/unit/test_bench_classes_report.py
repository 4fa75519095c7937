"""The classes benchmark's report says where (a)'s interactive attainment falls below 0.90, and judges
only the targets its runs can judge."""

from __future__ import annotations

from typing import Any

from loadgen.bench.scheduling.classes import passed
from loadgen.bench.scheduling.classes_report import ADAPTIVE_TARGET, _verdicts, crossing


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


def _result(sweep_itl_kept: dict[int, float]) -> dict[str, Any]:
    """A result at one rate where (a) falls below 0.90 and (d) meets its targets, with a sweep of
    c-preempt at the static caps given (their share of requests within the ITL target)."""

    def run(config: str, attainment: float, tokens_per_s: float, cap: int = 128) -> dict[str, Any]:
        return {
            "config": config,
            "rate": 0.25,
            "seed": 0,
            "cap": cap,
            "interactive_attainment": attainment,
            "itl_kept": 1.0 if config == "d-berth" else sweep_itl_kept.get(cap, 0.998),
            "batch_tokens_per_s": tokens_per_s,
        }

    runs = [run("a-least-outstanding", 0.115, 3419.0), run("d-berth", 1.0, 3224.0)]
    sweep = [run("c-preempt", 0.187, 3325.0 if cap == 128 else 2000.0, cap) for cap in sweep_itl_kept]
    return {"target_rate": 0.25, "sweep_rate": 0.25, "runs": runs, "sweep": sweep}


def test_a_sweep_without_a_static_cap_that_keeps_the_itl_targets_is_not_a_failure() -> None:
    """`--caps 128` alone: the one static cap keeps 0.987 of requests within their ITL target, below the
    0.99 the adaptive cap's comparison asks of it: N/A, and (d)'s other targets decide."""
    result = _result({128: 0.987})
    result["verdicts"] = _verdicts(result, result["runs"], result["sweep"])
    adaptive = [v for v in result["verdicts"] if v["target"] == ADAPTIVE_TARGET]
    assert [v["verdict"] for v in adaptive] == ["N/A"]
    assert "--caps 16,32,64,128" in adaptive[0]["detail"]
    assert [v["verdict"] for v in result["verdicts"] if v not in adaptive] == ["PASS", "PASS"]
    assert passed(result)


def test_with_a_comparable_static_cap_the_adaptive_target_is_judged() -> None:
    result = _result({16: 0.999, 128: 0.987})  # 16 keeps the ITL targets: 3224 >= 0.9 x 2000
    result["verdicts"] = _verdicts(result, result["runs"], result["sweep"])
    assert [v["verdict"] for v in result["verdicts"]] == ["PASS", "PASS", "PASS"]
    assert passed(result)
    result["verdicts"][0]["verdict"] = "FAIL"  # (d) misses its attainment
    assert not passed(result)


def test_nothing_judged_is_no_pass() -> None:
    verdicts = [{"target": "at the rate where (a) < 0.90, (d) >= 0.99", "verdict": "N/A", "detail": ""}]
    assert not passed({"verdicts": verdicts})
