"""LiveTelemetry on a fake clock over the real sans-IO scheduler: the finish phase only appends,
refresh() folds in and hands estimates to the scheduler, staleness fails open, [telemetry] reloads."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from gateway.config.schema import PerfPriorConfig, TelemetryConfig
from gateway.core.clock import FakeClock
from gateway.core.slo import Allotment
from gateway.core.types import SLO, ApiKind, EndpointId, EngineGauges, ModelName, RequestId
from gateway.dispatch.context import RequestContext
from gateway.front.api import finished_record
from gateway.sched.decisions import Dispatch
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import QueueLimits
from gateway.telemetry.engine_metrics import VLLM_METRICS
from gateway.telemetry.live import PUSH_SLICE, LiveTelemetry
from gateway.telemetry.perfmodel import Part
from gateway.telemetry.promtext import parse
from gateway.telemetry.records import FinishedRequest as FinishedRecord
from tests.unit.test_perfmodel import TRUTHS, feed
from tests.unit.test_sched_scheduler import READY, policy, spec

A = EndpointId("a")


def finish(tel: LiveTelemetry, ctx: RequestContext) -> None:
    """What the front's finish phase hands telemetry for `ctx`."""
    record = finished_record(ctx)
    if record is not None:
        tel.on_finish(record)


class Rig:
    def __init__(self, *, pending_limit: int = 100) -> None:
        self.clock = FakeClock()
        self.sched = Scheduler(policy(), self.clock, QueueLimits(stale_after_s=10.0))
        self.sched.sync_endpoints([spec("a", cap=8)])
        self.sched.set_health(A, READY)
        self.tel = LiveTelemetry(self.sched, self.clock, TelemetryConfig(), pending_limit=pending_limit)

    def run_request(
        self,
        name: str,
        *,
        prompt_chars: int = 400,
        tokens: int = 5,
        prompt_tokens: int = 100,
        ttft: float = 0.2,
    ) -> RequestContext:
        """One streamed request through the scheduler, timed on the fake clock."""
        sreq = SchedRequest(
            id=RequestId(name),
            model=ModelName("m"),
            api=ApiKind.CHAT,
            arrival=self.clock.now(),
            slo=SLO(),
            prompt_tokens=prompt_tokens,
            max_tokens=None,
            stream=True,
            predicted_output_tokens=20.0,
        )
        ctx = RequestContext(id=name, api=ApiKind.CHAT, arrival=self.clock.now(), stream=True)
        ctx.sched = sreq
        ctx.prompt_chars = prompt_chars
        d = self.sched.submit(sreq)
        assert isinstance(d, Dispatch)
        ctx.endpoint = d.endpoint.id
        ctx.attempts = 1
        ctx.dispatched_at = self.clock.now()
        self.clock.advance(ttft)
        ctx.first_token_at = self.clock.now()
        ctx.itl_gaps = [0.01] * (tokens - 1)
        self.clock.advance(0.01 * (tokens - 1))
        ctx.output_tokens = tokens
        ctx.prompt_tokens = prompt_tokens
        self.sched.complete(sreq.id)
        ctx.finished_at = self.clock.now()
        return ctx


def test_the_finish_phase_only_queues_and_refresh_folds_in() -> None:
    rig = Rig()
    finish(rig.tel, rig.run_request("r1"))
    assert rig.tel.pending == 1
    assert A not in rig.tel.fleet.endpoints or rig.tel.fleet.endpoints[A].timings.ttft.n == 0
    rig.tel.refresh()
    assert rig.tel.pending == 0
    ep = rig.tel.fleet.endpoints[A]
    assert ep.timings.ttft.ewma.value == pytest.approx(0.2)
    view = rig.sched.endpoint_view(A)
    assert view is not None
    assert view.ttft_ewma_s == pytest.approx(0.2)
    assert view.itl_ewma_s == pytest.approx(0.01)
    assert view.perf == default_prior()
    assert rig.tel.tokens.observations("m") == 1  # 400 chars / 100 tokens
    assert rig.tel.fleet.attainment.by_class(rig.clock.now())["default"].met == 1


def test_the_finished_record_names_the_scheduler_request() -> None:
    # The autoscaler matches a finish to the open call it may have counted already (cato-sla).
    ctx = Rig().run_request("r7")
    record = finished_record(ctx)
    assert record is not None
    assert (record.request, record.allotment) == (RequestId("r7"), None)
    # ... and a task call's own share of its task SLA, which cato-sla measures it against
    assert ctx.sched is not None
    ctx.sched = dataclasses.replace(ctx.sched, allotment=Allotment(2.0, e2e=False))
    record = finished_record(ctx)
    assert record is not None
    assert record.allotment == Allotment(2.0, e2e=False)


def test_timelines_settle_up_to_the_oldest_running_request() -> None:
    rig = Rig()
    slow = SchedRequest(
        id=RequestId("slow"),
        model=ModelName("m"),
        api=ApiKind.CHAT,
        arrival=rig.clock.now(),
        slo=SLO(),
        prompt_tokens=100,
        max_tokens=None,
        stream=True,
    )
    assert isinstance(rig.sched.submit(slow), Dispatch)
    started = rig.clock.now()
    rig.clock.advance(1.0)
    finish(rig.tel, rig.run_request("r1"))  # ran beside the slow one, which has not finished yet
    assert rig.tel.settle_points() == {A: started}
    prefill = rig.tel.fleet.endpoints[A].prediction_error["ttft"]
    rig.tel.settle()
    assert prefill.n == 0  # r1's first token may have shared an iteration with the slow one's
    rig.sched.complete(slow.id)  # (it failed before its first token: an untracked span)
    ctx = RequestContext(id="slow", api=ApiKind.CHAT, arrival=started, stream=True)
    ctx.sched, ctx.endpoint, ctx.attempts, ctx.dispatched_at = slow, A, 1, started
    ctx.outcome, ctx.finished_at = "engine_error", rig.clock.now()
    finish(rig.tel, ctx)
    rig.clock.advance(1.0)
    finish(rig.tel, rig.run_request("r2"))  # alone
    assert rig.tel.settle_points() == {A: rig.clock.now()}
    rig.tel.settle()
    assert prefill.n == 1  # r2 found the endpoint idle; r1 overlapped the untracked one
    assert prefill.value is not None


def test_lost_finished_requests_reset_the_timelines() -> None:
    rig = Rig(pending_limit=1)
    for i in range(2):
        finish(rig.tel, rig.run_request(f"r{i}"))
    rig.tel.refresh()
    timeline = rig.tel.fleet.endpoints[A].timeline
    assert len(timeline) == 1
    rig.tel.settle()
    assert (len(timeline), timeline.known_from) == (0, rig.clock.now())


def test_requests_rejected_before_admission_teach_nothing() -> None:
    rig = Rig()
    ctx = RequestContext(id="x", api=ApiKind.CHAT, arrival=rig.clock.now())
    ctx.finished_at = rig.clock.now()
    finish(rig.tel, ctx)
    assert rig.tel.pending == 0


def test_a_full_queue_drops_the_oldest_and_counts_them() -> None:
    rig = Rig(pending_limit=2)
    for i in range(3):
        finish(rig.tel, rig.run_request(f"r{i}"))
    assert (rig.tel.pending, rig.tel.dropped) == (2, 1)


def test_refit_on_refresh_and_a_reloaded_prior_restarts_the_fits() -> None:
    rig = Rig()
    rig.tel.refresh(refit=True)
    assert rig.tel.last_refit_at == rig.clock.now()
    old = rig.tel.fleet.endpoints[A]
    with capture_logs() as logs:
        rig.tel.reconfigure(msgspec.structs.replace(TelemetryConfig(), prior=PerfPriorConfig(k1=5e-4)))
        rig.tel.refresh()
    assert "telemetry_config_applied" in [e["event"] for e in logs]
    assert rig.tel.fleet.endpoints[A] is not old
    view = rig.sched.endpoint_view(A)
    assert view is not None
    assert view.perf is not None
    assert view.perf.k1 == 5e-4


def test_stale_metrics_fail_open_and_recover() -> None:
    rig = Rig()
    rig.sched.observe_gauges(A, EngineGauges(running=0.0, waiting=0.0, kv_usage=0.1))
    states: list[bool] = []
    rig.tel.refresh()
    states.append(rig.tel.fleet.fail_open.active)
    rig.clock.advance(10.5)
    with capture_logs() as logs:
        rig.tel.refresh()
        rig.tel.refresh()  # logged once, on the transition
    states.append(rig.tel.fleet.fail_open.active)
    assert states == [False, True]
    assert [e["event"] for e in logs] == ["telemetry_fail_open"]
    rig.sched.observe_gauges(A, EngineGauges(running=0.0))
    with capture_logs() as logs:
        rig.tel.refresh()
    assert [e["event"] for e in logs] == ["telemetry_fresh_again"]


def test_a_scrape_feeds_kv_capacity_and_the_engine_cross_check() -> None:
    rig = Rig()
    page = (
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1\n'
        "vllm:time_to_first_token_seconds_count 10\n"
        "vllm:time_to_first_token_seconds_sum 1.0\n"
    )
    rig.tel.on_scrape(A, EngineGauges(running=0.0, kv_usage=0.0), parse(page), VLLM_METRICS)
    assert rig.tel.fleet.endpoints[A].kv_capacity_tokens == 1600.0
    rig.tel.on_scrape(EndpointId("gone"), EngineGauges(running=0.0), parse(page), VLLM_METRICS)
    assert EndpointId("gone") not in rig.tel.fleet.endpoints


def test_scraped_histograms_are_read_again_only_when_they_change_and_forgotten_with_the_endpoint() -> None:
    rig = Rig()
    page = "vllm:time_to_first_token_seconds_count {n}\nvllm:time_to_first_token_seconds_sum {s}\n"
    seen = []
    observe = rig.tel.observe_engine

    def spy(eid: EndpointId, gauges: EngineGauges, **kw: Any) -> None:
        seen.append(kw["ttft"])
        observe(eid, gauges, **kw)

    rig.tel.observe_engine = spy  # type: ignore[method-assign]
    for n, s in ((10, 1.0), (10, 1.0), (12, 1.5)):
        rig.tel.on_scrape(A, EngineGauges(running=0.0), parse(page.format(n=n, s=s)), VLLM_METRICS)
    assert [(h.count, h.sum) for h in seen] == [(10, 1.0), (10, 1.0), (12, 1.5)]
    assert seen[1] is seen[0]  # unchanged: the same histogram, not derived again
    rig.tel.on_scrape(EndpointId("gone"), EngineGauges(running=0.0), parse(page), VLLM_METRICS)
    assert set(rig.tel._histograms) == {A, EndpointId("gone")}
    rig.tel.refresh()
    assert set(rig.tel._histograms) == {A}


async def test_the_loop_refreshes_every_interval_and_refits_when_due(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig()
    rig.tel.reconfigure(TelemetryConfig(refresh_interval_s=1.0, refit_interval_s=3.0))
    refits: list[float] = []
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:  # the fake clock moves instead of the wall clock
        if seconds == 0:
            return
        if rig.tel.last_refit_at is not None and (not refits or refits[-1] != rig.tel.last_refit_at):
            refits.append(rig.tel.last_refit_at)
        waits.append(seconds)
        if len(waits) > 8:
            raise asyncio.CancelledError
        rig.clock.advance(seconds)

    monkeypatch.setattr("gateway.telemetry.live.asyncio.sleep", fake_sleep)
    with pytest.raises(asyncio.CancelledError):
        await rig.tel.run()
    assert waits == [1.0] * 9
    start = FakeClock().now()
    assert refits == [start + 1.0, start + 4.0, start + 7.0]


@pytest.mark.parametrize(
    ("tokens", "per_slice", "slices"),
    [
        pytest.param([5] * 5, 2, [2, 2, 1], id="until-after-two"),
        pytest.param([5, 129, 5, 5, 200, 65], 3, [3, 3], id="streams-of-any-length"),
        pytest.param([300, 5], 0, [1, 1], id="at-least-one-record"),
    ],
)
def test_drain_folds_in_a_slice_and_the_slices_fold_in_everything_in_order(
    tokens: list[int], per_slice: int, slices: list[int]
) -> None:
    """`until` ends a slice (asked after each record, at least one folded); the slices together fold in
    what one drain folds in, in the same order, into the same state."""
    whole, sliced = Rig(), Rig()
    for rig in (whole, sliced):
        for i, n in enumerate(tokens):
            finish(rig.tel, rig.run_request(f"r{i}", tokens=n, ttft=0.1 + 0.01 * i))
    order: list[list[str]] = [[], []]
    for rig, seen in zip((whole, sliced), order, strict=True):
        fold = rig.tel.fleet.observe

        def observe(
            r: FinishedRecord, fold: Callable[[FinishedRecord], None] = fold, seen: list[str] = seen
        ) -> None:
            seen.append(str(r.request))
            fold(r)

        rig.tel.fleet.observe = observe  # type: ignore[method-assign]
    assert whole.tel.drain() == len(tokens)
    got = []
    while sliced.tel.pending:
        left = [per_slice]

        def until(left: list[int] = left) -> bool:
            left[0] -= 1
            return left[0] <= 0

        got.append(sliced.tel.drain(until=until))
    assert got == slices
    assert order[0] == order[1] == [f"r{i}" for i in range(len(tokens))]
    a, b = whole.tel.fleet.endpoints[A], sliced.tel.fleet.endpoints[A]
    assert (b.timings.ttft.n, b.timings.ttft.ewma.value) == (a.timings.ttft.n, a.timings.ttft.ewma.value)
    assert (b.timeline.tokens, b.timings.itl.value) == (a.timeline.tokens, a.timings.itl.value)
    now = whole.clock.now()
    assert sliced.tel.fleet.estimates(A, now) == whole.tel.fleet.estimates(A, now)


@pytest.mark.parametrize(
    ("turn_s", "slices"),
    [
        # a quiet loop: each slice runs the floor, 0.2 ms, four records of 50 µs
        pytest.param(0.0, [4, 4, 4], id="quiet-loop"),
        # a saturated one (a turn of 5 ms): after the first slice, a fifth of a turn, twenty records
        pytest.param(0.005, [4, 20, 20], id="busy-loop"),
    ],
)
async def test_the_loop_folds_a_backlog_in_slices_of_time_with_the_loop_free_between(
    monkeypatch: pytest.MonkeyPatch, turn_s: float, slices: list[int]
) -> None:
    """At each refresh the loop folds the backlog a slice of time at a time (`TurnShare`), yielding
    after each: on a busy loop a slice is longer (else the fold would fall behind and be done in one
    piece); the refresh folds in the last one."""
    rig = Rig(pending_limit=1000)
    for i in range(100):
        finish(rig.tel, rig.run_request(f"r{i}"))
    fold = rig.tel.fleet.observe

    def observe(r: FinishedRecord) -> None:
        rig.clock.advance(50e-6)  # what folding a record in costs
        fold(r)

    monkeypatch.setattr(rig.tel.fleet, "observe", observe)
    pending_at_yield: list[int] = []

    async def fake_sleep(seconds: float) -> None:
        if seconds == 0:
            pending_at_yield.append(rig.tel.pending)
            rig.clock.advance(turn_s)  # the loop's turn
            return
        if pending_at_yield or rig.tel.last_refit_at is not None:
            raise asyncio.CancelledError  # one turn of the loop is enough

    monkeypatch.setattr("gateway.telemetry.live.asyncio.sleep", fake_sleep)
    monkeypatch.setattr("gateway.core.turnshare.asyncio.sleep", fake_sleep)
    with pytest.raises(asyncio.CancelledError):
        await rig.tel.run()
    folded = [100 - p for p in pending_at_yield[:3]]
    assert [b - a for a, b in zip([0, *folded], folded, strict=False)] == slices
    assert rig.tel.pending == 0
    assert rig.tel.fleet.endpoints[A].timings.ttft.n == 100


def test_a_part_on_the_prior_is_fitted_at_the_fast_cadence_then_follows_the_normal_one() -> None:
    rig = Rig()
    rig.tel.reconfigure(
        TelemetryConfig(refit_interval_s=60.0, first_fit_interval_s=1.0, first_fit_min_observations=5)
    )
    start = rig.clock.now()
    assert rig.tel.refit_due(start) == "all"
    rig.tel.step()  # the first turn refits everything (nothing observed yet)
    assert (rig.tel.last_refit_at, rig.tel.refit_due(start + 0.5)) == (start, None)

    def alone(n: int, ttft: float) -> None:
        """`n` requests, each alone on the idle endpoint (a prefill observation each), then a turn."""
        for i in range(n):
            finish(rig.tel, rig.run_request(f"r{rig.clock.now()}", prompt_tokens=100 * (i + 1), ttft=ttft))
            rig.clock.advance(0.05)
        rig.clock.advance(1.0)
        assert rig.tel.refit_due(rig.clock.now()) == "first"
        rig.tel.step()

    def perf() -> PerfCoefficients:
        view = rig.sched.endpoint_view(A)
        assert view is not None
        assert view.perf is not None
        return view.perf

    alone(4, 0.2)
    assert perf() == default_prior()  # 4 < first_fit_min_observations
    alone(1, 0.2)
    fitted = perf()
    assert fitted.n_prefill == 5
    assert fitted.c1 == pytest.approx(0.2, rel=1e-6)
    assert (fitted.k2, fitted.c3) == (default_prior().k2, default_prior().c3)  # no decode data yet
    assert rig.tel.last_refit_at == start  # no full refit ran: only the fast check
    alone(20, 0.3)  # slower now: the fitted part waits for the full refit
    assert (perf().k1, perf().c1, perf().n_prefill) == (fitted.k1, fitted.c1, 5)
    rig.clock.advance(60.0)
    assert rig.tel.refit_due(rig.clock.now()) == "all"
    rig.tel.step()
    assert perf().n_prefill == 25
    assert perf().c1 > fitted.c1


def test_the_fast_check_visits_only_endpoints_on_the_prior(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig()
    rig.tel.reconfigure(TelemetryConfig(first_fit_min_observations=5))
    rig.tel.step()
    visited: list[object] = []

    def settle_points(only: object = None) -> dict[EndpointId, float]:
        visited.append(only)
        return {}

    monkeypatch.setattr(rig.tel, "settle_points", settle_points)
    rig.clock.advance(1.0)
    rig.tel.step()
    assert visited == [[A]]
    ep = rig.tel.fleet.endpoints[A]
    monkeypatch.setattr(type(ep), "on_prior", property(lambda self: False))
    rig.clock.advance(1.0)
    rig.tel.step()
    assert visited == [[A]]  # every part fitted: nothing to settle or fit between full refits


async def test_the_loop_hands_the_estimates_over_a_slice_of_endpoints_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Live, the refresh pushes PUSH_SLICE endpoints' estimates per turn of the event loop; the slices
    together leave the scheduler with what one synchronous `refresh` leaves it."""
    n = 2 * PUSH_SLICE + 3
    rigs = [Rig(), Rig()]
    for rig in rigs:
        rig.sched.sync_endpoints([spec(f"e{i}", cap=8) for i in range(n)])
        for i in range(n):
            rig.sched.set_health(EndpointId(f"e{i}"), READY)
        rig.tel.reconfigure(TelemetryConfig(refresh_interval_s=1.0, refit_interval_s=1000.0))
        rig.tel.step()  # the first refit, done; from now on a turn is a refresh
        for i in range(3):  # streams on the first endpoint the scheduler picks: estimates that change
            finish(rig.tel, rig.run_request(f"r{i}", ttft=0.1 * (i + 1)))
    whole, sliced = rigs
    whole.tel.refresh()
    pushed: list[list[EndpointId]] = []
    real_push = sliced.tel._push_estimates

    def push(eids: Iterable[EndpointId] | None = None) -> None:
        pushed.append(list(sliced.sched.endpoint_ids()) if eids is None else list(eids))
        real_push(eids)

    async def fake_sleep(seconds: float) -> None:
        if seconds > 0 and pushed:
            raise asyncio.CancelledError  # one turn of the loop
        if seconds == 0:
            pushed.append([])  # the event loop ran in between

    monkeypatch.setattr(sliced.tel, "_push_estimates", push)
    monkeypatch.setattr("gateway.telemetry.live.asyncio.sleep", fake_sleep)
    with pytest.raises(asyncio.CancelledError):
        await sliced.tel.run()
    assert [len(p) for p in pushed] == [PUSH_SLICE, 0, PUSH_SLICE, 0, 3]
    views = [{e: rig.sched.endpoint_view(e) for e in rig.sched.endpoint_ids()} for rig in rigs]
    got = {e: None if v is None else v.ttft_ewma_s for e, v in views[1].items()}
    assert got == {e: None if v is None else v.ttft_ewma_s for e, v in views[0].items()}
    assert any(v is not None for v in got.values())


async def test_the_loop_fits_a_part_in_steps_with_the_loop_free_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A part's fit (1.1-2 ms with a full window) is not one turn of the event loop: the loop yields
    after each of its steps, and what it fitted equals one synchronous refit."""
    rig, whole = Rig(), Rig()
    for r in (rig, whole):
        r.tel.refresh()  # telemetry follows the scheduler's endpoint
        fitter = r.tel.fleet.endpoints[A].fitter
        for i in range(200):  # a window of prefill observations and nothing else to fit
            fitter.observe_prefill(100.0 + 10 * i, (0.02 + 2e-4 * (100 + 10 * i)) * (1.0 + 0.01 * (i % 7)))
    expected = whole.tel.fleet.endpoints[A].refit()
    yields: list[int] = []

    async def fake_sleep(seconds: float) -> None:
        if seconds == 0:
            yields.append(rig.tel.fleet.endpoints[A].coefficients.n_prefill)
            return
        if rig.tel.last_refit_at is not None:
            raise asyncio.CancelledError  # one turn of the loop
        rig.clock.advance(seconds)

    ep = rig.tel.fleet.endpoints[A]
    steps = ep.refit_steps

    def timed(part: Part) -> Iterator[None]:
        for _ in steps(part):
            rig.clock.advance(0.0003)  # a step with a full window: longer than a slice on a quiet loop
            yield

    monkeypatch.setattr(ep, "refit_steps", timed)
    monkeypatch.setattr("gateway.telemetry.live.asyncio.sleep", fake_sleep)
    monkeypatch.setattr("gateway.core.turnshare.asyncio.sleep", fake_sleep)
    with pytest.raises(asyncio.CancelledError):
        await rig.tel.run()
    # the loop ran between the fit's steps, the prior still in place: after the setup and each of six
    # rounds of reweighting; the seventh's step ends the fit
    assert yields == [0] * 7 + [200]
    assert rig.tel.fleet.endpoints[A].coefficients == expected


def test_a_full_refit_settles_only_the_timelines_that_took_in_enough_for_a_refit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A settle walks every stream held; it waits until the streams taken in since the last one could
    make a refit of a part the timeline feeds due (100 observations in each window: 5 more)."""
    rig = Rig()
    rig.tel.step()
    ep = rig.tel.fleet.endpoints[A]
    feed(ep.fitter, TRUTHS["fleet-7b"], 100, rng=random.Random(5))
    ep.refit()
    assert not ep.on_prior
    visited: list[object] = []

    def settle_points(only: object = None) -> dict[EndpointId, float]:
        visited.append(only)
        return {A: rig.clock.now()} if only else {}

    monkeypatch.setattr(rig.tel, "settle_points", settle_points)

    def due() -> bool:
        return ep.settle_due  # a call: mypy would narrow the property across the asserts

    ep.added_since_settle = 4
    assert not due()
    rig.clock.advance(10.0)
    rig.tel.step()
    assert visited == [[]]
    ep.added_since_settle = 5
    assert due()
    rig.clock.advance(10.0)
    rig.tel.step()
    assert visited == [[], [A]]
    assert ep.added_since_settle == 0
