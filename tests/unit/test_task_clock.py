"""The task clock: shares of a task SLA per call, slack from the time the task already spent, expiry
after idleness, a bound on memory, learned allotments."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission.tasks import TaskClock
from gateway.core.clock import FakeClock
from gateway.core.slo import Allotment, SloClass, TaskMetric, TaskSettings

GEN = SloClass("generation", task_sla_ms=15000.0, task_metric=TaskMetric.TTFT, steps=(3.0, 1.0))
ONE = SloClass("completion", task_sla_ms=1200.0, task_metric=TaskMetric.TTFT)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param((), (1.0,), id="no-steps-one-share"),
        pytest.param((5.0, 15.0, 5.0), (0.2, 0.6, 0.2), id="cato-example"),
        pytest.param((0.9, 0.1), (0.9, 0.1), id="already-normalised"),
    ],
)
def test_shares_are_normalised(steps: tuple[float, ...], expected: tuple[float, ...]) -> None:
    assert SloClass("c", steps=steps).shares() == pytest.approx(expected)


def test_each_call_is_due_at_its_cumulative_share_of_the_task_sla() -> None:
    clock = FakeClock(0.0)
    tasks = TaskClock()
    first = tasks.call("t", clock.now(), GEN, None)
    assert (first.step, first.final, first.metric) == (0, False, TaskMetric.E2E)
    assert first.deadline == pytest.approx(11.25)  # 3/4 of 15 s
    clock.advance(12.0)  # the first call overran its allotment
    second = tasks.call("t", clock.now(), GEN, None)
    assert (second.step, second.final, second.metric) == (1, True, TaskMetric.TTFT)
    assert second.deadline == pytest.approx(15.0)  # the task's own deadline: 3 s left, not 3.75
    third = tasks.call("t", clock.now(), GEN, None)  # beyond the listed steps: the task's deadline
    assert (third.step, third.final) == (2, True)
    assert third.deadline == pytest.approx(15.0)


def test_each_call_is_allotted_its_own_share_whatever_its_predecessor_took() -> None:
    tasks = TaskClock()
    first = tasks.call("t", 0.0, GEN, None)
    assert first.allotment == Allotment(pytest.approx(11.25), e2e=True)  # type: ignore[arg-type]
    second = tasks.call("t", 14.0, GEN, None)  # after a late first call: 1 s to its deadline
    assert second.deadline == pytest.approx(15.0)
    # ... but its own share is the same 1/4 of the task SLA, on the task's measure (its first token)
    assert second.allotment == Allotment(pytest.approx(3.75), e2e=False)  # type: ignore[arg-type]
    third = tasks.call("t", 20.0, GEN, None)  # beyond the listed steps: the last step's share
    assert third.allotment == Allotment(pytest.approx(3.75), e2e=False)  # type: ignore[arg-type]
    assert TaskClock().call("t", 0.0, SloClass("plain"), None).allotment is None  # no task SLA


def test_the_sla_header_wins_over_the_class_default() -> None:
    call = TaskClock().call("t", 10.0, ONE, 600.0)
    assert call.deadline == pytest.approx(10.6)
    assert call.sla_s == pytest.approx(0.6)


def test_a_class_without_a_task_sla_gives_no_deadline() -> None:
    call = TaskClock().call("t", 0.0, SloClass("plain"), None)
    assert call.deadline is None


def test_tasks_expire_after_their_idle_time() -> None:
    clock = FakeClock(0.0)
    tasks = TaskClock(TaskSettings(idle_expiry_s=60.0))
    tasks.call("a", clock.now(), GEN, None)
    clock.advance(30.0)
    tasks.call("b", clock.now(), GEN, None)
    clock.advance(31.0)  # a: idle 61 s, b: 31 s
    assert tasks.expire(clock.now()) == 1
    assert "a" not in tasks
    assert "b" in tasks
    # a call to an expired task starts it afresh
    again = tasks.call("a", clock.now(), GEN, None)
    assert (again.step, again.start) == (0, clock.now())
    assert tasks.expired == 1


def test_a_call_keeps_its_task_alive() -> None:
    clock = FakeClock(0.0)
    tasks = TaskClock(TaskSettings(idle_expiry_s=10.0))
    for _ in range(5):
        tasks.call("a", clock.now(), GEN, None)
        clock.advance(9.0)
    assert tasks.expire(clock.now()) == 0
    assert tasks.call("a", clock.now(), GEN, None).step == 5


@settings(max_examples=50, deadline=None)
@given(
    bound=st.integers(min_value=1, max_value=20),
    keys=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=200),
)
def test_memory_is_bounded_least_recently_seen_first(bound: int, keys: list[int]) -> None:
    tasks = TaskClock(TaskSettings(max_tasks=bound, idle_expiry_s=1e9))
    recent: list[str] = []
    for i, k in enumerate(keys):
        key = f"t{k}"
        tasks.call(key, float(i), ONE, None)
        if key in recent:
            recent.remove(key)
        recent.append(key)
        assert len(tasks) <= bound
    for key in recent[-bound:]:  # the most recently seen survive
        assert key in tasks


def test_abandon_gives_the_step_back() -> None:
    tasks = TaskClock()
    first = tasks.call("t", 0.0, GEN, None)
    tasks.abandon(first)  # rejected before it ran: the retry is the same step
    assert tasks.call("t", 1.0, GEN, None).step == 0


def test_learned_allotments_follow_measured_step_durations() -> None:
    tasks = TaskClock(TaskSettings(learn_allotments=True, learn_min_samples=3))
    for i in range(3):
        assert tasks.shares(GEN.name, GEN) == pytest.approx((0.75, 0.25))  # not enough samples yet
        a = tasks.call(f"t{i}", 0.0, GEN, None)
        tasks.finished(a, 2.0)
        b = tasks.call(f"t{i}", 2.0, GEN, None)
        tasks.finished(b, 2.0)  # the second step takes as long as the first
    assert tasks.shares(GEN.name, GEN) == pytest.approx((0.5, 0.5))
    assert tasks.call("new", 0.0, GEN, None).deadline == pytest.approx(7.5)
    assert tasks.learned() == {"generation": [pytest.approx(2.0), pytest.approx(2.0)]}


def test_learning_is_off_unless_enabled() -> None:
    tasks = TaskClock(TaskSettings(learn_allotments=False, learn_min_samples=1))
    a = tasks.call("t", 0.0, GEN, None)
    tasks.finished(a, 100.0)
    b = tasks.call("t", 1.0, GEN, None)
    tasks.finished(b, 1.0)
    assert tasks.shares(GEN.name, GEN) == pytest.approx((0.75, 0.25))
