"""The composition root: builds every long-lived component once, wires them, and owns the process's life.

Lifecycle through `cleanup_ctx`, in dependency order: upstream session, engine-call pool and scrape
client (and the dispatcher on them) -> fleet (endpoint set and its scrapers, queue ticker, telemetry
loop, systemd watchdog). `serve()` binds, waits for the first scrape round, tells systemd READY=1,
reloads on SIGHUP and drains on SIGTERM.

Reload is a transaction: the new runtime configuration is built aside and, only when it is whole, pushed
to each component that takes reloadable settings (scheduler, endpoint set, telemetry, front).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from gateway.admission.exporter import SloCollector, TenantCollector
from gateway.admission.state import SloAdmission
from gateway.admission.tenancy import TenantAccounting
from gateway.batch.metrics import BatchMetrics
from gateway.batch.runner import BatchRunner, BatchSettings
from gateway.batch.sqlite_store import SqliteBatchStore
from gateway.config import GatewayConfig, RuntimeConfig, load_runtime
from gateway.config.schema import EndpointConfig
from gateway.core.clock import Clock, SystemClock
from gateway.core.errors import ConfigError
from gateway.core.heap import settle
from gateway.core.looplag import watch_lag
from gateway.core.metrics import GatewayMetrics, LiveNumbers
from gateway.core.sdnotify import Notifier, watchdog_loop
from gateway.core.tasks import TaskSupervisor
from gateway.dispatch.driver import SchedulerDriver
from gateway.dispatch.runner import Dispatcher
from gateway.front.admin import is_loopback, running_by_kind
from gateway.front.batch_lines import FrontLines
from gateway.front.routes import add_ops_routes, add_routes
from gateway.front.services import RequestSettings, Services
from gateway.lifecycle.endpoints import EndpointSet
from gateway.lifecycle.kv_events import KvEventsCollector, KvEventSources
from gateway.lifecycle.manager import LifecycleManager
from gateway.sched.registry import PluginRegistry
from gateway.sched.scheduler import Scheduler
from gateway.telemetry.live import LiveTelemetry
from gateway.upstream.client import UpstreamSettings, make_fetcher, make_pool, make_session, pool_counts
from gateway.upstream.credentials import EngineAuth, EngineAuthCollector
from gateway.upstream.fetch import Fetcher
from gateway.upstream.pool import Pool

log = structlog.get_logger("berth.app")

QUEUE_TICK_S = 0.1


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How the process was started: the config file (None: flags only) and the flag overrides."""

    config_path: Path | None
    listen: str | None = None
    endpoints: tuple[EndpointConfig, ...] = ()
    policy_file: str | None = None


class Gateway:
    """Every long-lived component of one process, wired together."""

    def __init__(
        self,
        runtime: RuntimeConfig,
        cfg: GatewayConfig,
        options: ServeOptions,
        *,
        registry: PluginRegistry,
        clock: Clock | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.cfg = cfg
        self.options = options
        self.registry = registry
        self.runtime = runtime
        self.clock = clock = clock or SystemClock()
        self.notifier = notifier or Notifier.from_env()
        self.supervisor = TaskSupervisor()
        self.metrics = metrics = GatewayMetrics()
        self.upstream = UpstreamSettings.of(cfg.upstream)
        self.scheduler = scheduler = Scheduler(runtime.policy, clock, runtime.limits)
        self.driver = SchedulerDriver(scheduler)
        self.telemetry = LiveTelemetry(
            scheduler, clock, runtime.config.telemetry, prefix=runtime.config.prefix
        )
        self.telemetry.register(metrics.registry)
        slo = SloAdmission()
        tenancy = TenantAccounting()
        self.engine_auth = EngineAuth()
        metrics.attach_live(self._live_numbers)
        metrics.registry.register(SloCollector(slo, self._slo_totals, scheduler.admission.counts))
        metrics.registry.register(TenantCollector(tenancy, slo))
        metrics.registry.register(EngineAuthCollector(self.engine_auth))
        self._session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None  # generation calls' connections
        self._fetcher: Fetcher | None = None  # the scrapers' GETs, on connections of their own
        # The precise prefix source of each endpoint that publishes KV events (`kv_events`);
        # each usable store is attached to the prefix index.
        self.kv_events = KvEventSources(clock=clock, supervisor=self.supervisor, index=self.telemetry.prefix)
        metrics.registry.register(KvEventsCollector(self.kv_events.statuses, self.kv_events.decode_errors))
        self.endpoints = EndpointSet(
            driver=self.driver,
            telemetry=self.telemetry,
            metrics=metrics,
            clock=clock,
            supervisor=self.supervisor,
            client=self.scrape_client,
            auth=self.engine_auth,
            kv_events=self.kv_events,
        )
        self.services = Services(
            clock=clock,
            metrics=metrics,
            scheduler=scheduler,
            telemetry=self.telemetry,
            slo=slo,
            settings=RequestSettings.of(runtime),
            max_body_bytes=cfg.server.max_body_bytes,
            admin_token=cfg.server.admin_token,
            metrics_need_token=cfg.ops.require_admin_token_for_metrics,
            session=self.session,
            tenancy=tenancy,
            engine_auth=self.engine_auth,
        )
        self.services.reconfigure(runtime)
        self.batch = self.services.batch = batch_runner(cfg, self.services)
        self.lifecycle: LifecycleManager | None = None
        if cfg.lifecycle is not None:
            self.lifecycle = LifecycleManager(
                cfg.lifecycle,
                driver=self.driver,
                endpoints=self.endpoints,
                clock=clock,
                supervisor=self.supervisor,
                registry=metrics.registry,
                default_cap=cfg.limits.default_endpoint_cap,
                retry_after_s=cfg.limits.retry_after_s,
                prior=lambda: self.telemetry.fleet.settings.prior,
            )
            self.services.lifecycle_answered = lambda: self.lifecycle is not None and self.lifecycle.answered
            self.services.lifecycle_document = self.lifecycle.document
            self.services.lifecycle_finished = self.lifecycle.on_finished
        self._reload_lock = asyncio.Lock()
        self._reload_again = False

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the HTTP session is not open")
        return self._session

    def scrape_client(self) -> Fetcher:
        if self._fetcher is None:
            raise RuntimeError("the scrape client is not open")
        return self._fetcher

    async def session_ctx(self, app: web.Application) -> AsyncIterator[None]:
        self._session = make_session(self.upstream)
        self._pool = make_pool(self.upstream, self.clock)
        self._fetcher = make_fetcher(self.upstream, self.clock)
        self.services.start_dispatch(
            Dispatcher(
                session=self._session,
                pool=self._pool,
                driver=self.driver,
                metrics=self.metrics,
                clock=self.clock,
                settings=self.upstream,
                auth=self.engine_auth,
                prefix=self.telemetry.prefix,
            )
        )
        yield
        self.services.start_dispatch(None)
        self._pool.close()
        self._pool = None
        self._fetcher.pool.close()
        self._fetcher = None
        await self._session.close()
        self._session = None

    async def fleet_ctx(self, app: web.Application) -> AsyncIterator[None]:
        self.endpoints.apply(self.runtime)
        self.supervisor.spawn("queue-ticker", lambda: self.driver.tick_forever(QUEUE_TICK_S))
        self.supervisor.spawn("telemetry", self.telemetry.run)
        if self.lifecycle is not None:
            self.supervisor.spawn("lifecycle", self.lifecycle.run)
        lag_interval = self.cfg.ops.loop_lag_interval_s
        self.metrics.loop_lag_recent.interval_s = lag_interval
        self.supervisor.spawn("loop-lag", lambda: watch_lag(self.metrics.loop_lag_recent, lag_interval))
        if self.notifier.watchdog_interval_s() is not None:
            self.supervisor.spawn("systemd-watchdog", lambda: watchdog_loop(self.notifier))
        yield
        await self.supervisor.close()

    async def batch_ctx(self, app: web.Application) -> AsyncIterator[None]:
        """The batch runner: resumes the batches on disk and feeds their lines; on the way out, the
        lines in flight may finish for the drain timeout, the rest are aborted (they run again after a
        restart), and the store is closed."""
        self.supervisor.spawn("batch-runner", self.batch.run)
        yield
        await self.batch.drain(self.cfg.server.drain_timeout_s)
        await self.supervisor.cancel("batch-runner")
        await self.batch.close()

    def _slo_totals(self) -> dict[str, tuple[int, int]]:
        totals = self.telemetry.fleet.attainment.totals()
        return {cls: (a.finished, a.met) for cls, a in totals.items()}

    def _live_numbers(self) -> LiveNumbers:
        snap = self.scheduler.snapshot()
        in_use, idle = pool_counts(
            self._session, self._pool, None if self._fetcher is None else self._fetcher.pool
        )
        return LiveNumbers(
            queue_depth={str(m): n for m, n in self.scheduler.queue_depths().items()},
            inflight={e.id: e.inflight for e in snap.endpoints},
            waiting=self.driver.waiting,
            tasks=len(asyncio.all_tasks()),
            upstream_in_use=in_use,
            upstream_idle=idle,
            cap={e.id: e.cap for e in snap.endpoints},
            running_by_kind={
                (e.id, e.instance_class.value, kind): n
                for e in snap.endpoints
                for kind, n in running_by_kind(e, self.services.settings.slo).items()
            },
        )

    def request_reload(self) -> None:
        """SIGHUP: reload now, or, when a reload is under way, once more after it (however many signals
        came meanwhile: the last one asks for the files as they are then)."""
        if "reload" in self.supervisor.names:
            self._reload_again = True
            return
        self.supervisor.spawn("reload", self._reload_until_settled, restart=False)

    async def _reload_until_settled(self) -> None:
        await self.reload()
        while self._reload_again:
            self._reload_again = False
            await self.reload()

    async def reload(self) -> bool:
        """SIGHUP: build the new runtime aside; push it on success, keep the old one on any error."""
        async with self._reload_lock:
            self.notifier.reloading()
            try:
                new = load_runtime(
                    self.options.config_path,
                    self.cfg,
                    self.registry,
                    listen=self.options.listen,
                    endpoints=self.options.endpoints,
                    policy_file=self.options.policy_file,
                    detected=self.endpoints.detected,
                )
            except ConfigError as e:
                self.metrics.config_reloads.labels("rejected").inc()
                log.error("config_reload_rejected", error=str(e), file=e.file, path=e.path)
                self.notifier.ready()
                return False
            self.runtime = new
            self.services.reconfigure(new)
            self.telemetry.reconfigure(new.config.telemetry)
            self.telemetry.reconfigure_prefix(new.config.prefix)
            self.driver.apply(self.scheduler.set_policy(new.policy))
            self.driver.apply(self.scheduler.set_limits(new.limits))
            self.endpoints.apply(new)
            self.metrics.config_reloads.labels("ok").inc()
            for change in new.static_changes:
                log.warning("config_static_change_ignored", change=change)
            log.info("config_reloaded", policy=new.policy.name, endpoints=len(new.endpoints))
            self.notifier.ready()
            return True


def batch_dir(cfg: GatewayConfig, env: Mapping[str, str] | None = None) -> Path:
    """Where batches live: [batch] dir (or --batch-dir), else $STATE_DIRECTORY/batch (systemd's
    StateDirectory=), else ./berth-state/batch."""
    if cfg.batch_dir is not None:
        return cfg.batch_dir
    state = (os.environ if env is None else env).get("STATE_DIRECTORY", "")
    if state:
        return Path(state.split(":")[0]) / "batch"
    return Path("berth-state", "batch").absolute()


def batch_runner(cfg: GatewayConfig, services: Services) -> BatchRunner:
    b = cfg.batch
    settings = BatchSettings(
        dir=batch_dir(cfg),
        max_lines_in_flight=b.max_lines_in_flight,
        max_file_bytes=b.max_file_bytes,
        max_lines=b.max_lines,
        file_expiry_s=b.file_expiry_s,
        max_window_s=b.max_window_s,
        retry_s=b.retry_s,
    )
    store = SqliteBatchStore(settings.dir / "batch.sqlite3")
    lines = FrontLines(services, slo_class=b.slo_class)
    return BatchRunner(store, settings, lines, BatchMetrics(services.metrics.registry))


def build_app(gw: Gateway) -> web.Application:
    # client_max_size is only a backstop: read_body enforces the configured limit with an OpenAI error.
    app = web.Application(client_max_size=gw.cfg.server.max_body_bytes + 1)
    app.cleanup_ctx.append(gw.session_ctx)
    app.cleanup_ctx.append(gw.fleet_ctx)
    app.cleanup_ctx.append(gw.batch_ctx)  # cleaned up first: its lines need the dispatcher
    add_routes(app, gw.services, with_ops=not gw.cfg.ops.listen)
    return app


def build_ops_app(gw: Gateway) -> web.Application:
    """The ops listener's app ([ops] listen): /metrics, /healthz, /readyz, /admin/*; its lifecycle
    is the main app's."""
    app = web.Application(client_max_size=64 * 1024)
    add_ops_routes(app, gw.services)
    return app


def warn_unauthenticated(auth_required: bool, host: str, port: int) -> None:
    """A clear warning when anyone who reaches a non-loopback listener is served without a key."""
    if auth_required or host == "localhost" or is_loopback(host):
        return
    log.warning(
        "auth_not_required",
        listen=f"{host}:{port}",
        hint="every client that reaches this address is served; set [auth] required = true",
    )


async def serve(gw: Gateway) -> None:
    """Run until SIGTERM/SIGINT; SIGHUP reloads."""
    runner = web.AppRunner(
        build_app(gw),
        handle_signals=False,
        shutdown_timeout=gw.cfg.server.drain_timeout_s,
        handler_cancellation=True,
        access_log=None,
    )
    await runner.setup()
    host, port = gw.cfg.server.host_port
    await web.TCPSite(runner, host, port, backlog=1024).start()
    warn_unauthenticated(gw.runtime.config.auth.required, host, port)
    ops_runner: web.AppRunner | None = None
    if gw.cfg.ops.listen:
        ops_runner = web.AppRunner(build_ops_app(gw), handle_signals=False, access_log=None)
        await ops_runner.setup()
        ops_host, ops_port = gw.cfg.ops.host_port
        await web.TCPSite(ops_runner, ops_host, ops_port).start()
        log.info("ops_listening", listen=gw.cfg.ops.listen)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, gw.request_reload)
    await gw.endpoints.first_round(timeout_s=gw.runtime.scrape.timeout_s * 2 + 1.0)
    if gw.lifecycle is not None:
        await gw.lifecycle.wait_answered(timeout_s=gw.lifecycle.setup.config.agent_timeout_s * 2 + 1.0)
    settle()  # everything kept for the process's lifetime is built: freeze it, out of the collector's way
    gw.notifier.ready()
    log.info(
        "serving",
        listen=f"{host}:{port}",
        endpoints=len(gw.runtime.endpoints),
        policy=gw.runtime.policy.name,
        ready=gw.services.ready,
    )
    try:
        await stop.wait()
        begin_drain(gw)
        await accept_grace(gw.cfg.server.accept_grace_s, stop)
    finally:
        if not gw.services.draining:
            begin_drain(gw)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        if ops_runner is not None:
            await ops_runner.cleanup()
        gw.notifier.close()
        log.info("stopped")


def begin_drain(gw: Gateway) -> None:
    """New requests get 503 `shutting_down` and /readyz 503 from now on; systemd hears STOPPING=1."""
    gw.services.draining = True
    gw.notifier.stopping()
    log.info("draining", timeout_s=gw.cfg.server.drain_timeout_s, accept_grace_s=gw.cfg.server.accept_grace_s)


async def accept_grace(grace_s: float, stop: asyncio.Event) -> None:
    """Keep the listener open `grace_s` after SIGTERM, or until a second SIGTERM/SIGINT: connections
    already queued for it (accepted by the kernel, not yet read) and a load balancer's last requests
    before its next /readyz get a precise 503 `shutting_down`; closing the listener at once resets them."""
    if grace_s <= 0:
        return
    stop.clear()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(grace_s):
            await stop.wait()
