"""The overhead benchmark's load generator, run in its own process so its CPU is never the proxy's.

It reads one JSON command per line on stdin, runs that phase against the URL with a fixed number of
concurrent workers (closed loop: each worker sends its next request when the previous one is done), or
with `waves`, in waves of `concurrency` requests sent together (the next wave when the whole last one is
done: how the peer harness's stream client measures the time to first chunk of a burst of streams),
and writes one JSON result per line on stdout. With `workload` (e.g. `coding:pattern1`) each worker sends
that workload's tasks instead, one call after the other, with the headers the workload sends (task
type as SLO class, task id and SLA: `overhead_workload`), and a refused request (429, 503) is followed
by a pause of `error_pause_s` so that a full queue is not hammered; with `abandon`, the requests still
open when the window ends are cancelled rather than awaited (a standing queue would take its whole
depth to drain). Only requests that finish inside the measurement window
(after the warm-up) are counted; the CPU time of the given pids is read from `/proc/<pid>/stat` at the
window's two edges.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson
import uvloop

from loadgen.bench.overhead.overhead_workload import WorkloadRequests

CLK_TCK = os.sysconf("SC_CLK_TCK")
_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class Command:
    url: str  # full URL of the completion route
    concurrency: int
    warmup_s: float
    duration_s: float
    stream: bool
    max_tokens: int
    cpu_pids: tuple[int, ...] = ()
    waves: bool = False
    model: str = "bench"
    api_key: str = ""  # sent as Authorization: Bearer (a tenant's key), when set
    # The workload's requests instead of one fixed body (`overhead_workload`): its name, the factor on
    # its task SLAs, the cap on each request's output tokens (0: as the workload draws them), its seed.
    workload: str = ""
    sla_scale: float = 1.0
    max_output_tokens: int = 0
    seed: int = 0
    error_pause_s: float = 0.0  # after a refused request (HTTP status other than 200)
    abandon: bool = False  # cancel the requests still open at the window's end


@dataclass(slots=True)
class Result:
    completed: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    window_s: float = 0.0
    rps: float = 0.0
    lat_ms: dict[str, float] = field(default_factory=dict)  # p50, p90, p99, mean, max
    ttft_ms: dict[str, float] = field(default_factory=dict)  # streams only
    chunks: int = 0  # SSE data events other than [DONE], streams only
    # ... of every stream, received inside the window (whether or not its stream ended there): what
    # the window's CPU is spent on, when waves of long streams straddle its edges
    chunks_in_window: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)  # pid -> CPU seconds used in the window


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all its threads, dead or alive), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may contain spaces and parentheses; fields after it are plain.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank percentiles, in the units given."""
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * n) - 1)]

    return {
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "mean": sum(ordered) / n,
        "max": ordered[-1],
    }


class _Phase:
    def __init__(self, cmd: Command) -> None:
        self.cmd = cmd
        body: dict[str, Any] = {
            "model": cmd.model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": cmd.max_tokens,
            "stream": cmd.stream,
        }
        self.body = orjson.dumps(body)
        self.window: tuple[float, float] = (math.inf, math.inf)
        self.stopping = False
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.result = Result()
        self.headers = dict(_HEADERS)
        if cmd.api_key:
            self.headers["Authorization"] = f"Bearer {cmd.api_key}"
        self.requests: WorkloadRequests | None = None
        if cmd.workload:
            self.requests = WorkloadRequests(
                cmd.workload, cmd.model, sla_scale=cmd.sla_scale, max_output_tokens=cmd.max_output_tokens,
                stream=cmd.stream, seed=cmd.seed, extra_headers=self.headers,
            )  # fmt: skip

    def _in_window(self, t: float) -> bool:
        return self.window[0] <= t <= self.window[1]

    def _error(self, message: str) -> None:
        if not self.stopping:  # warm-up errors count too: they mean something is wrong
            self.result.errors += 1
            if len(self.result.error_samples) < 5:
                self.result.error_samples.append(message)

    async def worker(self, session: aiohttp.ClientSession) -> None:
        requests = self.requests
        while not self.stopping:
            if requests is None:
                await self.one(session)
                continue
            task = requests.next_task()
            for i in range(len(task.calls)):
                body, headers = requests.request(task, i)
                if not await self.one(session, body, headers) or self.stopping:
                    break

    async def waves(self, session: aiohttp.ClientSession) -> None:
        while not self.stopping:
            await asyncio.gather(*(self.one(session) for _ in range(self.cmd.concurrency)))

    async def one(
        self, session: aiohttp.ClientSession, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> bool:
        """One request (the phase's fixed one unless given), counted if it ends inside the window;
        whether it succeeded."""
        t0 = time.perf_counter()
        ttft: float | None = None
        events = 0
        try:
            async with session.post(
                self.cmd.url, data=self.body if body is None else body,
                headers=self.headers if headers is None else headers,
            ) as resp:  # fmt: skip
                if resp.status != 200:
                    self._error(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
                    if self.cmd.error_pause_s > 0:
                        await asyncio.sleep(self.cmd.error_pause_s)
                    return False
                if self.cmd.stream:
                    done = False
                    async for line in resp.content:
                        if line.startswith(b"data: "):
                            if line.startswith(b"data: [DONE]"):
                                done = True
                            else:
                                if ttft is None:
                                    ttft = time.perf_counter() - t0
                                events += 1
                                if self._in_window(time.perf_counter()):
                                    self.result.chunks_in_window += 1
                    if not done:
                        self._error("stream ended without [DONE]")
                        return False
                else:
                    await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            self._error(repr(e))
            await asyncio.sleep(0.01)  # a refused connection must not spin
            return False
        t1 = time.perf_counter()
        if self._in_window(t1):
            self.result.completed += 1
            self.latencies.append(t1 - t0)
            if ttft is not None:
                self.ttfts.append(ttft)
            self.result.chunks += events
        return True

    def _cpu(self) -> dict[int, float]:
        return {pid: cpu_seconds(pid) for pid in self.cmd.cpu_pids}

    async def run(self) -> Result:
        cmd = self.cmd
        connector = aiohttp.TCPConnector(limit=cmd.concurrency, force_close=False)
        timeout = aiohttp.ClientTimeout(total=120)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session,
            asyncio.TaskGroup() as tg,
        ):
            if cmd.waves:
                workers = [tg.create_task(self.waves(session))]
            else:
                workers = [tg.create_task(self.worker(session)) for _ in range(cmd.concurrency)]
            await asyncio.sleep(cmd.warmup_s)
            start = time.perf_counter()
            cpu0 = self._cpu()
            self.window = (start, math.inf)
            await asyncio.sleep(cmd.duration_s)
            end = time.perf_counter()
            cpu1 = self._cpu()
            self.window = (start, end)
            self.stopping = True  # workers finish the request they are in, then return
            if cmd.abandon:
                for w in workers:
                    w.cancel()
        r = self.result
        r.window_s = end - start
        r.rps = r.completed / r.window_s
        r.lat_ms = {k: v * 1000 for k, v in percentiles(self.latencies).items()}
        r.ttft_ms = {k: v * 1000 for k, v in percentiles(self.ttfts).items()}
        r.cpu_s = {str(pid): cpu1[pid] - cpu0[pid] for pid in cmd.cpu_pids}
        return r


def run_command(line: bytes) -> Result:
    raw = orjson.loads(line)
    cmd = Command(**{**raw, "cpu_pids": tuple(raw.get("cpu_pids", ()))})
    return uvloop.run(_Phase(cmd).run())


def main() -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            payload: dict[str, Any] = {"ok": True, "result": asdict(run_command(line))}
        except Exception as e:  # report to the harness instead of dying mid-benchmark
            payload = {"ok": False, "error": repr(e)}
        out.write(orjson.dumps(payload) + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
