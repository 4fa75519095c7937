"""How much CPU the engine simulator needs per simulated endpoint, and how many endpoints one core
can simulate in real time.

    berth-loadgen diag sim-cpu                 # ~3 minutes
    berth-loadgen diag sim-cpu --quick         # ~1 minute, coarser

Setup: the simulator runs as its own process (``berth-engine-sim --count N --profile fleet-7b``, speed 1,
i.e. **real time, not sped up**), so its CPU is read alone from ``/proc/PID/stat``. This process is the
client: per endpoint, Poisson arrivals at the given rate of **streaming** chat requests with a fixed
shape (prompt 256 tokens, output 24 tokens pinned with min_tokens = max_tokens, so 24 SSE chunks each),
every chunk read and timed. Measurement starts after a warm-up.

Phases:
1. idle: N endpoints, no traffic (the cost of timers and sockets at rest: should be ~0);
2. per-endpoint cost at 1 and 10 requests/s per endpoint (N endpoints);
3. the largest fleet one core simulates in real time at 1 request/s per endpoint: fleets of growing
   size (a failing size is measured twice) until the simulator needs more than 90 % of a core or its
   engine timers fall behind (mean lag of
   the iteration-end timers over 5 ms: on an idle loop they fire within ~1 ms, so a larger mean means the
   loop is saturated or starved of CPU); plus the extrapolation 0.9 core / (measured cost per endpoint).

The client's own CPU share is printed too (it must not be the bottleneck), and how long the simulator
waited for a CPU while runnable (``/proc/PID/task/*/schedstat``) and the load average: on a shared
machine other processes delay the simulator's timers, which is not the simulator's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadgen.client import RequestResult, build_body, send
from loadgen.cpu import process_cpu_s, runqueue_wait_s
from loadgen.harness import ManagedProcess, start_engine_sim
from loadgen.workloads.arrivals import arrival_times
from loadgen.workloads.base import CallSpec

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 24
REAL_TIME_CPU = 0.9
LAG_MEAN_MS = 5.0


@dataclass(frozen=True, slots=True)
class Measurement:
    endpoints: int
    rate_per_endpoint: float
    duration_s: float
    sim_cpu_share: float  # of one core, whole simulator process
    client_cpu_share: float
    sim_runqueue_share: float  # time the simulator was runnable but waited for a CPU (other processes)
    requests: int
    errors: int
    chunks: int
    lag_mean_ms: float
    lag_max_ms: float
    late_share: float  # wake-ups more than 5 ms late

    @property
    def per_endpoint_ms_per_s(self) -> float:
        return 1000.0 * self.sim_cpu_share / self.endpoints

    @property
    def real_time(self) -> bool:
        return self.sim_cpu_share <= REAL_TIME_CPU and self.lag_mean_ms <= LAG_MEAN_MS and self.errors == 0

    def line(self) -> str:
        us_per_chunk = (
            1e6 * self.sim_cpu_share * self.duration_s / self.chunks if self.chunks else float("nan")
        )
        verdict = "real-time" if self.real_time else "NOT real-time"
        return (
            f"N={self.endpoints:<4} rate={self.rate_per_endpoint:>4g}/s/ep  "
            f"sim cpu {100 * self.sim_cpu_share:5.1f} % of a core = "
            f"{self.per_endpoint_ms_per_s:6.2f} ms/s per endpoint  "
            f"({self.chunks / self.duration_s:7.0f} chunks/s, {us_per_chunk:5.1f} us/chunk)  "
            f"timer lag mean {self.lag_mean_ms:.2f} ms max {self.lag_max_ms:.1f} ms "
            f"late>5ms {100 * self.late_share:.1f} %  req {self.requests} err {self.errors}  "
            f"client cpu {100 * self.client_cpu_share:.0f} %  "
            f"sim waited for a cpu {100 * self.sim_runqueue_share:.0f} % of the time  {verdict}"
        )


def start_simulator(n: int, log_path: Path) -> tuple[ManagedProcess, list[str]]:
    args = ["--count", str(n), "--port", "0", "--profile", "fleet-7b", "--load-time-s", "0",
            "--model", "bench-model"]  # fmt: skip
    return start_engine_sim(args, log_path, endpoints=n)


async def _drive(
    session: aiohttp.ClientSession, urls: list[str], rate: float, duration_s: float, seed: int
) -> list[RequestResult]:
    call = CallSpec(PROMPT_TOKENS, OUTPUT_TOKENS)
    results: list[RequestResult] = []
    rng = random.Random(seed)
    events = sorted((t, i) for i in range(len(urls)) for t in arrival_times("poisson", rate, duration_s, rng))
    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for k, (at, i) in enumerate(events):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            res = RequestResult(
                0,
                0,
                None,
                "bench",
                "bench",
                "bench-model",
                "chat",
                PROMPT_TOKENS,
                OUTPUT_TOKENS,
                call.slo,
                at,
            )
            results.append(res)
            body = build_body(call, "bench-model", salt=k)
            tg.create_task(send(session, urls[i], res, body, {"Content-Type": "application/json"}))
    return results


async def _lag(session: aiohttp.ClientSession, urls: list[str]) -> tuple[float, float, float]:
    total_wakeups, total_lag_ms, max_ms, late = 0, 0.0, 0.0, 0
    for url in urls:
        async with session.get(url + "/sim/state") as resp:
            lag: dict[str, Any] = orjson.loads(await resp.read())["timer_lag"]
        total_wakeups += lag["wakeups"]
        total_lag_ms += lag["mean_ms"] * lag["wakeups"]
        max_ms = max(max_ms, lag["max_ms"])
        late += lag["over_5ms"]
    if not total_wakeups:
        return 0.0, 0.0, 0.0
    return total_lag_ms / total_wakeups, max_ms, late / total_wakeups


async def measure(n: int, rate: float, duration_s: float, warmup_s: float, seed: int = 0) -> Measurement:
    with tempfile.TemporaryDirectory(prefix="berth-sim-cpu-") as logs:
        return await _measure(n, rate, duration_s, warmup_s, seed=seed, log_path=Path(logs) / "sim.log")


async def _measure(
    n: int, rate: float, duration_s: float, warmup_s: float, *, seed: int, log_path: Path
) -> Measurement:
    proc, urls = await asyncio.to_thread(start_simulator, n, log_path)
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            if rate > 0 and warmup_s > 0:
                await _drive(session, urls, rate, warmup_s, seed + 1)
            cpu0, own0, t0 = process_cpu_s(proc.pid), process_cpu_s(os.getpid()), time.perf_counter()
            wait0 = runqueue_wait_s(proc.pid)
            if rate > 0:
                results = await _drive(session, urls, rate, duration_s, seed)
            else:
                results = []
                await asyncio.sleep(duration_s)
            cpu1, own1, t1 = process_cpu_s(proc.pid), process_cpu_s(os.getpid()), time.perf_counter()
            wait1 = runqueue_wait_s(proc.pid)
            lag_mean, lag_max, late = await _lag(session, urls)
    finally:
        await asyncio.to_thread(proc.stop, 30.0)
    assert cpu0 is not None
    assert cpu1 is not None
    assert own0 is not None
    assert own1 is not None
    wall = t1 - t0
    return Measurement(
        endpoints=n,
        rate_per_endpoint=rate,
        duration_s=wall,
        sim_cpu_share=(cpu1 - cpu0) / wall,
        client_cpu_share=(own1 - own0) / wall,
        sim_runqueue_share=(wait1 - wait0) / wall,
        requests=len(results),
        errors=sum(1 for r in results if not r.ok),
        chunks=sum(r.tokens for r in results),
        lag_mean_ms=lag_mean,
        lag_max_ms=lag_max,
        late_share=late,
    )


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) {five:.1f} (5 min) on {os.cpu_count()} cpus"


async def main_async(args: argparse.Namespace) -> None:
    print(
        "simulator: fleet-7b preset, speed 1 (real time); requests: streaming chat, "
        f"prompt {PROMPT_TOKENS} / output {OUTPUT_TOKENS} tokens; Poisson arrivals per endpoint; {_load()}",
        flush=True,
    )
    print("\n1. idle", flush=True)
    print("   " + (await measure(args.endpoints, 0.0, args.duration, 0.0)).line(), flush=True)
    print("\n2. per-endpoint cost", flush=True)
    cost: dict[float, float] = {}
    for rate in (1.0, 10.0):
        m = await measure(args.endpoints, rate, args.duration, args.warmup)
        cost[rate] = m.sim_cpu_share / m.endpoints
        print("   " + m.line(), flush=True)
    print(f"\n3. largest fleet one core simulates in real time at {args.fleet_rate:g} request/s per endpoint")
    best = 0
    for n in args.sizes:
        m = await measure(n, args.fleet_rate, args.duration, args.warmup)
        print("   " + m.line(), flush=True)
        if not m.real_time:  # once more: on a shared machine a neighbour's burst can starve one run
            m = await measure(n, args.fleet_rate, args.duration, args.warmup, seed=1)
            print("   " + m.line() + "  (retry)", flush=True)
        if not m.real_time:
            break
        best = n
    print(f"   largest real-time fleet measured: {best} endpoints (sizes tried: {args.sizes})")
    for rate, share in cost.items():
        if share > 0:
            n_max = REAL_TIME_CPU / share
            print(f"   extrapolated from phase 2 at {rate:g} req/s/ep: {n_max:.0f} endpoints per core")
    print(f"\n{_load()}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen diag sim-cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", type=int, default=12, help="fleet size for phases 1-2")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--fleet-rate", type=float, default=1.0, help="per-endpoint rate for phase 3")
    p.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[24, 48, 96, 144, 192, 256]
    )
    p.add_argument("--quick", action="store_true", help="shorter points, fewer sizes")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.sizes = 8.0, 2.0, [24, 64, 128, 192]
    try:
        import uvloop

        uvloop.run(main_async(args))
    except ImportError:  # pragma: no cover
        asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
