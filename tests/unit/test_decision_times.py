"""The scheduler's call times (`gateway.core.decisiontime`): buckets, maximum, the admin document, the
Prometheus exposition, and the live driver recording each call it makes into the scheduler."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gateway.core.clock import FakeClock
from gateway.core.decisiontime import CALLS, DECISION_BUCKETS, SLOW_S, DecisionCollector, DecisionTimes
from gateway.core.metrics import GatewayMetrics
from gateway.core.types import SLO, ApiKind, EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.dispatch.driver import SchedulerDriver
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy, SchedulerProfile
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec, QueueLimits

durations = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [
        (0.0, 0),
        (0.00005, 0),  # on a bound: counted at that bound (Prometheus' le)
        (0.00006, 1),
        (0.005, DECISION_BUCKETS.index(0.005)),
        (0.0051, DECISION_BUCKETS.index(0.01)),
        (2.0, len(DECISION_BUCKETS)),  # above the last bound: +Inf only
    ],
    ids=["zero", "on-first-bound", "above-first", "on-5ms", "above-5ms", "above-all"],
)
def test_a_call_lands_in_the_first_bucket_at_or_above_it(seconds: float, bucket: int) -> None:
    times = DecisionTimes()
    times.record("complete", seconds)
    c = times.calls["complete"]
    assert c.buckets[bucket] == 1
    assert sum(c.buckets) == 1
    assert (c.count, c.sum_s, c.max_s) == (1, seconds, seconds)


@given(st.lists(st.tuples(st.sampled_from(CALLS), durations), max_size=60))
def test_counts_totals_and_maxima_agree_with_what_was_recorded(calls: list[tuple[str, float]]) -> None:
    times = DecisionTimes()
    for call, seconds in calls:
        times.record(call, seconds)
    doc = times.document()
    assert doc["bounds_s"] == list(DECISION_BUCKETS)
    assert doc["max_s"] == max((s for _, s in calls), default=0.0)
    for name in CALLS:
        mine = [s for call, s in calls if call == name]
        entry = doc["calls"][name]
        assert entry["count"] == len(mine)
        assert entry["sum_s"] == pytest.approx(sum(mine))
        assert entry["max_s"] == max(mine, default=0.0)
        le = entry["le"]
        assert len(le) == len(DECISION_BUCKETS) + 1
        assert le == sorted(le)  # cumulative
        assert le[-1] == len(mine)
        for bound, n in zip(DECISION_BUCKETS, le, strict=False):
            assert n == sum(1 for s in mine if s <= bound)


def test_the_collector_exports_the_histogram_and_the_maximum_per_call() -> None:
    registry = CollectorRegistry()
    times = DecisionTimes()
    registry.register(DecisionCollector(times))
    for seconds in (0.0002, 0.0004, 0.007):
        times.record("tick", seconds)
    get = registry.get_sample_value
    assert get("berth_sched_decision_seconds_count", {"call": "tick"}) == 3
    assert get("berth_sched_decision_seconds_sum", {"call": "tick"}) == pytest.approx(0.0076)
    assert get("berth_sched_decision_seconds_bucket", {"call": "tick", "le": "0.0005"}) == 2
    assert get("berth_sched_decision_seconds_bucket", {"call": "tick", "le": "0.005"}) == 2
    assert get("berth_sched_decision_seconds_bucket", {"call": "tick", "le": "+Inf"}) == 3
    assert get("berth_sched_decision_max_seconds", {"call": "tick"}) == 0.007
    assert get("berth_sched_decision_seconds_count", {"call": "submit"}) == 0


def test_the_gateway_metrics_carry_the_decision_times() -> None:
    m = GatewayMetrics()
    m.decisions.record("submit", 0.001)
    assert b'berth_sched_decision_seconds_count{call="submit"} 1.0' in m.render()
    assert b'berth_sched_decision_max_seconds{call="submit"} 0.001' in m.render()


def _sched(cap: int) -> Scheduler:
    reg = default_registry()
    pol = Policy(
        name="test",
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="ordering"),
        profile=SchedulerProfile(
            filters=(), scorers=(), picker=reg.build(PluginKind.PICKER, "max-score", None, path="picker")
        ),
    )
    sched = Scheduler(pol, FakeClock(), QueueLimits())
    e1 = EndpointId("e1")
    models = frozenset({ModelName("m")})
    spec = EndpointSpec(id=e1, url="http://e1", engine=EngineKind.VLLM, models=models, cap=cap)
    sched.sync_endpoints([spec])
    sched.set_health(e1, EndpointHealth.READY)
    return sched


def _req(name: str) -> SchedRequest:
    return SchedRequest(
        id=RequestId(name),
        model=ModelName("m"),
        api=ApiKind.CHAT,
        arrival=0.0,
        slo=SLO(),
        prompt_tokens=16,
        max_tokens=None,
        stream=False,
    )


async def test_the_driver_times_every_call_it_makes_into_the_scheduler() -> None:
    sched = _sched(cap=1)
    driver = SchedulerDriver(sched)

    def counts() -> dict[str, int]:
        return {n: c.count for n, c in driver.times.calls.items() if c.count}

    first = await driver.acquire(_req("a"))
    assert counts() == {"submit": 1}
    waiting = asyncio.ensure_future(driver.acquire(_req("b")))  # queued: the seat is taken
    await asyncio.sleep(0)
    assert counts() == {"submit": 2}
    driver.release(first.req.id)  # serves the queue: b is placed
    second = await waiting
    assert counts() == {"submit": 2, "complete": 1}
    driver.run("tick", sched.tick)
    driver.run("endpoint", sched.set_health, EndpointId("e1"), EndpointHealth.READY)
    assert counts() == {"submit": 2, "complete": 1, "tick": 1, "endpoint": 1}
    third = asyncio.ensure_future(driver.acquire(_req("c")))
    await asyncio.sleep(0)
    third.cancel()  # its client went away while it waited
    with pytest.raises(asyncio.CancelledError):
        await third
    assert counts() == {"submit": 3, "complete": 1, "tick": 1, "endpoint": 1, "cancel": 1}
    driver.release(second.req.id)
    assert driver.times.calls["complete"].count == 2
    assert driver.times.max_s >= 0.0


def test_slow_calls_are_kept_as_they_were_numbered_and_dated() -> None:
    clock = FakeClock()
    times = DecisionTimes(clock=clock.now, keep=2)
    times.record("submit", SLOW_S / 2)  # fast: counted, not kept
    clock.advance(1.0)
    times.record("complete", 0.004)
    clock.advance(1.0)
    times.record("tick", 0.012)
    clock.advance(1.0)
    times.record("complete", 0.002)
    assert times.slow_taken == 3
    start = clock.now() - 3.0
    # only the last two are kept
    assert times.slow_after(0) == [(start + 2.0, "tick", 0.012, None), (start + 3.0, "complete", 0.002, None)]
    assert times.slow_after(2) == [(start + 3.0, "complete", 0.002, None)]
    assert times.slow_after(3) == []
    doc = times.document(slow_after=2)
    assert (doc["slow_s"], doc["slow_taken"]) == (SLOW_S, 3)
    assert doc["slow"] == [[start + 3.0, "complete", 0.002, None]]
    assert doc["max_s"] == 0.012


def test_a_slow_call_is_kept_with_the_cpu_time_since_its_start() -> None:
    """The CPU clock is read at the call's start by the caller and at its end only when the call was
    slow: a slow call's CPU time is the difference; a fast one reads nothing more."""
    clock, cpu = FakeClock(), FakeClock()
    reads: list[float] = []

    def cpu_now() -> float:
        reads.append(cpu.now())
        return cpu.now()

    times = DecisionTimes(clock=clock.now, cpu_clock=cpu_now)
    start = times.cpu_clock()
    cpu.advance(0.0005)
    times.record("submit", SLOW_S / 2, start)  # fast: the CPU clock is not read again
    assert len(reads) == 1
    start = times.cpu_clock()
    cpu.advance(0.001)
    times.record("submit", 0.009, start)  # slow: 9 ms on the wall, 1 ms of CPU (it waited for a core)
    ((at, call, seconds, cpu_s),) = times.slow_after(0)
    assert (at, call, seconds) == (clock.now(), "submit", 0.009)
    assert cpu_s == pytest.approx(0.001)


async def test_the_driver_reads_the_cpu_clock_at_every_calls_start() -> None:
    """Each call the driver makes reads the thread's CPU clock once at its start (for the record of a
    slow one); a fast call reads it no more."""
    sched = _sched(cap=1)
    driver = SchedulerDriver(sched)
    reads: list[int] = []

    def cpu_now() -> float:
        reads.append(1)
        return float(len(reads))

    driver.times.cpu_clock = cpu_now
    first = await driver.acquire(_req("a"))
    driver.release(first.req.id)
    driver.run("tick", sched.tick)
    assert len(reads) == 3  # submit, complete, tick
