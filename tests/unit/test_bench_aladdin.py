"""Aladdin's benchmark: the fewest-endpoints search, the worker-count fit and the ATGT floor on synthetic
data, and a tiny run of the whole benchmark through the command line."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.bench.scheduling.aladdin import build_parser, config_from_args, guess_for, main
from loadgen.bench.scheduling.aladdin_probe import BERTH, JSQ, POLICY_DIR, AladdinConfig, policy_path
from loadgen.bench.scheduling.aladdin_report import floor_verdict, target_lines
from loadgen.bench.scheduling.aladdin_search import call_cost_s, fewest, fit_workers, slo_floor
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.profiles import EngineProfile
from loadgen.fleetsim.sim import LEFT_OUT
from loadgen.workloads.base import CallSpec, TaskSpec

PROFILE = EngineProfile(
    latency=LatencyModel(k1=1e-4, c1=0.015, k2=4e-7, c2=1.5e-4, c3=0.011),
    max_num_seqs=8,
    kv_capacity_tokens=100_000,
    max_prefill_tokens=1000,
)


def threshold(answer: int) -> tuple[list[int], Callable[[int], bool]]:
    """A monotone predicate (n >= answer) that records what it was asked."""
    asked: list[int] = []

    def ok(n: int) -> bool:
        asked.append(n)
        return n >= answer

    return asked, ok


@pytest.mark.parametrize(
    ("answer", "guess", "lo", "hi"),
    [
        (30, 30, 1, 80),  # a perfect guess: it and the one below
        (30, 31, 1, 80),
        (30, 20, 1, 80),  # guessed low: gallop up
        (30, 70, 1, 80),  # guessed high: gallop down
        (1, 10, 1, 80),  # the answer is the bound
        (80, 5, 1, 80),
        (5, 500, 1, 80),  # a guess out of range is clamped
        (5, -3, 1, 80),
        (7, 7, 7, 7),
    ],
    ids=["exact", "one-high", "low", "high", "at-lo", "at-hi", "guess-above", "guess-below", "one-point"],
)
def test_fewest_finds_the_threshold(answer: int, guess: int, lo: int, hi: int) -> None:
    asked, ok = threshold(answer)
    found = fewest(ok, lo=lo, hi=hi, guess=guess)
    assert found.fewest == answer
    assert len(asked) == len(set(asked)) == len(found.probes)  # each count probed once
    assert found.probes[answer] is True
    if answer > lo:
        assert found.probes[answer - 1] is False  # the count below was seen to fail
    assert all(lo <= n <= hi for n in asked)


def test_fewest_says_none_when_even_the_bound_fails() -> None:
    asked, ok = threshold(100)
    found = fewest(ok, lo=1, hi=40, guess=10)
    assert found.fewest is None
    assert found.probes[40] is False
    assert asked == [10, 11, 13, 17, 25, 40]  # galloping up, doubling the step, to the bound
    with pytest.raises(ValueError, match="empty"):
        fewest(ok, lo=5, hi=4, guess=4)


@given(st.integers(1, 200), st.integers(-10, 300))
def test_fewest_is_cheap_from_any_guess(answer: int, guess: int) -> None:
    asked, ok = threshold(answer)
    found = fewest(ok, lo=1, hi=200, guess=guess)
    assert found.fewest == answer
    distance = abs(answer - min(200, max(1, guess)))
    assert len(asked) <= 2 * math.log2(distance + 1) + 3


def test_the_worker_model_is_the_least_squares_line() -> None:
    exact = [(10.0, 7), (20.0, 12), (40.0, 22), (60.0, 32)]  # N = 0.5 rate + 2
    m = fit_workers(exact)
    assert m is not None
    assert m.k5 == pytest.approx(0.5)
    assert m.c5 == pytest.approx(2.0)
    assert m.max_residual == pytest.approx(0.0, abs=1e-9)
    assert m.points == 4
    assert m.workers(100.0) == 52
    assert m.workers(99.0) == 52  # ceil(51.5)
    noisy = [(10.0, 6), (20.0, 13), (40.0, 21), (60.0, 33)]
    n = fit_workers(noisy)
    assert n is not None
    assert n.k5 == pytest.approx(767.5 / 1475)  # by hand: Sxy / Sxx
    assert n.c5 == pytest.approx(18.25 - 767.5 / 1475 * 32.5)
    assert n.max_residual > 0.5
    assert fit_workers([(10.0, 7)]) is None
    assert fit_workers([(10.0, 7), (10.0, 8)]) is None


def test_the_search_starts_from_the_fit_then_from_the_floor() -> None:
    fl = slo_floor(PROFILE, [TaskSpec(0, 0.0, "chat", (CallSpec(100, 100),))], 10.0)
    assert guess_for([], 10.0, fl) == math.ceil(1.25 * fl.endpoints_all)
    assert guess_for([(10.0, 6)], 20.0, fl) == 12
    assert guess_for([(10.0, 7), (20.0, 12)], 40.0, fl) == 22


def test_a_call_costs_its_decode_terms_and_its_prefill() -> None:
    lat = PROFILE.latency
    # prompt 100: the prefill budget takes 10, the seats 8, the TTFT target (400 ms) 38: a share of 8
    expected = lat.k1 * 100 + lat.c1 / 8
    expected += sum(lat.k2 * (100 + i) + lat.c2 for i in range(1, 5))  # tokens 2..5
    assert call_cost_s(PROFILE, 100, 5, ttft_s=0.4) == pytest.approx(expected)
    # a prompt whose prefill alone nearly fills the TTFT target shares its iteration with nobody
    assert call_cost_s(PROFILE, 3000, 1, ttft_s=0.4) == pytest.approx(lat.k1 * 3000 + lat.c1)


def test_the_floor_is_the_cost_over_what_the_atgt_target_leaves_per_endpoint() -> None:
    tasks = [TaskSpec(i, 0.0, "chat", (CallSpec(100, 10 * (i + 1)),)) for i in range(20)]
    fl = slo_floor(PROFILE, tasks, 50.0, ttft_s=0.4, atgt_s=0.015, goodput=0.95)
    assert fl.per_endpoint == pytest.approx(1 - 0.011 / 0.015)
    costs = [call_cost_s(PROFILE, 100, 10 * (i + 1), ttft_s=0.4) for i in range(20)]
    assert fl.cost_all == pytest.approx(sum(costs) / 20)
    assert fl.cost_kept == pytest.approx(sum(costs[:19]) / 20)  # the costliest call given up
    assert fl.endpoints_all == pytest.approx(50.0 * fl.cost_all / fl.per_endpoint)
    assert fl.endpoints_kept < fl.endpoints_all
    double = slo_floor(PROFILE, tasks, 100.0, ttft_s=0.4, atgt_s=0.015, goodput=0.95)
    assert double.endpoints_all == pytest.approx(2 * fl.endpoints_all)
    with pytest.raises(ValueError, match="fixed cost"):
        slo_floor(PROFILE, tasks, 50.0, atgt_s=0.010)


def test_the_target_verdict_reads_the_floor() -> None:
    fewest: dict[str, int | None] = {BERTH: 55, JSQ: 54}
    row: dict[str, Any] = {
        "rate": 100.0,
        "floor_all": 43.0,
        "floor_kept": 34.0,
        "fewest": fewest,
        "probes": {},
    }
    doc: dict[str, Any] = {"ratio": {"rate": 100.0, BERTH: 55, JSQ: 54, "ratio": 55 / 54}, "rates": [row]}
    v = floor_verdict(doc)
    assert v is not None
    assert v["berth_ratio"] == pytest.approx(55 / 43)
    assert v["jsq_ratio"] == pytest.approx(54 / 43)
    assert not v["passed"]  # 1.28x the floor, over 1.2x
    text = "\n".join(target_lines(doc))
    assert "1.28x the floor" in text
    assert "**FAIL**" in text
    assert "Least outstanding: 54 endpoints, 1.26x the floor" in text
    fewest[BERTH] = 51  # 1.19x
    assert floor_verdict(doc)["passed"]  # type: ignore[index]
    assert "**PASS**" in "\n".join(target_lines(doc))
    # the highest rate where berth has an answer counts
    doc["rates"] = [row, {**row, "rate": 120.0, "fewest": {BERTH: None, JSQ: 60}}]
    assert floor_verdict(doc)["rate"] == 100.0  # type: ignore[index]


def test_a_tiny_benchmark_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "aladdin"
    argv = ["--rates", "3,6", "--duration", "6", "--seeds", "1", "--max-endpoints", "6", "--stop-above", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert text.index(LEFT_OUT[0]) < text.index("## Setup")  # the simulator's left-out list first
    assert "N = ceil(k5 · rate + c5)" in text
    doc = orjson.loads((out / "report.json").read_bytes())
    assert doc["left_out"] == list(LEFT_OUT)
    rows = doc["rates"]
    assert [r["rate"] for r in rows] == [3.0, 6.0]
    for row in rows:
        assert set(row["fewest"]) == {BERTH, JSQ, "power-of-two"}
        for policy, n in row["fewest"].items():
            probes = {p["endpoints"]: p for p in row["probes"][policy]}
            assert n is not None
            assert probes[n]["passed"]
            assert n == 1 or not probes[n - 1]["passed"]
    assert doc["ratio"]["rate"] == 6.0
    assert set(doc["models"]) == {BERTH, JSQ, "power-of-two"}
    assert (out / "gateway.toml").is_file()


def test_bad_arguments_are_refused() -> None:
    assert main(["--policies", "nope"]) == 2
    assert main(["--rates", "0"]) == 2


def test_the_paper_variant_runs_berths_preset_in_the_papers_order(tmp_path: Path) -> None:
    cfg = config_from_args(
        build_parser().parse_args(["--policies", "berth,aladdin-paper", "--out", str(tmp_path)])
    )
    assert isinstance(cfg, AladdinConfig)
    assert policy_path(cfg, BERTH) == POLICY_DIR / "aladdin.toml"
    paper = policy_path(cfg, "aladdin-paper")
    assert paper.parent == tmp_path
    doc = tomllib.loads(paper.read_text())
    (best_fit,) = (f["params"] for f in doc["placement"]["filters"] if f["plugin"] == "best-fit")
    assert (best_fit["order"], best_fit["rebalance_threshold"], best_fit["deadlines"]) == (
        "most-loaded",
        0.5,
        False,
    )
    assert doc["slo"]["classes"][0]["ttft_ms"] == 400.0  # its own class table, as the preset's
