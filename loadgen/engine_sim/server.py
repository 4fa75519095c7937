"""`SimEndpoint`: the thin asyncio/aiohttp layer around one `SimEngine`.

The engine's batching loop is driven by one timer per endpoint (``loop.call_later`` until the end of
the current iteration, never a busy loop), which wakes the request handlers (`routes`) whose requests
got tokens. A handler's ``finally`` aborts its request in the engine when the client goes away.

With ``kv_events`` set, the endpoint publishes its prefix cache's KV events after every engine step
(`kv_events`); a restart (`restart`, or `kill` then `start`) publishes ``AllBlocksCleared`` first. The
sockets live from the first `start` to `stop`, so the sequence numbers go on across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from gateway.core.tasks import TaskSupervisor
from loadgen.engine_sim.engine import SimEngine
from loadgen.engine_sim.faults import Faults
from loadgen.engine_sim.flavors import get_flavor
from loadgen.engine_sim.kv_events import KVEventPublisher
from loadgen.engine_sim.routes import EndpointRoutes, _now, _Stream
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.engine_sim.stats import EngineStats

_SHUTDOWN_TIMEOUT_S = 2.0


class _LagStats:
    """How late the engine timer fired: whether the host keeps up in real time."""

    __slots__ = ("count", "max", "over_5ms", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.over_5ms = 0

    def add(self, lag: float) -> None:
        self.count += 1
        self.total += lag
        self.max = max(self.max, lag)
        if lag > 0.005:
            self.over_5ms += 1

    def to_dict(self) -> dict[str, float]:
        mean = self.total / self.count if self.count else 0.0
        return {
            "wakeups": self.count,
            "mean_ms": 1e3 * mean,
            "max_ms": 1e3 * self.max,
            "over_5ms": self.over_5ms,
        }


class SimEndpoint(EndpointRoutes):
    """One simulated vLLM/SGLang endpoint served on ``spec.host:spec.port`` (0: a free port).

    ``on_die`` decides what the ``die_after_tokens`` fault does; by default the endpoint aborts its
    connections and stops listening (`kill`); the standalone CLI passes a callback that exits the process.
    """

    def __init__(self, spec: EndpointSpec, *, on_die: Callable[[SimEndpoint], None] | None = None) -> None:
        self.spec = spec
        self.resolved = spec.resolve()
        self.flavor = get_flavor(spec.flavor)
        self._on_die = on_die
        self._port = spec.port
        self._faults = spec.faults
        self._die_at: int | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._tasks = TaskSupervisor(restart_delay_s=0.1)
        self._timer: asyncio.TimerHandle | None = None
        self._wake_at: float | None = None
        self._streams: dict[str, _Stream] = {}
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._alive = False
        self._ids = 0
        self.kv_events: KVEventPublisher | None = None
        self._starts = 0
        self.engine = self._new_engine()
        self._loaded_at = 0.0
        self._started_unix = 0.0
        self._scrape_mark = (0.0, 0)
        self._lag = _LagStats()
        self._len_rng = random.Random(spec.seed)
        self._fault_rng = random.Random(spec.seed + 1)
        self._id_base = f"{random.Random(spec.seed + 2).getrandbits(96):024x}"

    def _new_engine(self) -> SimEngine:
        engine = SimEngine(self.resolved.engine, stats=EngineStats(self.flavor.buckets))
        if engine.prefix_cache is not None and self.kv_events is not None:
            engine.prefix_cache.events = []  # recorded for the publisher
        return engine

    # ---- lifecycle ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self._port}"

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def loaded(self) -> bool:
        return self._alive and self._loop is not None and _now() >= self._loaded_at

    async def start(self) -> None:
        if self._alive:
            raise RuntimeError("endpoint already running")
        self._loop = asyncio.get_running_loop()
        spec = self.spec
        if spec.kv_events is not None and self.kv_events is None:
            self.kv_events = KVEventPublisher(
                spec.kv_events, replay=spec.kv_events_replay, fmt=spec.kv_events_format
            )
        self.engine = self._new_engine()
        if self._starts and self.kv_events is not None:
            self.kv_events.all_blocks_cleared()  # a restarted engine holds nothing
        self._starts += 1
        self._streams = {}
        self._loaded_at = _now() + self.resolved.load_time_s
        self._started_unix = time.time()
        self._scrape_mark = (_now(), 0)
        self._lag = _LagStats()
        self._set_die_at(self._faults)
        runner = web.AppRunner(
            self._build_app(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.spec.host, self._port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        if runner.addresses:  # the bound socket tells the real port when 0 was asked for
            self._port = int(runner.addresses[0][1])
        self._alive = True

    async def kill(self) -> None:
        """Die abruptly: drop every request, reset every connection, stop listening."""
        if not self._alive:
            return
        self._alive = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._wake_at = None, None
        self.engine.abort_all()
        for stream in list(self._streams.values()):
            stream.notify()
        runner, site = self._runner, self._site
        self._runner, self._site = None, None
        if site is not None:
            await site.stop()
        if runner is not None:
            server = runner.server
            if server is not None:
                for conn in server.connections:
                    transport = conn.transport
                    if transport is not None:
                        transport.abort()
            await runner.cleanup()

    async def stop(self) -> None:
        await self.kill()
        await self._tasks.close()
        if self.kv_events is not None:
            await self.kv_events.close()
            self.kv_events = None
        self._tasks = TaskSupervisor(restart_delay_s=0.1)

    async def restart(self) -> None:
        """Come back on the same port with a fresh engine (metrics reset, load time again)."""
        await self.kill()
        await self.start()

    @property
    def live_requests(self) -> int:
        """Requests whose handler is still running (streaming, waiting or stalled)."""
        return len(self._streams)

    async def wait_idle(self) -> None:
        """Return once no request handler is running (e.g. after clients disconnected)."""
        while self._streams:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(fut)
            await fut

    def _request_done(self, rid: str) -> None:
        self._streams.pop(rid, None)
        if not self._streams and self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    # ---- faults and state --------------------------------------------------------------------
    @property
    def faults(self) -> Faults:
        return self._faults

    def set_faults(self, **changes: Any) -> Faults:
        """Change some faults (keyword names as in `Faults`; ``reset=True`` clears the others)."""
        self._faults = self._faults.patched(changes)
        if "die_after_tokens" in changes or changes.get("reset"):
            self._set_die_at(self._faults)
        return self._faults

    def _set_die_at(self, faults: Faults) -> None:
        n = faults.die_after_tokens
        self._die_at = None if n is None else self.engine.stats.generation_tokens + n

    def state(self) -> dict[str, Any]:
        eng, st = self.engine, self.engine.stats
        lat = self.resolved.unscaled_latency
        return {
            "flavor": self.spec.flavor,
            "models": list(self.spec.models),
            "url": self.url,
            "alive": self._alive,
            "loaded": self.loaded,
            "running": eng.num_running,
            "waiting": eng.num_waiting,
            "live_requests": self.live_requests,  # handlers still running (streaming, waiting, stalled)
            "kv_used_tokens": eng.kv_used,
            "kv_capacity_tokens": eng.config.kv_capacity_tokens,
            "kv_usage": eng.kv_usage,
            "prefix_cache": None if eng.prefix_cache is None else _cache_state(eng),
            "stats": {
                "requests_received": st.requests_received,
                "requests_finished": dict(st.requests_finished),
                "requests_aborted": st.requests_aborted,
                "prompt_tokens": st.prompt_tokens,
                "generation_tokens": st.generation_tokens,
                "preemptions": st.preemptions,
                "iterations": st.iterations,
                "busy_s": st.busy_s,
            },
            "config": {
                "profile": self.spec.profile,
                "max_num_seqs": eng.config.max_num_seqs,
                "max_model_len": self.resolved.max_model_len,
                "max_prefill_tokens": eng.config.max_prefill_tokens,
                "scheduling_policy": eng.config.policy,
                "speed": self.spec.speed,
                "latency": {"k1": lat.k1, "c1": lat.c1, "k2": lat.k2, "c2": lat.c2, "c3": lat.c3},
                "output_len": str(self.resolved.output_len),
            },
            "faults": self._faults.to_dict(),
            "timer_lag": self._lag.to_dict(),
        }

    # ---- the engine driver -------------------------------------------------------------------
    def _kick(self) -> None:
        assert self._loop is not None
        self._run_step(_now())

    def _on_timer(self) -> None:
        assert self._loop is not None
        wake = self._wake_at
        self._timer, self._wake_at = None, None
        now = _now()
        if wake is not None:
            self._lag.add(now - wake)
        # the timer may fire a hair early (millisecond timer granularity): it marks the iteration end
        self._run_step(max(now, wake) if wake is not None else now)

    def _run_step(self, now: float) -> None:
        if not self._alive:
            return
        assert self._loop is not None
        result = self.engine.step(now)
        cache = self.engine.prefix_cache
        if self.kv_events is not None and cache is not None and cache.events:
            self.kv_events.publish(cache.take_events())
        streams = self._streams
        for req in result.woken:
            stream = streams.get(req.rid)
            if stream is not None:
                stream.notify()
        if self._die_at is not None and self.engine.stats.generation_tokens >= self._die_at:
            self._die_at = None
            self._die()
            return
        wake = result.next_wake
        if wake != self._wake_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = (
                self._loop.call_later(max(0.0, wake - _now()), self._on_timer) if wake is not None else None
            )
            self._wake_at = wake

    def _die(self) -> None:
        if self._on_die is not None:
            self._on_die(self)
            return
        self._tasks.spawn(f"die:{self._port}", self.kill, restart=False)


@contextlib.asynccontextmanager
async def serve_endpoint(spec: EndpointSpec) -> AsyncIterator[SimEndpoint]:
    """``async with serve_endpoint(spec) as ep:`` one endpoint for the duration of the block."""
    ep = SimEndpoint(spec)
    await ep.start()
    try:
        yield ep
    finally:
        await ep.stop()


def _cache_state(engine: SimEngine) -> dict[str, Any]:
    cache = engine.prefix_cache
    assert cache is not None
    return {
        "block_size": cache.block_size,
        "blocks": len(cache),
        "blocks_in_use": cache.blocks_in_use,
        "queries_tokens": cache.queries,
        "hits_tokens": cache.hits,
        "evicted_blocks": cache.evictions,
    }
