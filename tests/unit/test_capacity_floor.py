"""The capacity floor: the least busy time a call costs an ideal engine, and the fewest endpoints."""

from __future__ import annotations

import pytest

from loadgen.bench.scheduling.capacity import call_busy_s, floor, task_busy_s
from loadgen.bench.scheduling.scheduling_report import floor_lines
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.profiles import EngineProfile
from loadgen.workloads.base import CallSpec, TaskSpec

PROFILE = EngineProfile(
    latency=LatencyModel(k1=1e-3, c1=0.08, k2=1e-4, c2=0.01, c3=0.04),
    max_num_seqs=4,
    kv_capacity_tokens=10_000,
    max_prefill_tokens=400,
)


def test_a_call_costs_its_prefill_and_a_full_batch_share_of_each_decode_iteration() -> None:
    lat = PROFILE.latency
    # prompt 100: four such prompts fit one prefill (budget 400, 4 seqs), so a quarter of c1
    expected = lat.k1 * 100 + lat.c1 / 4
    for i in range(1, 5):  # tokens 2..5 come from decode iterations at context 100 + i
        expected += lat.k2 * (100 + i) + lat.c2 + lat.c3 / 4
    assert call_busy_s(PROFILE, 100, 5) == pytest.approx(expected)


def test_a_prompt_that_fills_the_prefill_budget_pays_the_whole_fixed_term() -> None:
    assert call_busy_s(PROFILE, 400, 1) == pytest.approx(1e-3 * 400 + 0.08)
    assert call_busy_s(PROFILE, 1000, 1) == pytest.approx(1e-3 * 1000 + 0.08)


def task(i: int, *calls: tuple[int, int, int]) -> TaskSpec:
    specs = tuple(CallSpec(p, o, model_slot=slot) for p, o, slot in calls)
    return TaskSpec(i, 0.0, "t", specs)


def test_each_model_slot_is_charged_its_own_calls() -> None:
    t = task(0, (100, 5, 0), (200, 1, 1), (100, 5, 0))
    a, b = task_busy_s(PROFILE, t)
    assert a == pytest.approx(2 * call_busy_s(PROFILE, 100, 5))
    assert b == pytest.approx(call_busy_s(PROFILE, 200, 1))


def test_the_floor_gives_up_the_costliest_share_of_tasks_per_model() -> None:
    cheap, dear = (400, 1, 0), (4000, 1, 0)  # 0.48 s and 4.08 s on model a
    tasks = [task(0, cheap), task(1, cheap), task(2, cheap), task(3, dear, (400, 1, 1))]
    every = floor(PROFILE, tasks, rate=2.0)
    assert every.busy_all[0] == pytest.approx(2.0 * (3 * 0.48 + 4.08) / 4)
    assert every.busy == every.busy_all
    assert every.endpoints == (3, 1)  # 2.76 model-a endpoint-seconds per second; b at least one
    kept = floor(PROFILE, tasks, rate=2.0, goodput=0.75)
    assert kept.busy[0] == pytest.approx(2.0 * 3 * 0.48 / 4)  # the dear task given up
    assert kept.busy[1] == 0.0
    assert kept.endpoints == (1, 1)
    assert kept.total == 2
    assert kept.utilization((3, 1)) == pytest.approx((every.busy_all[0] / 3, every.busy_all[1]))
    assert kept.utilization((3, 1), every_task=False) == pytest.approx((kept.busy[0] / 3, 0.0))


def test_the_floor_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="no tasks"):
        floor(PROFILE, [], 1.0)
    with pytest.raises(ValueError, match="goodput"):
        floor(PROFILE, [task(0, (10, 1, 0))], 1.0, goodput=0.0)


def test_the_report_sets_the_ratio_target_against_the_floor() -> None:
    lines = floor_lines("pattern1", 6.0, {"berth": 6, "least-outstanding": 6})
    assert "fewer than 3+1 = 4 endpoints" in lines[0]
    assert lines[1].startswith("- the ratio target means <= 4 endpoints (3+1)")
    assert floor_lines("pattern1", 6.0, {"berth": None, "least-outstanding": None})[1:] == []
