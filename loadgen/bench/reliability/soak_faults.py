"""The soak's fleet and its faults: simulated engines as processes of their own (one endpoint each, so the
die fault kills a real process, which the soak starts again on the same port), the gateway.toml berth
runs on, and the injector that applies faults on a seeded schedule while the clients run.

Fault kinds (`SERVER_FAULTS`, injected by the schedule at run time; the client behaviours and the final
SIGTERM are counted by the soak itself):

| kind                 | how                                                                                |
| -------------------- | ---------------------------------------------------------------------------------- |
| `engine_500`         | POST /sim/faults fail_fraction on one engine for a window                          |
| `engine_die`         | die_after_tokens: the engine process exits mid-stream; restarted after the window  |
| `stall`              | stall_after_tokens with stall_fraction: streams go silent, connections stay open   |
| `metrics_garbage`    | /metrics answers text that is not the exposition format                            |
| `metrics_slow`       | /metrics answers after longer than berth's scrape timeout                          |
| `health_flap`        | /health toggles between 503 and 200 a few times                                    |
| `reload_remove_readd`| gateway.toml rewritten without an endpoint, SIGHUP; then with it again, SIGHUP     |
| `reload_valid`       | gateway.toml rewritten with a changed reloadable value, SIGHUP                     |
| `reload_broken`      | gateway.toml made invalid, SIGHUP (berth keeps its config); then restored          |
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp

from gateway.telemetry.promtext import parse
from loadgen.bench.reliability.soak_clients import MODEL
from loadgen.harness import SIM_READY_TIMEOUT_S, ManagedProcess, free_port

SERVER_FAULTS: Final = (
    "engine_500",
    "engine_die",
    "stall",
    "metrics_garbage",
    "metrics_slow",
    "health_flap",
    "reload_remove_readd",
    "reload_valid",
    "reload_broken",
)
SIM_FAULTS: Final = frozenset(("engine_500", "engine_die", "stall", "metrics_garbage", "metrics_slow"))
SCRAPE_INTERVAL_S: Final = 0.1
SCRAPE_TIMEOUT_S: Final = 0.5
READ_TIMEOUT_S: Final = 1.0  # a stalled stream ends in an error event after this
FIRST_BYTE_TIMEOUT_S: Final = 3.0  # a stalled non-streamed answer ends in a 504 after this
MAX_QUEUE_WAIT_S: Final = 5.0
DRAIN_TIMEOUT_S: Final = 10.0
ENGINE_KEY_ENV: Final = "BERTH_SOAK_ENGINE_KEY"


@dataclass
class SimEngine:
    """One `berth-engine-sim` process serving one endpoint on a fixed port."""

    index: int
    port: int
    log_dir: Path
    speed: float
    seed: int
    api_key: str  # the engine's own key (vLLM's --api-key): berth sends it from ENGINE_KEY_ENV
    proc: ManagedProcess | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint_id(self) -> str:
        return f"sim{self.index}"

    def start(self) -> None:
        """Start (or start again) the process; returns once it serves."""
        self.starts += 1
        argv = [
            sys.executable, "-m", "loadgen.engine_sim.cli",
            "--port", str(self.port),
            "--model", MODEL,
            "--profile", "test-fast",
            "--max-num-seqs", "32",
            "--kv-capacity-tokens", "131072",  # long streams (a slow reader's) never crowd out the rest
            "--output-len", "uniform:4:24",
            "--speed", f"{self.speed:g}",
            "--seed", str(self.seed + 1000 * self.starts),
            "--api-key", self.api_key,
        ]  # fmt: skip
        log = self.log_dir / f"sim{self.index}.{self.starts}.log"
        self.proc = ManagedProcess(f"sim{self.index}", argv, log_path=log, watch=b" at http://")
        try:
            self.proc.wait_for_lines(1, SIM_READY_TIMEOUT_S)
        except BaseException:
            self.proc.stop()
            raise

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace_s=5.0)


def start_engines(count: int, log_dir: Path, *, speed: float, seed: int, api_key: str) -> list[SimEngine]:
    engines = [SimEngine(i, free_port(), log_dir, speed, seed + i, api_key) for i in range(count)]
    try:
        for e in engines:
            e.start()
    except BaseException:
        for e in engines:
            e.stop()
        raise
    return engines


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def gateway_toml(
    engines: Sequence[SimEngine],
    keys: Sequence[str],
    *,
    without: int | None = None,
    retry_after_s: float = 1.0,
) -> str:
    """berth's configuration for the soak: short timeouts so faults end fast, client keys required (by
    hash, per tenant), the engines' key from the environment."""
    lines = [
        "[server]",
        f"drain_timeout_s = {DRAIN_TIMEOUT_S}",
        "[auth]",
        "required = true",
        "[limits]",
        f"max_queue_wait_s = {MAX_QUEUE_WAIT_S}",
        f"retry_after_s = {retry_after_s}",
        "[upstream]",
        "connect_timeout_s = 1.0",
        f"first_byte_timeout_s = {FIRST_BYTE_TIMEOUT_S}",
        f"read_timeout_s = {READ_TIMEOUT_S}",
        "[scrape]",
        f"interval_s = {SCRAPE_INTERVAL_S}",
        f"timeout_s = {SCRAPE_TIMEOUT_S}",
        "unhealthy_after = 2",
        "stale_after_s = 2.0",
    ]
    for e in engines:
        if e.index == without:
            continue
        lines += [
            "[[endpoints]]",
            f'id = "{e.endpoint_id}"',
            f'url = "{e.url}"',
            'engine = "vllm"',
            f'models = ["{MODEL}"]',
            "cap = 32",
            f'api_key_env = "{ENGINE_KEY_ENV}"',
        ]
    for i, key in enumerate(keys):
        lines += ["[[tenants]]", f'name = "tenant{i}"', f'api_key_sha256 = ["{key_digest(key)}"]']
    return "\n".join(lines) + "\n"


BROKEN_TOML: Final = '[limits]\nmax_queue_wait_s = "soon"\n[[endpoints]]\nurl = 5\n'


@dataclass
class Progress:
    """Requests finished so far; `reached(n)` wakes when the count gets to n."""

    done: int = 0
    _waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)

    def add(self) -> None:
        self.done += 1
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= self.done]
            for w in ready:
                self._waiters.remove(w)
                if not w[1].done():
                    w[1].set_result(None)

    async def reached(self, n: int) -> None:
        if self.done >= n:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        await fut


@dataclass
class Injector:
    """Applies the fault schedule: windows of `window` finished requests, one fault kind each, in an
    order drawn from `rng` (every kind once per round), on a randomly drawn engine."""

    engines: list[SimEngine]
    keys: Sequence[str]
    config_path: Path
    berth_pid: int
    berth_url: str
    progress: Progress
    rng: random.Random
    window: int
    min_hold_s: float
    total: int  # requests of the load: no window waits past the last one
    log: Callable[[str], None]
    http: aiohttp.ClientSession
    injected: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    unconfirmed_reloads: int = 0

    async def run(self, rounds_until: int) -> None:
        """Inject until `rounds_until` requests have finished (or until cancelled)."""
        at = self.window // 2
        while at < rounds_until:
            kinds = list(SERVER_FAULTS)
            self.rng.shuffle(kinds)
            for kind in kinds:
                if at >= rounds_until:
                    break
                await self.progress.reached(at)
                at += self.window
                await self.inject(kind, until=at)

    async def inject(self, kind: str, *, until: int) -> None:
        engine = self.rng.choice(self.engines)
        self.log(f"fault {kind} on {engine.endpoint_id} until request {until}")
        self.injected[kind] += 1
        if kind in SIM_FAULTS:
            await self._sim_fault(kind, engine, until)
        elif kind == "health_flap":
            # each half-period long enough for berth's health checks to see it (unhealthy_after = 2)
            half_period = max(self.min_hold_s / 4, 3 * SCRAPE_INTERVAL_S)
            for i in range(4):
                await self._set(engine, {"health_503": i % 2 == 0})
                await asyncio.sleep(half_period)
            await self._set(engine, {"health_503": False})
        elif kind == "reload_remove_readd":
            await self._reload(gateway_toml(self.engines, self.keys, without=engine.index), "ok")
            await self._hold(until)
            await self._reload(gateway_toml(self.engines, self.keys), "ok")
        elif kind == "reload_valid":
            retry_after_s = self.rng.choice((1.0, 2.0))
            await self._reload(gateway_toml(self.engines, self.keys, retry_after_s=retry_after_s), "ok")
        elif kind == "reload_broken":
            await self._reload(BROKEN_TOML, "rejected")
            self.config_path.write_text(gateway_toml(self.engines, self.keys))

    async def _sim_fault(self, kind: str, engine: SimEngine, until: int) -> None:
        patches: dict[str, dict[str, object]] = {
            "engine_500": {"fail_fraction": 0.5},
            "engine_die": {"die_after_tokens": self.rng.randint(5, 40)},
            "stall": {"stall_after_tokens": self.rng.randint(1, 3), "stall_fraction": 0.3},
            "metrics_garbage": {"metrics_garbage": True},
            "metrics_slow": {"metrics_delay_s": 3 * SCRAPE_TIMEOUT_S},
        }
        patch = patches[kind]
        if not engine.alive:
            await asyncio.to_thread(self.revive, engine)
        await self._set(engine, patch)
        await self._hold(until)
        if kind == "engine_die" and not engine.alive:
            await asyncio.to_thread(self.revive, engine)
        else:
            await self._set(engine, {"reset": True})

    def revive(self, engine: SimEngine) -> None:
        """Start a dead engine again on its port (its process exited: the die fault)."""
        engine.stop()
        engine.start()
        self.restarts += 1
        self.log(f"{engine.endpoint_id} restarted")

    async def _hold(self, until: int) -> None:
        """Keep a fault for the rest of its window, and at least `min_hold_s` (scrape-driven faults need
        a few scrape rounds to show)."""
        await asyncio.gather(self.progress.reached(min(until, self.total)), asyncio.sleep(self.min_hold_s))

    async def _set(self, engine: SimEngine, patch: dict[str, object]) -> None:
        if not engine.alive:
            return
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self.http.post(engine.url + "/sim/faults", json=patch) as resp:
                await resp.read()

    async def _reloads(self, result: str) -> float:
        """berth's count of config reloads with `result` (ok | rejected), from its /metrics."""
        async with self.http.get(self.berth_url + "/metrics") as resp:
            page = parse((await resp.read()).decode())
        return page.value("berth_config_reloads_total", result=result) or 0.0

    async def _reload(self, text: str, expect: str) -> None:
        """Write the file, SIGHUP berth, and wait until its /metrics counts the reload as `expect`."""
        before = await self._reloads(expect)
        self.config_path.write_text(text)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.berth_pid, signal.SIGHUP)
        for _ in range(100):
            await asyncio.sleep(0.05)  # berth reloads in its own loop; ask its /metrics again
            if await self._reloads(expect) > before:
                return
        self.unconfirmed_reloads += 1
        self.log(f"reload not confirmed as {expect}")

    async def clear_all(self) -> None:
        """Every fault off, every engine alive, the full configuration loaded."""
        for e in self.engines:
            if e.alive:
                await self._set(e, {"reset": True})
            else:
                await asyncio.to_thread(self.revive, e)
        await self._reload(gateway_toml(self.engines, self.keys), "ok")
