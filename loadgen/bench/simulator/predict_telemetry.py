"""The predict-accuracy benchmark's telemetry feed: what the client recorded goes into berth's own
telemetry (`BerthTelemetry`) as the daemon hands it over, plus the simpler observations of the ablation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

import numpy as np

from gateway.core.types import SLO, EndpointId
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.telemetry.fleet_state import FleetTelemetry
from gateway.telemetry.perfmodel import PerfModelFitter
from gateway.telemetry.records import FinishedRequest, ScrapeSample, TelemetrySettings
from gateway.telemetry.timeline import (
    MIN_KEPT_GAPS,
    DecodeObservation,
    EndpointTimeline,
    PrefillObservation,
    Settled,
)
from loadgen.bench.simulator.predict_client import MODEL, TASK_CLASS, Scrape, Stream

# ---- berth's telemetry, fed as the daemon feeds it ---------------------------------------------------
ENDPOINT: Final = EndpointId("sim")
#: Profile seconds between two phases on the endpoint's clock: nothing of one is near the other.
PHASE_GAP_S: Final = 10.0


class Observations(NamedTuple):
    """What berth's telemetry derived from one phase and fed to the endpoint's fitter."""

    prefill: list[PrefillObservation]
    decode: list[DecodeObservation]
    kv: list[tuple[float, float]]  # (context tokens, KV tokens), per request in flight


class _RecordingTimeline(EndpointTimeline):
    """berth's token timeline, keeping a copy of what each `settle` derived."""

    def __init__(self) -> None:
        super().__init__()
        self.prefill: list[PrefillObservation] = []
        self.decode: list[DecodeObservation] = []

    def settle(self, before: float) -> Settled:
        out = super().settle(before)
        self.prefill += out.prefill
        self.decode += out.decode
        return out


class _RecordingFitter(PerfModelFitter):
    """berth's performance-model fitter, keeping a copy of each KV observation it is fed."""

    def __init__(self, prior: PerfCoefficients, *, window: int, min_obs: int) -> None:
        super().__init__(prior, window=window, min_obs=min_obs)
        self.kv: list[tuple[float, float]] = []

    def observe_kv(self, context_tokens: float, kv_tokens: float) -> None:
        self.kv.append((context_tokens, kv_tokens))
        super().observe_kv(context_tokens, kv_tokens)


def _finished_at(st: Stream) -> float:
    if math.isfinite(st.finished):
        return st.finished
    return st.times[-1] if st.times else st.dispatch


class BerthTelemetry:
    """berth's telemetry (`gateway.telemetry.fleet_state.FleetTelemetry` with the daemon's default
    settings) for one simulated endpoint, fed what the daemon would feed it had it relayed the streams.

    Every phase's times are profile seconds (wall seconds x the phase's speed-up), and each phase starts
    `PHASE_GAP_S` after the previous one ended on the endpoint's clock, so the phases, run at different
    speed-ups on different simulated endpoints of the same profile, read as one endpoint's history.
    """

    def __init__(self) -> None:
        self.fleet = FleetTelemetry(TelemetrySettings(prior=default_prior()))
        settings = self.fleet.settings
        self.endpoint = self.fleet.endpoint(ENDPOINT)
        self._timeline = _RecordingTimeline()
        self._fitter = _RecordingFitter(
            settings.prior, window=settings.fit_window, min_obs=settings.min_observations
        )
        self.endpoint.timeline = self._timeline
        self.endpoint.fitter = self._fitter
        self.endpoint.coefficients = self._fitter.current
        self._start = 0.0  # where the next phase starts on the endpoint's clock

    def add_phase(self, streams: Sequence[Stream], scrapes: Sequence[Scrape], speed: float) -> Observations:
        """One phase: every scrape as the daemon's scrape sink hands it over (`ScrapeSample`: the engine's
        gauges, the requests in flight when it came back and their prompt + half the predicted output),
        then every stream as the finish phase does (`FinishedRequest`, in the order they finished); then
        the endpoint's timeline is settled past the phase's end. Returns what this phase added."""
        marks = (len(self._timeline.prefill), len(self._timeline.decode), len(self._fitter.kv))
        for sc in scrapes:
            self.fleet.observe_scrape(ENDPOINT, scrape_sample(streams, sc))
        if streams:
            origin = min(st.dispatch for st in streams)
            start = self._start

            def clock(t: float) -> float:
                return start + (t - origin) * speed

            for st in sorted(streams, key=_finished_at):
                self.fleet.observe(finished_request(st, clock, speed))
            end = clock(max(_finished_at(st) for st in streams)) + PHASE_GAP_S
            self.fleet.settle(ENDPOINT, end)
            self._start = end + PHASE_GAP_S
        return Observations(
            self._timeline.prefill[marks[0] :], self._timeline.decode[marks[1] :], self._fitter.kv[marks[2] :]
        )

    def refit(self) -> PerfCoefficients:
        return self.endpoint.refit()


def finished_request(st: Stream, clock: Callable[[float], float], speed: float) -> FinishedRequest:
    """The finish phase's record of `st` (`clock`: its wall times on the endpoint's clock)."""
    dispatched = clock(st.dispatch)
    t = np.asarray(st.times)
    return FinishedRequest(
        model=MODEL,
        task_class=TASK_CLASS,
        slo=SLO(),
        ok=st.ok,
        stream=True,
        endpoint=ENDPOINT,
        attempts=1,
        arrival=dispatched,
        dispatched_at=dispatched,
        first_token_at=clock(st.times[0]) if st.times else None,
        finished_at=clock(_finished_at(st)),
        prompt_chars=0,  # the token estimator is scored on its own (TokenEstimator below)
        prompt_tokens=st.prompt,
        prompt_tokens_est=st.prompt,
        output_tokens=st.tokens if st.ok else len(st.times),
        gaps=(np.diff(t) * speed).tolist(),
        predicted_output_tokens=None if st.predicted is None else st.predicted.mean,
    )


def scrape_sample(streams: Sequence[Stream], sc: Scrape) -> ScrapeSample:
    """The scrape sink's record of `sc`: the gateway's in-flight requests are those dispatched and not
    finished when the scrape came back, each counted at its prompt plus half its predicted output."""
    inflight = [st for st in streams if st.dispatch <= sc.received < _finished_at(st)]
    context = sum(st.prompt + 0.5 * (st.predicted.mean if st.predicted else 0.0) for st in inflight)
    return ScrapeSample(
        running=sc.running,
        kv_usage=sc.kv_usage,
        kv_capacity_tokens=sc.kv_capacity,
        ttft=None,
        itl=None,
        gateway_inflight=len(inflight),
        gateway_context_tokens=context,
    )


# ---- the ablation: simpler observations -------------------------------------------------------------
def simple_prefill_observations(streams: Sequence[Stream], speed: float) -> list[PrefillObservation]:
    """Raw TTFT from dispatch (queueing and the iteration in flight included)."""
    return [
        PrefillObservation(s.prompt, (s.times[0] - s.dispatch) * speed, idle=False) for s in streams if s.ok
    ]


def simple_decode_observations(streams: Sequence[Stream], speed: float) -> list[DecodeObservation]:
    """The mean of every gap at the mean running count, avg_context = the stream's own prompt +
    produced / 2."""
    ok = [s for s in streams if s.ok and len(s.times) > MIN_KEPT_GAPS]
    firsts = np.sort([s.times[0] for s in ok])
    lasts = np.sort([s.times[-1] for s in ok])
    out: list[DecodeObservation] = []
    for s in ok:
        t = np.asarray(s.times)
        mid = (t[:-1] + t[1:]) / 2
        count = np.searchsorted(firsts, mid, side="right") - np.searchsorted(lasts, mid, side="left")
        rate = (len(t) - 1) / ((t[-1] - t[0]) * speed)
        out.append(DecodeObservation(float(count.mean()), s.prompt + len(t) / 2, 1.0 / rate, 0.0, rate))
    return out


def feed_simple(
    fitter: PerfModelFitter, pre: Sequence[PrefillObservation], dec: Sequence[DecodeObservation]
) -> None:
    for p in pre:
        fitter.observe_prefill(p.prompt_tokens, p.seconds)
    for d in dec:
        fitter.observe_decode(d.batch, d.avg_context, d.seconds)
        fitter.observe_throughput(d.concurrency, d.tokens_per_s)
