"""FleetTelemetry: finished requests and scrapes in, measured latencies, fitted models, cross-checks,
predictors and attainment out. Streams come from the engine simulator (sans-IO) with a known performance
model, so the fit must recover it; times are explicit (no clock, no sleeps)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from gateway.core.types import SLO, EndpointId
from gateway.sched.perf import default_prior
from gateway.telemetry.fleet_state import COEFFICIENTS, FleetTelemetry, perf_document, prior_with
from gateway.telemetry.perfmodel import PerfModelFitter
from gateway.telemetry.promtext import Histogram
from gateway.telemetry.records import FinishedRequest, ScrapeSample, TelemetrySettings
from loadgen.engine_sim.latency import LatencyModel
from tests.unit.engine_trace import TracedStream, engine_trace

EID = EndpointId("gpu-01:8000")
TRUE = dataclasses.replace(default_prior(), k1=2.0e-4, c1=0.02, k2=1.0e-6, c2=5.0e-4, c3=0.01)
ENGINE = LatencyModel(k1=TRUE.k1, c1=TRUE.c1, k2=TRUE.k2, c2=TRUE.c2, c3=TRUE.c3)
_clock = itertools.count(1000)


def settings(**kw: object) -> TelemetrySettings:
    return TelemetrySettings(prior=default_prior(), min_observations=10, **kw)  # type: ignore[arg-type]


def stream(
    prompt: int,
    out: int,
    batch: int,  # running throughout (it sets the gaps)
    *,
    eid: EndpointId | None = EID,
    model: str = "m",
    ok: bool = True,
    streamed: bool = True,
    attempts: int = 1,
    slo: SLO = SLO(),  # noqa: B008 - frozen
    chars: int = 0,
    usage: int | None = None,
    predicted: float | None = None,
) -> FinishedRequest:
    """A request whose timings follow TRUE exactly, with `batch` requests running throughout."""
    t = float(next(_clock))
    ttft = TRUE.prefill_s(prompt)
    per_token = TRUE.decode_iter_s(batch, prompt + out / 2)
    gaps = [per_token] * (out - 1)
    first = t + 0.05 + ttft
    return FinishedRequest(
        model,
        slo.slo_class,
        slo,
        ok,
        streamed,
        eid,
        attempts,
        t,
        t + 0.05,
        first,
        first + sum(gaps),
        chars,
        usage if usage is not None else prompt,
        prompt,
        out,
        gaps,
        predicted,
    )


def busy_trace(seed: int = 7) -> list[TracedStream]:
    """From one request at a time to a saturated engine with a queue inside it."""
    return engine_trace(ENGINE, n=120, rate_lo=0.3, rate_hi=4.0, seed=seed, outputs=(10, 200))


def finished(s: TracedStream, *, offset: float = 0.0) -> FinishedRequest:
    """A stream the engine simulator served (`offset` moves it in time)."""
    return FinishedRequest(
        "m",
        "default",
        SLO(),
        True,
        True,
        EID,
        1,
        s.dispatched_at + offset,
        s.dispatched_at + offset,
        s.times[0] + offset,
        s.finished_at + offset,
        0,
        s.prompt,
        s.prompt,
        len(s.times),
        s.gaps,
        None,
    )


def test_the_fit_recovers_a_known_performance_model() -> None:
    fleet = FleetTelemetry(settings())
    fleet.keep_endpoints([EID])
    streams = busy_trace()
    for s in sorted(streams, key=lambda s: s.finished_at):
        fleet.observe(finished(s))
    fleet.refit(now=5000.0)
    assert fleet.endpoints[EID].coefficients == default_prior()  # nothing observed before settling
    fleet.settle(EID, math.inf)  # every request has finished
    assert fleet.endpoints[EID].coefficients == default_prior()  # the request path never fits
    fleet.refit(now=5000.0)
    c = fleet.endpoints[EID].coefficients
    for name in ("k1", "c1", "k2", "c2", "c3"):
        assert getattr(c, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    assert c.n_prefill >= 50  # a group of first tokens is one prefill iteration
    assert c.n_decode == sum(1 for s in streams if len(s.times) > 8)
    assert c.prefill_mape is not None
    assert c.prefill_mape < 0.01
    assert fleet.last_refit_at == 5000.0
    doc = perf_document(c)
    assert set(doc) == {"prefill", "decode", "kv", "throughput"}
    assert doc["prefill"]["n"] == c.n_prefill


def test_raw_ttft_under_load_would_have_misled_the_prefill_fit() -> None:
    """The contrast that motivates the timeline: TTFT from dispatch counts the engine's queue, which a
    linear fit puts into c1."""
    raw = PerfModelFitter(default_prior(), min_obs=10)
    for s in busy_trace():
        raw.observe_prefill(s.prompt, s.times[0] - s.dispatched_at)
    assert raw.refit().c1 > 10 * TRUE.c1


def test_prediction_error_compares_with_the_coefficients_in_force() -> None:
    fleet = FleetTelemetry(settings())
    streams = busy_trace(seed=3)
    for s in streams:
        fleet.observe(finished(s))
    fleet.settle(EID, math.inf)
    ep = fleet.endpoints[EID]
    prior_error = ep.prediction_error["ttft"].value
    assert prior_error is not None
    assert prior_error > 0.1  # the prior is not this engine
    fleet.refit(now=1.0)
    later = 1000.0  # the same traffic again, later: now judged against the fitted coefficients
    for s in streams:
        fleet.observe(finished(s, offset=later))
    fleet.settle(EID, math.inf)
    assert ep.prediction_error["ttft"].value is not None
    assert ep.prediction_error["ttft"].value < 0.01
    assert ep.prediction_error["itl"].value is not None
    assert ep.prediction_error["itl"].value < 0.01


def test_measured_latencies_per_endpoint_and_model() -> None:
    fleet = FleetTelemetry(settings())
    r = stream(1000, 11, 4)
    fleet.observe(r)
    ep = fleet.endpoints[EID]
    assert ep.timings.ttft.ewma.value == pytest.approx(TRUE.prefill_s(1000))
    assert ep.timings.itl.value == pytest.approx(TRUE.decode_iter_s(4, 1005.5))
    assert len(ep.timings.itl_gaps) == 10
    assert ep.timings.output_rate.total(r.finished_at) == 11
    model = fleet.models["m"].timings
    assert model.ttft.ewma.value == ep.timings.ttft.ewma.value
    est = fleet.estimates(EID, r.finished_at)
    assert est is not None
    assert est.ttft_ewma_s == pytest.approx(TRUE.prefill_s(1000))
    assert est.tokens_per_s == pytest.approx(11 / 60.0)
    assert est.perf == default_prior()
    summary = ep.timings.summary(r.finished_at)
    assert summary["ttft_s"]["n"] == 1  # type: ignore[index]


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({"streamed": False}, id="not-streamed"),
        pytest.param({"ok": False}, id="failed"),
        pytest.param({"attempts": 2}, id="retried"),
    ],
)
def test_only_clean_streams_feed_the_latency_models(kw: dict[str, object]) -> None:
    fleet = FleetTelemetry(settings())
    fleet.observe(stream(500, 20, 2, **kw))  # type: ignore[arg-type]
    ep = fleet.endpoints[EID]
    assert ep.timings.ttft.n == 0
    assert ep.prediction_error["ttft"].value is None


def test_kv_observations_fit_the_per_request_footprint() -> None:
    fleet = FleetTelemetry(settings(kv_capacity_tokens=50_000.0))
    rng = random.Random(11)
    h, j = 1.0, 12.0
    for _ in range(30):
        n = rng.randint(1, 20)
        ctx_sum = n * rng.uniform(100, 2000)
        used = h * ctx_sum + n * j
        fleet.observe_scrape(
            EID,
            ScrapeSample(
                running=float(n),
                kv_usage=used / 200_000.0,
                kv_capacity_tokens=200_000.0,  # the engine's page wins over the configured capacity
                ttft=None,
                itl=None,
                gateway_inflight=n,
                gateway_context_tokens=ctx_sum,
            ),
        )
    ep = fleet.endpoints[EID]
    assert ep.kv_capacity_tokens == 200_000.0
    fleet.refit(now=1.0)
    c = ep.coefficients
    assert c.h == pytest.approx(h, rel=0.01)
    assert c.j == pytest.approx(j, rel=0.05)
    assert c.n_kv == 30


def test_kv_is_not_observed_when_other_traffic_shares_the_engine() -> None:
    fleet = FleetTelemetry(settings(kv_capacity_tokens=10_000.0))
    sample = ScrapeSample(
        running=30.0,
        kv_usage=0.5,
        kv_capacity_tokens=None,
        ttft=None,
        itl=None,
        gateway_inflight=4,
        gateway_context_tokens=4000.0,
    )
    for _ in range(20):
        fleet.observe_scrape(EID, sample)
    fleet.refit(now=1.0)
    assert fleet.endpoints[EID].coefficients.n_kv == 0
    assert fleet.endpoints[EID].kv_capacity_tokens == 10_000.0  # the configured fallback


def _hist(count: float, total: float) -> Histogram:
    return Histogram(buckets=((float("inf"), count),), sum=total, count=count)


def test_engine_histograms_cross_check_the_gateway_measurement() -> None:
    fleet = FleetTelemetry(settings(crosscheck_min_samples=5))
    for _ in range(5):
        fleet.observe(stream(1000, 3, 1))  # gateway TTFT = TRUE.prefill_s(1000) = 0.22 s

    def scrape(count: float, total: float) -> None:
        fleet.observe_scrape(
            EID,
            ScrapeSample(
                running=None,
                kv_usage=None,
                kv_capacity_tokens=None,
                ttft=_hist(count, total),
                itl=None,
                gateway_inflight=0,
                gateway_context_tokens=0.0,
            ),
        )

    scrape(100, 10.0)  # the baseline: what the engine saw before counts for nothing
    scrape(105, 10.0 + 5 * 0.05)  # the engine says 50 ms: the gateway's 220 ms is 4.4x that
    ep = fleet.endpoints[EID]
    assert ep.disagreements["ttft"] == 1
    last = ep.checks["ttft"].last
    assert last is not None
    assert last.ratio == pytest.approx(0.22 / 0.05)
    for _ in range(5):
        fleet.observe(stream(1000, 3, 1))
    scrape(110, 10.25 + 5 * 0.21)  # now they agree
    assert ep.disagreements["ttft"] == 1
    assert ep.checks["ttft"].last is not None
    assert not ep.checks["ttft"].last.disagrees


def test_predictors_learn_from_finished_requests() -> None:
    fleet = FleetTelemetry(settings())
    for _ in range(30):
        fleet.observe(stream(1000, 40, 1, chars=3000, usage=1000, predicted=80.0))
    assert fleet.tokens.chars_per_token("m") == pytest.approx(3.0)
    assert fleet.tokens.estimate("m", 300) == 100
    pred = fleet.lengths.predict("m", "default", 1000, None)
    assert pred.mean == pytest.approx(40.0)
    assert pred.n == 30
    err = fleet.models["m"].output_error.value
    assert err == pytest.approx(1.0)  # predicted 80, got 40


def test_cached_predictions_match_the_predictor_until_the_history_changes() -> None:
    fleet = FleetTelemetry(settings())
    cached = fleet.predictions
    first = cached.predict("m", "default", 1000, None)
    assert first == fleet.lengths.predict("m", "default", 1000, None)
    assert first.n == 0  # no history: the default guess
    assert cached.predict("m", "default", 900, None) is first  # same bucket, same answer
    assert cached.predict("m", "default", 900, 10).mean <= 10  # max_tokens is part of the key
    fleet.observe(stream(1000, 40, 1))
    after = cached.predict("m", "default", 1000, None)
    assert after.n == 1
    assert after.mean == 40


def test_attainment_counts_every_finished_request() -> None:
    fleet = FleetTelemetry(settings())
    tight = SLO(slo_class="interactive", ttft_ms=1.0)
    fleet.observe(stream(100, 5, 1, slo=tight))  # TTFT 70 ms > 1 ms
    fleet.observe(stream(100, 5, 1))
    fleet.observe(stream(100, 5, 1, ok=False, eid=None))  # never reached an endpoint
    got = fleet.attainment.by_class(float(next(_clock)))
    assert (got["interactive"].finished, got["interactive"].met) == (1, 0)
    assert (got["default"].finished, got["default"].met) == (2, 1)


def test_fail_open_transitions() -> None:
    fleet = FleetTelemetry(settings())
    fo = fleet.fail_open
    assert fo.update(False, 1.0) is None
    assert fo.update(True, 2.0) is True
    assert (fo.active, fo.since, fo.transitions) == (True, 2.0, 1)
    assert fo.update(True, 3.0) is None
    assert fo.update(False, 4.0) is False
    assert (fo.active, fo.since, fo.transitions) == (False, None, 1)


def test_endpoints_follow_the_fleet_and_a_new_prior_restarts_the_fits() -> None:
    fleet = FleetTelemetry(settings())
    other = EndpointId("gpu-02:8000")
    fleet.keep_endpoints([EID, other])
    fleet.observe(stream(100, 5, 1))
    fleet.keep_endpoints([EID])
    assert set(fleet.endpoints) == {EID}
    old = fleet.endpoints[EID]
    fleet.set_settings(settings())  # unchanged: nothing restarts
    assert fleet.endpoints[EID] is old
    new_prior = prior_with(default_prior(), k1=1e-3, c1=None)
    fleet.set_settings(TelemetrySettings(prior=new_prior, min_observations=10))
    fresh = fleet.endpoints[EID]
    assert fresh is not old
    assert fresh.coefficients.k1 == 1e-3
    assert fresh.timings is old.timings  # measurements are kept


def test_prior_with_rejects_unknown_names_and_lists_every_coefficient() -> None:
    assert prior_with(default_prior()) == default_prior()
    with pytest.raises(ValueError, match="not a coefficient: zz"):
        prior_with(default_prior(), zz=1.0)
    assert set(COEFFICIENTS) <= {f.name for f in dataclasses.fields(default_prior())}
