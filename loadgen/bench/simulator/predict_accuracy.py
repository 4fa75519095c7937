"""How well berth's telemetry models predict the engine simulator (a benchmark: prints figures).

    berth-loadgen bench predict-accuracy --out DIR      # about 2 minutes on 2 cores (DIR/report.json, .md)

Setup: an in-process `SimFleet` of two endpoints with the same engine profile (``fleet-7b`` unless
``--profile``), run faster than real time; every measured time is multiplied back by the speed-up, so
fitted coefficients compare with the profile's own. This process is the client (aiohttp, streaming chat
requests shaped like the ``sharegpt-like`` workload: prompt and output lengths drawn the same way, the
output pinned with min_tokens = max_tokens as loadgen does) and it times every token itself. While the
requests run it scrapes the endpoint's ``/metrics`` every ``--scrape-ms`` (running and waiting counts,
KV usage, KV capacity from ``vllm:cache_config_info``) and reads the page with the gateway's own parser.

1. **fit phase** (endpoint 0, the profile's max_num_seqs, ``--speed`` 4): ``--fit-requests`` Poisson
   arrivals whose rate ramps linearly from ``--rate-lo`` to ``--rate-hi`` requests/s (profile time), so
   the batch runs from one or two requests to a saturated endpoint with a queue inside the engine. The
   speed-up is modest because a prefill is timed from a handful of token receipts: at 10x a 2-core
   machine's event-loop jitter (a millisecond or more when it is shared) is a large part of a 2 ms
   prefill, at 4x it is a fair part of a 5 ms one, and the fit averages it out.
2. **queue phase** (endpoint 1, ``--queue-seqs`` slots, ``--queue-speed`` 10): ``--queued`` requests
   submitted back to back (each once the previous one's response headers are in, which the simulator
   sends after queueing the request, so the engine's FCFS order is the submission order): nearly all of
   them queue at once. Waits of minutes (profile time) do not need a fine clock.

What is scored is the code the daemon runs (`BerthTelemetry`): after each phase the streams and scrapes
go into `gateway.telemetry.fleet_state.FleetTelemetry`, with the daemon's default settings, as the
daemon hands them over: every scrape as a `ScrapeSample` (the engine's gauges; the requests in flight
when it came back, at their prompt plus half their predicted output), every stream as the finish phase's
`FinishedRequest` (dispatch, first token, gaps, prompt tokens). The endpoint's token timeline
(`gateway.telemetry.timeline`) then derives the prefill and decode observations and the endpoint's
fitter (`gateway.telemetry.perfmodel`) is refitted. Times are profile seconds (wall x the phase's
speed-up) and the two phases lie one after the other on one endpoint's clock. The benchmark keeps a copy
of what the timeline derived and of the KV observations the fitter was fed: the operating points the
figures are taken at. The fit after the fit phase is the one judged, and makes the queue phase's
predictions; a fit of both phases is shown for information.

Figures and targets:
- prefill / decode-iteration MAPE against the simulator's true latency model at the operating points
  the run produced (each prefill iteration's prompt tokens; each stream's mean batch and context, both
  phases): target <= 10 %. Shown for information: a grid (batch 1..max x context 100..2000, prompts
  16..4096), and the fit of the simpler observations (raw TTFT for prefill; every gap and the stream's
  own prompt + produced / 2 for decode).
- KV MAPE: the fitted per-request KV model at each KV observation berth made (the in-flight requests'
  mean context against the engine's KV usage x capacity per in-flight request, at the scrapes whose
  running count berth takes as its own): target <= 5 %.
- output length: the median absolute error of each request's p50 prediction (made when it was sent,
  from the history finished by then, with max_tokens = the workload's output cap, not the pinned
  length), after a warm-up of 50 requests, against the per-bucket empirical spread of the same outputs
  (median absolute deviation from each bucket's median, pooled): target no worse. The spread is
  in-sample (each bucket's median comes from the very outputs being scored) while a predictor only has
  the earlier ones, so even the ideal bucket-median predictor scores about 1.03 with a standard
  deviation of 0.06 at this sample size (40 seeds of the workload, offline): "no worse" is judged
  statistically, PASS when the 95 % bootstrap interval of the ratio reaches 1 (not measurably worse);
  the point ratio and the interval are printed.
- waiting time: for the queue phase, each request's predicted wait from `wait_for_position` (the
  requests that must finish before it starts: all but the last ``queue_seqs - 1`` ahead of it; rate
  ``ō / (t_pre(p̄) + ō · t_dec(B, l̄) / B)`` from the fit-phase fit and predicted lengths) against its
  observed queueing time = TTFT minus its own prefill (true model): R² >= 0.9 with >= 200 queued.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

import aiohttp
import numpy as np
import numpy.typing as npt
import orjson

from gateway.core.types import SLO, EndpointId
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.telemetry.capacity import kv_capacity_tokens
from gateway.telemetry.engine_metrics import VLLM_METRICS
from gateway.telemetry.fleet_state import FleetTelemetry
from gateway.telemetry.lengths import LengthPrediction, OutputLengthPredictor
from gateway.telemetry.perfmodel import PerfModelFitter
from gateway.telemetry.promtext import parse as parse_metrics
from gateway.telemetry.records import FinishedRequest, ScrapeSample, TelemetrySettings
from gateway.telemetry.timeline import (
    MIN_KEPT_GAPS,
    DecodeObservation,
    EndpointTimeline,
    PrefillObservation,
    Settled,
)
from gateway.telemetry.tokens import TokenEstimator
from gateway.telemetry.waiting import wait_for_position
from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.profiles import get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.engine_sim.tokens import TOKEN_TEXT
from loadgen.prompts import CHAT_TEMPLATE_TOKENS, prompt_text
from loadgen.workloads.sharegpt import OUTPUT_RANGE, sharegpt_output, sharegpt_prompt

Array = npt.NDArray[np.float64]
_clock = time.perf_counter  # loop.time() is too coarse under uvloop
MODEL: Final = "bench-model"
TASK_CLASS: Final = "default"
LENGTH_BUCKETS: Final = (64, 256, 1024, 4096)  # OutputLengthPredictor's default
TOKEN_MARK: Final = b'"content":' + orjson.dumps(TOKEN_TEXT)  # a content chunk of the simulator
LENGTH_WARMUP: Final = 50
BOOTSTRAP: Final = 2000
TARGETS: Final = {
    "prefill_mape": 0.10,
    "decode_mape": 0.10,
    "kv_mape": 0.05,
    "length_ratio": 1.0,
    "wait_r2": 0.9,
    "queued": 200,
}


@dataclass(slots=True)
class Stream:
    index: int
    prompt: int
    output: int  # pinned length
    dispatch: float = 0.0
    times: list[float] = field(default_factory=list)  # receipt of every content chunk
    finished: float = math.nan  # when the response ended (NaN: it never started)
    usage_tokens: int | None = None
    error: str | None = None
    predicted: LengthPrediction | None = None  # at dispatch, from the history finished by then
    claimed_spread: float = math.nan  # the predictor's spread() at the same moment

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.times) > 0

    @property
    def tokens(self) -> int:
        return self.usage_tokens or len(self.times)


@dataclass(frozen=True, slots=True)
class Scrape:
    sent: float
    received: float
    running: float
    waiting: float
    kv_usage: float  # fraction 0..1
    kv_capacity: float  # tokens


# ---- the client --------------------------------------------------------------------------------------
def request_body(prompt: int, output: int, salt: int) -> bytes:
    text = prompt_text(prompt - CHAT_TEMPLATE_TOKENS, salt)
    return orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": output,
            "min_tokens": output,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


async def open_stream(session: aiohttp.ClientSession, url: str, st: Stream) -> aiohttp.ClientResponse:
    """Send the request; returns once the response headers are in (the simulator has queued it)."""
    body = request_body(st.prompt, st.output, salt=st.index)
    st.dispatch = _clock()
    resp = await session.post(
        url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    if resp.status != 200:
        st.error = f"http_{resp.status}"
    return resp


async def read_stream(resp: aiohttp.ClientResponse, st: Stream) -> None:
    try:
        if st.error is not None:
            return
        times = st.times
        content = resp.content
        while True:
            line = await content.readline()
            if not line:
                st.error = "truncated"
                return
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            if TOKEN_MARK in payload:
                times.append(_clock())
                continue
            usage = orjson.loads(payload).get("usage")
            if usage:
                st.usage_tokens = int(usage.get("completion_tokens", 0))
    except (aiohttp.ClientError, orjson.JSONDecodeError) as e:
        st.error = type(e).__name__
    finally:
        st.finished = _clock()
        resp.release()


async def scrape_loop(
    session: aiohttp.ClientSession, url: str, out: list[Scrape], stop: asyncio.Event, every_s: float
) -> None:
    while not stop.is_set():
        sent = _clock()
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
        received = _clock()
        page = parse_metrics(text)  # read as the gateway's scraper reads it
        g = VLLM_METRICS.gauges(page)
        capacity = kv_capacity_tokens(page)
        if (
            g.running is not None
            and g.waiting is not None
            and g.kv_usage is not None
            and capacity is not None
        ):
            out.append(Scrape(sent, received, g.running, g.waiting, g.kv_usage, capacity))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)


# ---- the two phases ----------------------------------------------------------------------------------
def draw_requests(n: int, rng: random.Random, first_index: int) -> list[Stream]:
    return [Stream(first_index + i, sharegpt_prompt(rng), sharegpt_output(rng)) for i in range(n)]


def ramp_arrivals(n: int, lo: float, hi: float, rng: random.Random) -> list[float]:
    """Poisson arrivals whose rate ramps linearly from `lo` to `hi` over the `n` requests."""
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(lo + (hi - lo) * i / max(1, n - 1))
        out.append(t)
    return out


def predict_for(st: Stream, predictor: OutputLengthPredictor) -> None:
    st.predicted = predictor.predict(MODEL, TASK_CLASS, st.prompt, OUTPUT_RANGE[1])
    st.claimed_spread = predictor.spread(MODEL, TASK_CLASS, st.prompt)


async def fit_phase(
    session: aiohttp.ClientSession,
    url: str,
    *,
    streams: list[Stream],
    arrivals: list[float],
    predictor: OutputLengthPredictor,
    scrapes: list[Scrape],
    scrape_every_s: float,
) -> None:
    stop = asyncio.Event()
    origin = _clock()

    async def one(st: Stream) -> None:
        predict_for(st, predictor)
        try:
            resp = await open_stream(session, url, st)
        except aiohttp.ClientError as e:
            st.error = type(e).__name__
            return
        await read_stream(resp, st)
        if st.ok:
            predictor.observe(MODEL, TASK_CLASS, st.prompt, st.tokens)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(scrape_loop(session, url, scrapes, stop, scrape_every_s), name="scrape")
        async with asyncio.TaskGroup() as reqs:
            for st, at in zip(streams, arrivals, strict=True):
                delay = origin + at - _clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                reqs.create_task(one(st), name=f"req-{st.index}")
        stop.set()


async def queue_phase(
    session: aiohttp.ClientSession,
    url: str,
    *,
    streams: list[Stream],
    scrapes: list[Scrape],
    scrape_every_s: float,
) -> float:
    """Submit back to back (each once the previous one is queued); the wall seconds that took."""
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(scrape_loop(session, url, scrapes, stop, scrape_every_s), name="scrape")
        async with asyncio.TaskGroup() as reqs:
            start = _clock()
            for st in streams:
                try:
                    resp = await open_stream(session, url, st)
                except aiohttp.ClientError as e:
                    st.error = type(e).__name__
                    continue
                reqs.create_task(read_stream(resp, st), name=f"req-{st.index}")
            took = _clock() - start
        stop.set()
    return took


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


# ---- figures -----------------------------------------------------------------------------------------
def true_decode_s(true: LatencyModel, batch: float, avg_context: float) -> float:
    """The simulator's decode model at a fractional (mean) batch size."""
    return (true.k2 * avg_context + true.c2) * batch + true.c3


def mape(pred: Sequence[float], true: Sequence[float]) -> float:
    p, t = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    return float(np.mean(np.abs(p - t) / t)) if len(t) else math.nan


def r_squared(pred: Sequence[float], actual: Sequence[float]) -> float:
    p, a = np.asarray(pred, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    ss_tot = float(np.sum((a - a.mean()) ** 2))
    return 1.0 - float(np.sum((a - p) ** 2)) / ss_tot if ss_tot > 0 else math.nan


def prefill_mape(coef: PerfCoefficients, true: LatencyModel, at: Sequence[PrefillObservation]) -> float:
    return mape(
        [coef.prefill_s(p.prompt_tokens) for p in at], [true.prefill_s(int(p.prompt_tokens)) for p in at]
    )


def kv_mape(coef: PerfCoefficients, at: Sequence[tuple[float, float]]) -> float:
    """The per-request KV model against (context tokens, KV tokens) observations."""
    return mape([coef.kv_tokens(context) for context, _ in at], [kv for _, kv in at])


def decode_mape(coef: PerfCoefficients, true: LatencyModel, at: Sequence[DecodeObservation]) -> float:
    return mape(
        [coef.decode_iter_s(d.batch, d.avg_context) for d in at],
        [true_decode_s(true, d.batch, d.avg_context) for d in at],
    )


def grid_mape(coef: PerfCoefficients, true: LatencyModel, max_batch: int) -> tuple[float, float]:
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_batch]
    contexts = (100.0, 300.0, 1000.0, 2000.0)
    prompts = (16, 64, 256, 1024, 4096)
    pre = mape([coef.prefill_s(p) for p in prompts], [true.prefill_s(p) for p in prompts])
    dec = mape(
        [coef.decode_iter_s(b, c) for b in batches for c in contexts],
        [true.decode_s(b, c) for b in batches for c in contexts],
    )
    return pre, dec


def service_rate(
    coef: PerfCoefficients, preds: Sequence[LengthPrediction], prompts: Sequence[int], slots: int
) -> float:
    """Sustained output tokens/s of a full endpoint: ō tokens and one prefill per request, decode
    iterations of `slots` requests at the length-biased mean context p̄ + E[o²] / (2 ō)."""
    o_mean = statistics.fmean(p.mean for p in preds)
    o_sq = statistics.fmean(p.mean * p.mean + p.std * p.std for p in preds)
    p_mean = statistics.fmean(prompts)
    context = p_mean + o_sq / (2.0 * o_mean)
    per_request_s = coef.prefill_s(p_mean) + o_mean * coef.decode_iter_s(slots, context) / slots
    return o_mean / per_request_s


def wait_figures(
    queue: Sequence[Stream],
    *,
    coef: PerfCoefficients,
    predictor: OutputLengthPredictor,
    true: LatencyModel,
    slots: int,
    speed: float,
) -> dict[str, Any]:
    preds = [predictor.predict(MODEL, TASK_CLASS, s.prompt, OUTPUT_RANGE[1]) for s in queue]
    rate = service_rate(coef, preds, [s.prompt for s in queue], slots)
    predicted: list[float] = []
    bounds: list[float] = []
    all_ahead: list[float] = []
    observed: list[float] = []
    for k, st in enumerate(queue):
        if not st.ok:
            continue
        est = wait_for_position(preds[: max(0, k - slots + 1)], rate)
        predicted.append(est.mean_s)
        bounds.append(est.bound_s)
        all_ahead.append(wait_for_position(preds[:k], rate).mean_s)
        observed.append((st.times[0] - st.dispatch) * speed - true.prefill_s(st.prompt))
    return {
        "r2": r_squared(predicted, observed),
        "r2_all_ahead": r_squared(all_ahead, observed),
        "bound_p90_coverage": float(np.mean(np.array(observed) <= np.array(bounds))),
        "tokens_per_s": rate,
        "n": len(observed),
        "observed_max_s": max(observed),
    }


def length_figures(streams: Sequence[Stream], seed: int) -> dict[str, Any]:
    """p50 predictions (made at dispatch) against the within-bucket spread of the same outputs."""
    rows = [s for s in streams if s.ok and s.predicted is not None][LENGTH_WARMUP:]
    out = np.array([float(s.tokens) for s in rows])
    p50 = np.array([s.predicted.p50 if s.predicted is not None else math.nan for s in rows])
    bucket = np.searchsorted(np.array(LENGTH_BUCKETS), np.array([s.prompt for s in rows]), side="left")
    err = np.abs(out - p50)

    def pooled_spread(idx: npt.NDArray[np.intp]) -> float:
        o, b = out[idx], bucket[idx]
        dev = np.empty(len(idx))
        for k in np.unique(b):
            m = b == k
            dev[m] = np.abs(o[m] - np.median(o[m]))
        return float(np.median(dev))

    every = np.arange(len(rows))
    spread = pooled_spread(every)
    ratio = float(np.median(err)) / spread
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(BOOTSTRAP):
        idx = rng.integers(0, len(rows), len(rows))
        boot.append(float(np.median(err[idx])) / pooled_spread(idx))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    buckets = []
    for k in np.unique(bucket):
        m = bucket == k
        label = f"<={LENGTH_BUCKETS[k]}" if k < len(LENGTH_BUCKETS) else f">{LENGTH_BUCKETS[-1]}"
        buckets.append(
            {
                "bucket": label,
                "n": int(m.sum()),
                "median_abs_error": float(np.median(err[m])),
                "spread": float(np.median(np.abs(out[m] - np.median(out[m])))),
            }
        )
    claimed = np.array([s.claimed_spread for s in rows])
    return {
        "n": len(rows),
        "median_abs_error": float(np.median(err)),
        "spread": spread,
        "ratio": ratio,
        "ratio_ci95": [float(lo), float(hi)],
        "claimed_spread": float(np.nanmedian(claimed)),
        "ratio_to_claimed": float(np.median(err)) / float(np.nanmedian(claimed)),
        "buckets": buckets,
    }


def _coef_dict(c: PerfCoefficients) -> dict[str, Any]:
    return {name: getattr(c, name) for name in c.__dataclass_fields__}


# ---- the run -----------------------------------------------------------------------------------------
async def run(args: argparse.Namespace) -> dict[str, Any]:
    profile = get_profile(args.profile)
    true = profile.latency
    speed, qspeed = float(args.speed), float(args.queue_speed)
    rng = random.Random(args.seed)
    fit_streams = draw_requests(args.fit_requests, rng, 0)
    queue_streams = draw_requests(args.queued, rng, args.fit_requests)
    arrivals = [t / speed for t in ramp_arrivals(args.fit_requests, args.rate_lo, args.rate_hi, rng)]
    base = EndpointSpec(models=(MODEL,), profile=args.profile, speed=speed, load_time_s=0.0, seed=args.seed)
    specs = [
        base,
        EndpointSpec(
            **{**_spec_kwargs(base), "max_num_seqs": args.queue_seqs, "seed": args.seed + 1, "speed": qspeed}
        ),
    ]
    berth = BerthTelemetry()
    predictor = OutputLengthPredictor()
    every = args.scrape_ms / 1000.0
    fit_scrapes: list[Scrape] = []
    queue_scrapes: list[Scrape] = []
    wall0 = _clock()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with (
        SimFleet(specs) as fleet,
        aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        fit_url, queue_url = fleet.urls
        print(f"fit phase: {len(fit_streams)} requests", file=sys.stderr)
        await fit_phase(
            session,
            fit_url,
            streams=fit_streams,
            arrivals=arrivals,
            predictor=predictor,
            scrapes=fit_scrapes,
            scrape_every_s=every,
        )
        fit_wall = _clock() - wall0
        obs_a = berth.add_phase(fit_streams, fit_scrapes, speed)
        after_fit = berth.refit()
        for st in queue_streams:
            predict_for(st, predictor)
        print(f"queue phase: {len(queue_streams)} requests at once", file=sys.stderr)
        submit_s = await queue_phase(
            session, queue_url, streams=queue_streams, scrapes=queue_scrapes, scrape_every_s=every
        )
        states = [ep.state() for ep in fleet.endpoints]
    wall = _clock() - wall0
    waits = wait_figures(
        queue_streams, coef=after_fit, predictor=predictor, true=true, slots=args.queue_seqs, speed=qspeed
    )
    waits["queued_max"] = max((s.waiting for s in queue_scrapes), default=0.0)
    waits["submit_spread_s"] = submit_s * qspeed
    for st in queue_streams:
        if st.ok:
            predictor.observe(MODEL, TASK_CLASS, st.prompt, st.tokens)
    obs_b = berth.add_phase(queue_streams, queue_scrapes, qspeed)
    final = berth.refit()
    pre, dec, kv = obs_a.prefill + obs_b.prefill, obs_a.decode + obs_b.decode, obs_a.kv + obs_b.kv

    # the same fits fed the simpler observations, at the same operating points
    simple = PerfModelFitter(default_prior())
    everything = fit_streams + queue_streams
    feed_simple(
        simple,
        simple_prefill_observations(fit_streams, speed),
        simple_decode_observations(fit_streams, speed),
    )
    simple_coef = simple.refit()

    tokens = TokenEstimator()
    for st in fit_streams:
        tokens.observe(MODEL, 4 * max(1, st.prompt - CHAT_TEMPLATE_TOKENS), st.prompt)
    token_mape = mape(
        [tokens.estimate(MODEL, 4 * max(1, s.prompt - CHAT_TEMPLATE_TOKENS)) for s in queue_streams],
        [s.prompt for s in queue_streams],
    )
    lengths = length_figures(everything, args.seed)
    grid_pre, grid_dec = grid_mape(after_fit, true, profile.max_num_seqs)
    figures = {
        "prefill_mape": prefill_mape(after_fit, true, pre),
        "decode_mape": decode_mape(after_fit, true, dec),
        "kv_mape": kv_mape(after_fit, kv),
        "length_ratio": lengths["ratio"],
        "wait_r2": waits["r2"],
    }
    verdicts = {
        "prefill_mape": figures["prefill_mape"] <= TARGETS["prefill_mape"],
        "decode_mape": figures["decode_mape"] <= TARGETS["decode_mape"],
        "kv_mape": figures["kv_mape"] <= TARGETS["kv_mape"],
        "length_ratio": lengths["ratio_ci95"][0] <= TARGETS["length_ratio"],
        "wait_r2": waits["r2"] >= TARGETS["wait_r2"] and waits["queued_max"] >= TARGETS["queued"],
    }
    return {
        "command": " ".join(["berth-loadgen bench predict-accuracy", *map(shlex.quote, sys.argv[1:])]),
        "settings": {
            k: getattr(args, k)
            for k in (
                "profile",
                "speed",
                "queue_speed",
                "seed",
                "fit_requests",
                "rate_lo",
                "rate_hi",
                "queued",
                "queue_seqs",
                "scrape_ms",
            )
        },
        "true": {
            "k1": true.k1,
            "c1": true.c1,
            "k2": true.k2,
            "c2": true.c2,
            "c3": true.c3,
            "h": 1.0,
            "j": 1.0,
        },
        "fit_after_fit_phase": _coef_dict(after_fit),
        "fit_final": _coef_dict(final),
        "figures": figures,
        "targets": TARGETS,
        "pass": verdicts,
        "observations": {
            "prefill": len(pre),
            "prefill_idle_start": sum(p.idle for p in pre),
            "prefill_measurement_mape": mape(
                [p.seconds for p in pre], [true.prefill_s(int(p.prompt_tokens)) for p in pre]
            ),
            "decode": len(dec),
            "decode_measurement_mape": mape(
                [d.seconds for d in dec], [true_decode_s(true, d.batch, d.avg_context) for d in dec]
            ),
            "decode_batch_range": [min(d.batch for d in dec), max(d.batch for d in dec)],
            "kv": len(kv),
            "scrapes": len(fit_scrapes) + len(queue_scrapes),
        },
        "info": {
            "grid_prefill_mape": grid_pre,
            "grid_decode_mape": grid_dec,
            "simple_prefill_mape": prefill_mape(simple_coef, true, pre),
            "simple_decode_mape": decode_mape(simple_coef, true, dec),
            "final_prefill_mape": prefill_mape(final, true, pre),
            "final_decode_mape": decode_mape(final, true, dec),
            "final_kv_mape": kv_mape(final, kv),
            "token_estimator_mape": token_mape,
            "throughput_curve": {"thr1": final.thr1, "alpha": final.alpha, "beta": final.beta},
        },
        "lengths": lengths,
        "waits": waits,
        "requests": len(everything),
        "errors": sum(1 for s in everything if not s.ok),
        "preemptions": sum(int(s["stats"]["preemptions"]) for s in states),
        "timer_lag": [s["timer_lag"] for s in states],
        "wall_s": {"total": wall, "fit_phase": fit_wall},
    }


def _spec_kwargs(spec: EndpointSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


def render(result: dict[str, Any]) -> str:
    fig, ok = result["figures"], result["pass"]
    fit, final, true = result["fit_after_fit_phase"], result["fit_final"], result["true"]
    obs, info, w, ln = result["observations"], result["info"], result["waits"], result["lengths"]
    settings = result["settings"]
    lags = ", ".join(f"{t['mean_ms']:.2f}" for t in result["timer_lag"])

    def row(name: str, figure: str, target: str, key: str) -> str:
        return f"{name:<44} {figure:>10}   {target:<9} {'PASS' if ok[key] else 'FAIL'}"

    lo, hi = ln["ratio_ci95"]
    lines = [
        f"$ {result['command']}",
        f"profile {settings['profile']}, speed {settings['speed']:g} (fit phase) and "
        f"{settings['queue_speed']:g} (queue phase): {result['requests']} requests "
        f"({result['errors']} errors, {result['preemptions']} preemptions), "
        f"wall {result['wall_s']['total']:.0f} s, engine timer lag {lags} ms mean (wall)",
        "",
        "coefficient        true   fit phase  both phases",
        *(
            f"  {k:<4}      {true[k]:>10.4g}  {fit[k]:>10.4g}   {final[k]:>10.4g}"
            for k in ("k1", "c1", "k2", "c2", "c3", "h", "j")
        ),
        f"  throughput: thr1 {fit['thr1']:.3g} tok/s, alpha {fit['alpha']:.3g}, beta {fit['beta']:.3g}",
        "",
        f"observations: {obs['prefill']} prefill ({obs['prefill_idle_start']} from an idle endpoint; one "
        f"alone is {100 * obs['prefill_measurement_mape']:.0f} % off on average), {obs['decode']} decode "
        f"(batch {obs['decode_batch_range'][0]:.1f}..{obs['decode_batch_range'][1]:.1f}; "
        f"{100 * obs['decode_measurement_mape']:.1f} % off), {obs['kv']} KV of {obs['scrapes']} scrapes",
        f"info: the fit of both phases: prefill {100 * info['final_prefill_mape']:.1f} %, decode "
        f"{100 * info['final_decode_mape']:.2f} %, KV {100 * info['final_kv_mape']:.2f} %; the fit-phase "
        f"fit on a grid: prefill {100 * info['grid_prefill_mape']:.1f} %, "
        f"decode {100 * info['grid_decode_mape']:.1f} %",
        f"info: fit-phase fit fed raw TTFT and every gap with the stream's own context instead: prefill "
        f"{100 * info['simple_prefill_mape']:.1f} %, decode {100 * info['simple_decode_mape']:.1f} %",
        "info: output length by bucket (median abs error / spread): "
        + ", ".join(
            f"{b['bucket']} {b['median_abs_error']:.0f}/{b['spread']:.0f} (n={b['n']})" for b in ln["buckets"]
        )
        + f"; error / the spread claimed at prediction time {ln['ratio_to_claimed']:.3f}",
        f"info: waits of {w['n']} requests (up to {w['observed_max_s']:.0f} s, {w['queued_max']:.0f} "
        f"queued in the engine, submitted within {w['submit_spread_s']:.1f} s) at {w['tokens_per_s']:.0f} "
        f"tok/s; p90 bound covers {100 * w['bound_p90_coverage']:.0f} %; R² counting every request ahead "
        f"{w['r2_all_ahead']:.3f}",
        f"info: token estimator MAPE {100 * info['token_estimator_mape']:.1f} %",
        "",
        f"{'target (fit-phase fit; all operating points)':<44} {'figure':>10}   {'goal':<9} verdict",
        row(
            "prefill iteration MAPE vs true model",
            f"{100 * fig['prefill_mape']:.2f} %",
            "<= 10 %",
            "prefill_mape",
        ),
        row(
            "decode iteration MAPE vs true model",
            f"{100 * fig['decode_mape']:.2f} %",
            "<= 10 %",
            "decode_mape",
        ),
        row("KV MAPE vs engine KV usage", f"{100 * fig['kv_mape']:.2f} %", "<= 5 %", "kv_mape"),
        row("output length median abs error / spread", f"{fig['length_ratio']:.3f}", "<= 1", "length_ratio")
        + f"  ({ln['median_abs_error']:.0f} vs {ln['spread']:.0f} tokens, n={ln['n']}, "
        f"95 % CI {lo:.2f}..{hi:.2f})",
        row(f"waiting-time R² ({w['queued_max']:.0f} queued)", f"{fig['wait_r2']:.3f}", ">= 0.9", "wait_r2"),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="berth-loadgen bench predict-accuracy", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--profile", default="fleet-7b")
    ap.add_argument("--speed", type=float, default=4.0, help="engine speed-up in the fit phase")
    ap.add_argument("--queue-speed", type=float, default=10.0, help="engine speed-up in the queue phase")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fit-requests", type=int, default=180)
    ap.add_argument(
        "--rate-lo", type=float, default=0.3, help="fit-phase requests/s at the start (profile time)"
    )
    ap.add_argument(
        "--rate-hi", type=float, default=1.5, help="fit-phase requests/s at the end (profile time)"
    )
    ap.add_argument("--queued", type=int, default=250)
    ap.add_argument("--queue-seqs", type=int, default=8)
    ap.add_argument(
        "--scrape-ms", type=float, default=25.0, help="wall milliseconds between /metrics scrapes"
    )
    ap.add_argument("--out", type=Path, default=Path("bench-out/predict-accuracy"), help="report directory")
    args = ap.parse_args(argv)

    def measure(a: argparse.Namespace) -> dict[str, Any]:
        result = asyncio.run(run(a))
        print(render(result))
        return result

    return run_bench(
        BENCHMARKS["predict-accuracy"],
        args,
        measure,
        passed=lambda r: all(r["pass"].values()),
        report=lambda r: (r, "```\n" + render(r) + "\n```"),
    )


if __name__ == "__main__":
    raise SystemExit(main())
