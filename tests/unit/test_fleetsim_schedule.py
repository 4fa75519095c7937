"""`schedule_of`: the one place the simulator, the eviction oracle and a simulated run's record take a
run's tasks from."""

from __future__ import annotations

import dataclasses

from loadgen.fleetsim.options import SimOptions, schedule_of
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload


def test_the_workload_schedule_is_the_live_runners_for_the_same_seed() -> None:
    opts = SimOptions(policy=None, fleet=(), workload="coding:pattern1", rate=2.0, duration_s=20.0, seed=7)
    run = RunOptions(target="x", workload="coding:pattern1", rate=2.0, duration_s=20.0, seed=7)
    tasks = list(schedule_of(opts))
    assert tasks == build_schedule(get_workload("coding:pattern1"), run)
    assert tasks  # a real schedule
    assert list(schedule_of(dataclasses.replace(opts, seed=8))) != tasks


def test_a_given_schedule_is_the_run() -> None:
    opts = SimOptions(policy=None, fleet=(), workload="coding:pattern1", rate=2.0, duration_s=20.0, seed=7)
    given = tuple(schedule_of(opts))[:3]
    assert schedule_of(dataclasses.replace(opts, schedule=given)) is given
