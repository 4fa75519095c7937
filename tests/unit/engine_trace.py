"""Token receipts of streams served by the sans-IO engine simulator on a fake timeline (no sockets, no
sleeps): what the gateway's relay would record in front of an engine whose latency model is known."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from itertools import pairwise

from loadgen.engine_sim.engine import EngineConfig, SimEngine
from loadgen.engine_sim.latency import LatencyModel


@dataclass(slots=True)
class TracedStream:
    index: int
    prompt: int
    output: int
    dispatched_at: float
    times: list[float] = field(default_factory=list)  # receipt of every token
    finished_at: float = math.nan

    @property
    def gaps(self) -> list[float]:
        t = self.times
        return [b - a for a, b in pairwise(t)]


def engine_trace(
    latency: LatencyModel,
    *,
    n: int,
    rate_lo: float,
    rate_hi: float,
    seed: int,
    max_num_seqs: int = 16,
    jitter_s: float = 0.0,
    prompts: tuple[int, int] = (20, 2000),
    outputs: tuple[int, int] = (10, 300),
) -> list[TracedStream]:
    """`n` streams whose Poisson arrival rate ramps from `rate_lo` to `rate_hi` requests/s, so the batch
    runs from one request to a full engine with a queue inside it. Each receipt comes up to `jitter_s`
    after the engine step that produced it (the gateway's own processing)."""
    rng = random.Random(seed)
    engine = SimEngine(EngineConfig(latency, max_num_seqs=max_num_seqs, kv_capacity_tokens=1_000_000))
    t = 0.0
    streams: list[TracedStream] = []
    for i in range(n):
        t += rng.expovariate(rate_lo + (rate_hi - rate_lo) * i / max(1, n - 1))
        streams.append(TracedStream(i, rng.randint(*prompts), rng.randint(*outputs), t))
    sims = {}
    nxt = 0
    now = 0.0
    while True:
        wake = engine.next_wake
        arrival = streams[nxt].dispatched_at if nxt < n else math.inf
        now = min(arrival, math.inf if wake is None else wake)
        if now == math.inf:
            break
        while nxt < n and streams[nxt].dispatched_at <= now:
            s = streams[nxt]
            sims[s.index] = engine.submit(
                str(s.index), prompt_tokens=s.prompt, output_tokens=s.output, now=now
            )
            nxt += 1
        for req in engine.step(now).woken:
            s = streams[int(req.rid)]
            while len(s.times) < req.generated:
                s.times.append(now + rng.uniform(0.0, jitter_s))
            if req.done and math.isnan(s.finished_at):
                s.finished_at = now + jitter_s
    for s in streams:
        s.times.sort()
    return streams
