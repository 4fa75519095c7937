"""The accuracy benchmark's scoring path: what the client recorded goes through berth's own telemetry
(`loadgen.bench.simulator.predict_telemetry.BerthTelemetry`), fed traces of the sans-IO engine simulator (no
sockets, no sleeps)."""

from __future__ import annotations

import math

import pytest

from gateway.sched.perf import default_prior
from gateway.telemetry.lengths import LengthPrediction
from gateway.telemetry.timeline import MIN_KEPT_GAPS
from loadgen.bench.simulator.predict_client import Scrape, Stream
from loadgen.bench.simulator.predict_figures import (
    LENGTH_WARMUP,
    decode_mape,
    kv_mape,
    length_figures,
    prefill_mape,
)
from loadgen.bench.simulator.predict_telemetry import BerthTelemetry, scrape_sample
from loadgen.engine_sim.profiles import get_profile
from tests.unit.engine_trace import engine_trace

TRUE = get_profile("fleet-7b").latency


def recorded(seed: int, speed: float, *, at: float = 1000.0, n: int = 120) -> list[Stream]:
    """A trace of the true model as this benchmark's client records it: wall seconds from `at`, the
    engine `speed` times faster than the profile."""
    out = []
    for s in engine_trace(TRUE, n=n, rate_lo=0.3, rate_hi=1.5, seed=seed, max_num_seqs=16):
        st = Stream(s.index, s.prompt, s.output, dispatch=at + s.dispatched_at / speed)
        st.times = [at + t / speed for t in s.times]
        st.finished = at + s.finished_at / speed
        st.usage_tokens = len(s.times)
        out.append(st)
    return out


def test_berth_derives_the_observations_and_fits_the_true_model() -> None:
    streams = recorded(seed=3, speed=4.0)
    berth = BerthTelemetry()
    obs = berth.add_phase(streams, [], speed=4.0)
    fit = berth.refit()
    # the timeline's contract: one decode observation per clean stream with enough gaps
    assert len(obs.decode) == sum(1 for s in streams if len(s.times) > MIN_KEPT_GAPS)
    assert len(obs.prefill) > 60
    assert fit.n_prefill == len(obs.prefill)
    assert fit.n_decode == len(obs.decode)
    # profile seconds: exact receipts time the true model closely, and the fit recovers it
    assert prefill_mape(fit, TRUE, obs.prefill) <= 0.10
    assert decode_mape(fit, TRUE, obs.decode) <= 0.10


def test_a_later_phase_reads_as_it_would_alone() -> None:
    """Phases run at different speed-ups and wall times lie one after the other on the endpoint's
    clock: the second derives what it would on a fresh endpoint."""
    first, second = recorded(seed=1, speed=4.0, at=50.0), recorded(seed=2, speed=10.0, at=10.0)
    both = BerthTelemetry()
    both.add_phase(first, [], speed=4.0)
    after = both.add_phase(second, [], speed=10.0)
    alone = BerthTelemetry().add_phase(second, [], speed=10.0)
    assert len(after.prefill) == len(alone.prefill) > 0
    assert len(after.decode) == len(alone.decode) > 0
    for a, b in zip(after.prefill, alone.prefill, strict=True):
        assert a.prompt_tokens == b.prompt_tokens
        assert a.idle == b.idle
        assert a.seconds == pytest.approx(b.seconds, rel=1e-6)
    for c, d in zip(after.decode, alone.decode, strict=True):
        assert (c.batch, c.avg_context) == pytest.approx((d.batch, d.avg_context), rel=1e-9)
        assert c.seconds == pytest.approx(d.seconds, rel=1e-6)


def stream(index: int, prompt: int, dispatch: float, finished: float, predicted: float) -> Stream:
    st = Stream(index, prompt, 10, dispatch=dispatch, finished=finished)
    st.predicted = LengthPrediction(mean=predicted, std=0.0, p50=predicted, p90=predicted, p99=predicted, n=1)
    return st


def test_a_scrape_counts_what_was_in_flight_when_it_came_back_and_feeds_kv() -> None:
    streams = [
        stream(0, 100, dispatch=0.0, finished=5.0, predicted=40.0),
        stream(1, 300, dispatch=1.0, finished=5.0, predicted=20.0),
        stream(2, 900, dispatch=0.0, finished=1.5, predicted=10.0),  # finished before the scrape
        stream(3, 700, dispatch=2.5, finished=5.0, predicted=10.0),  # dispatched after it
    ]
    sc = Scrape(sent=1.9, received=2.0, running=2.0, waiting=0.0, kv_usage=0.05, kv_capacity=10_000.0)
    sample = scrape_sample(streams, sc)
    assert sample.gateway_inflight == 2
    assert sample.gateway_context_tokens == (100 + 20.0) + (300 + 10.0)  # prompt + half the predicted output
    obs = BerthTelemetry().add_phase([], [sc], speed=1.0)
    assert obs.kv == []  # nothing in flight, so berth has nothing to explain the engine's KV with
    obs = BerthTelemetry().add_phase(streams, [sc], speed=1.0)
    assert obs.kv == [(430.0 / 2, 500.0 / 2)]  # per request: berth's KV model is per request
    prior = default_prior()
    assert kv_mape(prior, obs.kv) == pytest.approx(abs(prior.kv_tokens(215.0) - 250.0) / 250.0)
    assert math.isnan(kv_mape(prior, []))


def test_a_run_too_short_for_the_length_warm_up_has_no_length_figure(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """A quick run's streams all fall in the warm-up: the figures are nan (shown as such), computed
    without numpy's warnings about empty slices."""
    streams = [Stream(index=k, prompt=100, output=20, times=[1.0]) for k in range(LENGTH_WARMUP)]
    figs = length_figures(streams, seed=1)
    assert figs["n"] == 0
    assert math.isnan(figs["ratio"])
    assert math.isnan(figs["ratio_to_claimed"])
    assert figs["buckets"] == []
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
