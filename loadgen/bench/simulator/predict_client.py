"""The predict-accuracy benchmark's client: it sends streaming chat requests to the simulated engine,
times every token it reads back, and scrapes the endpoint's ``/metrics`` while the requests run (the fit
phase's ramped arrivals and the queue phase's back-to-back submission).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Final

import aiohttp
import orjson

from gateway.telemetry.capacity import kv_capacity_tokens
from gateway.telemetry.engine_metrics import VLLM_METRICS
from gateway.telemetry.lengths import LengthPrediction, OutputLengthPredictor
from gateway.telemetry.promtext import parse as parse_metrics
from loadgen.engine_sim.tokens import TOKEN_TEXT
from loadgen.prompts import CHAT_TEMPLATE_TOKENS, prompt_text
from loadgen.workloads.sharegpt import OUTPUT_RANGE, sharegpt_output, sharegpt_prompt

_clock = time.perf_counter  # loop.time() is too coarse under uvloop
MODEL: Final = "bench-model"
TASK_CLASS: Final = "default"
TOKEN_MARK: Final = b'"content":' + orjson.dumps(TOKEN_TEXT)  # a content chunk of the simulator


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
