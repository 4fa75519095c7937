"""The soak's system under test: `berth serve` and its simulated engines as processes (`SoakStack`:
started, stopped, and read through /metrics, /admin/fleet, each engine's /sim/state and /proc), the
run's configuration (`SoakConfig`) and an invariant's verdict (`Invariant`). The phases that drive it
are `loadgen.bench.reliability.soak`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from gateway.telemetry.promtext import parse
from loadgen.bench.reliability.soak_checks import Connections, Counters, connections, counters
from loadgen.bench.reliability.soak_faults import (
    DRAIN_TIMEOUT_S,
    ENGINE_KEY_ENV,
    SERVER_FAULTS,
    SimEngine,
    gateway_toml,
    start_engines,
)
from loadgen.harness import REPO_ROOT, RunningServer, free_port, start_server

RSS_SLACK_KIB: Final = 4096.0
# A quick run's second half is a second or two of a young process (caches and allocator arenas still
# growing, a few long streams' buffers): its bound only catches a gross leak.
QUICK_RSS_SLACK_KIB: Final = 16384.0


@dataclass(frozen=True, slots=True)
class SoakConfig:
    requests: int
    concurrency: int
    engines: int
    seed: int
    speed: float
    window: int  # requests per fault window
    min_hold_s: float  # shortest fault window
    rss_slack_kib: float

    @classmethod
    def of(cls, args: argparse.Namespace) -> SoakConfig:
        requests = args.requests or (400 if args.quick else 20_000)
        concurrency = args.concurrency or (32 if args.quick else 64)
        rounds = 1 if args.quick else max(1, requests // 2000)  # fault windows: every kind once per round
        window = max(1, requests // (rounds * len(SERVER_FAULTS) + 1))
        return cls(
            requests=requests,
            concurrency=concurrency,
            engines=args.engines,
            seed=args.seed,
            speed=args.speed,
            window=window,
            min_hold_s=0.3 if args.quick else 1.5,
            rss_slack_kib=QUICK_RSS_SLACK_KIB if args.quick else RSS_SLACK_KIB,
        )


@dataclass
class Invariant:
    name: str
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"pass": self.passed, "detail": self.detail}


def _log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class SoakStack:
    """berth and its engines for one soak run, and the probes that read them (a benchmark polls: these
    facts live in other processes)."""

    def __init__(self, cfg: SoakConfig, out: Path) -> None:
        self.cfg = cfg
        self.out = out
        rng = random.Random(cfg.seed)
        self.keys = [f"sk-soak-{i}-{rng.getrandbits(64):016x}" for i in range(3)]
        self.engine_key = f"sk-engine-{rng.getrandbits(64):016x}"
        self.config_path = out / "gateway.toml"
        self.engines: list[SimEngine] = []
        self.berth: RunningServer | None = None
        self.port = 0
        self.invariants: list[Invariant] = []
        self.figures: dict[str, Any] = {}

    # ------------------------------------------------------------------------------ processes
    def start(self) -> None:
        self.engines = start_engines(
            self.cfg.engines, self.out, speed=self.cfg.speed, seed=self.cfg.seed, api_key=self.engine_key
        )
        self.config_path.write_text(gateway_toml(self.engines, self.keys))
        self.port = free_port()
        argv = [
            sys.executable, "-m", "gateway.cli", "serve",
            "-c", str(self.config_path),
            "--listen", f"127.0.0.1:{self.port}",
            "--log-level", "info",
        ]  # fmt: skip
        self.berth = start_server(
            "berth",
            argv,
            port=self.port,
            log_path=self.out / "berth.log",
            ready_path="/readyz",
            timeout_s=60.0,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **{ENGINE_KEY_ENV: self.engine_key}),
            cwd=REPO_ROOT,
        )

    def stop(self) -> None:
        if self.berth is not None:
            self.berth.process.stop(grace_s=DRAIN_TIMEOUT_S + 5)
        for e in self.engines:
            e.stop()

    @property
    def url(self) -> str:
        assert self.berth is not None
        return self.berth.base_url

    @property
    def pid(self) -> int:
        assert self.berth is not None
        return self.berth.process.pid

    # ---------------------------------------------------------------------------------- probes
    async def counters(self, http: aiohttp.ClientSession) -> Counters:
        async with http.get(self.url + "/metrics") as resp:
            metrics = parse((await resp.read()).decode())
        async with http.get(self.url + "/admin/fleet") as resp:
            fleet = orjson.loads(await resp.read())
        return counters(metrics, fleet)

    async def fleet_ready(self, http: aiohttp.ClientSession) -> bool:
        async with http.get(self.url + "/admin/fleet") as resp:
            fleet = orjson.loads(await resp.read())
        ready = {e["id"] for e in fleet["endpoints"] if e["ready"]}
        return ready == {e.endpoint_id for e in self.engines}

    async def engines_live_requests(self, http: aiohttp.ClientSession) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.engines:
            async with http.get(e.url + "/sim/state") as resp:
                out[e.endpoint_id] = int(orjson.loads(await resp.read())["live_requests"])
        return out

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
        """Ask `check` every 0.1 s until it holds (True) or `timeout_s` passed (False). A benchmark polls:
        these facts live in another process and have no event to await."""
        deadline = time.monotonic() + timeout_s
        while True:
            if await check():
                return True
            if time.monotonic() >= deadline:
                _log(f"gave up waiting for: {what}")
                return False
            await asyncio.sleep(0.1)

    def _idle(self, http: aiohttp.ClientSession) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            c = await self.counters(http)
            return not c.busy and c.telemetry_pending == 0

        return check

    def _tasks_within(self, http: aiohttp.ClientSession, limit: float) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return (await self.counters(http)).tasks <= limit

        return check

    def _conns_settled(self, http: aiohttp.ClientSession, base: Connections) -> Callable[[], Awaitable[bool]]:
        """Client connections back to the baseline; none to an engine held (a finished call keeps its
        connection only as an idle one of the pool); and every upstream socket of the process one the
        pool knows of (in use or idle: nothing left open outside it)."""

        async def check() -> bool:
            pool = await self.counters(http)
            now = connections(self.pid, self.port)
            return (
                now.clients <= base.clients
                and pool.upstream_in_use == 0
                and now.upstream <= pool.upstream_in_use + pool.upstream_idle
            )

        return check
