"""What the scheduler core carries for telemetry: running-context sums, the dispatched/completed
correction of stale-ish engine counts, the estimates telemetry hands in, queues per class. Fake clock,
no sockets."""

from __future__ import annotations

import pytest

from gateway.core.clock import FakeClock
from gateway.core.types import SLO, ApiKind, EndpointId, EngineGauges, ModelName, RequestId
from gateway.sched.decisions import Dispatch
from gateway.sched.perf import default_prior
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointEstimates, EndpointView
from gateway.sched.types import QueueLimits
from tests.unit.test_sched_scheduler import READY, policy, spec

A = EndpointId("a")


def req(
    name: str, *, prompt: int = 100, predicted: float | None = 50.0, cls: str = "default"
) -> SchedRequest:
    return SchedRequest(
        id=RequestId(name),
        model=ModelName("m"),
        api=ApiKind.CHAT,
        arrival=1000.0,
        slo=SLO(slo_class=cls),
        prompt_tokens=prompt,
        max_tokens=None,
        stream=True,
        predicted_output_tokens=predicted,
    )


@pytest.fixture
def sched() -> Scheduler:
    s = Scheduler(policy(), FakeClock(), QueueLimits(stale_after_s=10.0))
    s.sync_endpoints([spec("a", cap=2)])
    s.set_health(A, READY)
    return s


def view(s: Scheduler) -> EndpointView:
    v = s.endpoint_view(A)
    assert v is not None
    return v


def test_running_context_sums_follow_dispatch_and_completion(sched: Scheduler) -> None:
    assert isinstance(sched.submit(req("r1", prompt=100, predicted=50.0)), Dispatch)
    assert isinstance(sched.submit(req("r2", prompt=300, predicted=None)), Dispatch)
    v = view(sched)
    assert (v.inflight, v.running_prompt_tokens, v.running_output_tokens) == (2, 400, 50.0)
    assert sched.inflight_on(A) == 2
    sched.complete(RequestId("r1"))
    v = view(sched)
    assert (v.inflight, v.running_prompt_tokens, v.running_output_tokens) == (1, 300, 0.0)
    sched.complete(RequestId("r2"))
    assert (view(sched).running_prompt_tokens, view(sched).running_output_tokens) == (0, 0.0)
    assert sched.inflight_on(EndpointId("nope")) == 0
    assert sched.endpoint_view(EndpointId("nope")) is None


def test_a_queued_request_counts_only_once_placed(sched: Scheduler) -> None:
    sched.submit(req("r1"))
    sched.submit(req("r2"))
    assert sched.submit(req("r3", prompt=1000, cls="batch")) is None  # the cap is 2
    assert view(sched).running_prompt_tokens == 200
    assert sched.queued_by_class() == {ModelName("m"): {"batch": 1}}
    out = sched.complete(RequestId("r1"))
    assert [d.req.id for d in out if isinstance(d, Dispatch)] == ["r3"]
    assert len(out) == 1
    assert view(sched).running_prompt_tokens == 1100
    assert sched.queued_by_class() == {}


def test_corrected_running_counts_what_happened_since_the_scrape(sched: Scheduler) -> None:
    assert view(sched).corrected_running == 0.0  # never scraped: the gateway's own count
    sched.observe_gauges(A, EngineGauges(running=5.0, waiting=1.0, kv_usage=0.5))
    sched.submit(req("r1"))
    sched.submit(req("r2"))
    sched.complete(RequestId("r1"))
    v = view(sched)
    assert (v.dispatched_since_scrape, v.completed_since_scrape) == (2, 1)
    assert v.corrected_running == 7.0  # 5 + 1 reported, +2 dispatched, -1 finished
    sched.observe_gauges(A, EngineGauges(running=1.0, waiting=0.0))
    v = view(sched)
    assert (v.dispatched_since_scrape, v.completed_since_scrape, v.corrected_running) == (0, 0, 1.0)


def test_estimates_reach_the_view_as_plain_numbers(sched: Scheduler) -> None:
    v = view(sched)
    assert (v.perf, v.kv_capacity_tokens, v.ttft_ewma_s, v.itl_ewma_s, v.tokens_per_s) == (None,) * 5
    est = EndpointEstimates(
        perf=default_prior(), kv_capacity_tokens=8192.0, ttft_ewma_s=0.2, itl_ewma_s=0.02, tokens_per_s=50.0
    )
    assert sched.set_estimates(A, est) == []
    v = view(sched)
    assert v.estimates == est
    assert v.perf == default_prior()
    assert (v.kv_capacity_tokens, v.ttft_ewma_s, v.itl_ewma_s, v.tokens_per_s) == (8192.0, 0.2, 0.02, 50.0)
    same = view(sched)
    sched.set_estimates(A, est)  # equal estimates: the kept view stays
    assert view(sched) is same
    assert sched.set_estimates(EndpointId("nope"), est) == []


def test_default_views_keep_working_without_telemetry() -> None:
    v = EndpointView(
        id=A,
        url="http://a",
        engine=spec("a").engine,
        models=frozenset(),
        instance_class=spec("a").instance_class,
        health=READY,
        cap=1,
        inflight=3,
    )
    assert (v.estimates, v.running_prompt_tokens, v.corrected_running) == (None, 0, 3.0)
