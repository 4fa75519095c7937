"""build_app(): the daemon's composition root. Lifecycle through cleanup_ctx, in dependency order:

    http session -> fleet (scheduler endpoints, scrapers, queue ticker, systemd watchdog)

`serve()` runs it: binds, waits for the first scrape round, tells systemd READY=1, reloads on SIGHUP
(build aside, swap on success, keep the old config on any error), and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from gateway.admission.exporter import SloCollector
from gateway.admission.models import ModelCatalog
from gateway.admission.prompt_tokens import EnginePromptCounter
from gateway.admission.state import SloAdmission
from gateway.config import GatewayConfig, RuntimeConfig, load_runtime
from gateway.config.schema import EndpointConfig, TelemetryConfig
from gateway.core.clock import Clock, SystemClock
from gateway.core.errors import ConfigError
from gateway.core.heap import settle
from gateway.core.metrics import CONTENT_TYPE, GatewayMetrics, LiveNumbers
from gateway.core.sdnotify import Notifier, watchdog_loop
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import ApiKind, EndpointHealth, EndpointId, EngineGauges, EngineKind
from gateway.dispatch.driver import SchedulerDriver
from gateway.dispatch.runner import Dispatcher
from gateway.front.admin import FLEET_PATH, make_fleet_handler
from gateway.front.http import method_not_allowed, not_found
from gateway.handlers import make_api_handler
from gateway.live_telemetry import LiveTelemetry
from gateway.sched.plugins import default_registry
from gateway.sched.registry import PluginRegistry
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec
from gateway.telemetry.scraper import EndpointScraper, ScrapeSettings
from gateway.upstream.client import UpstreamSettings, make_session
from gateway.upstream.dialects import dialect_for

log = structlog.get_logger("berth.app")

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")
QUEUE_TICK_S = 0.1


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How the process was started: the config file (None: flags only) and the flag overrides."""

    config_path: Path | None
    listen: str | None = None
    endpoints: tuple[EndpointConfig, ...] = ()
    policy_file: str | None = None


class Gateway:
    """The running gateway: every long-lived object, built once per process."""

    def __init__(
        self,
        runtime: RuntimeConfig,
        cfg: GatewayConfig,
        options: ServeOptions,
        *,
        clock: Clock | None = None,
        registry: PluginRegistry | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.cfg = cfg
        self.options = options
        self.clock = clock or SystemClock()
        self.registry = registry or default_registry()
        self.metrics = GatewayMetrics()
        self.notifier = notifier or Notifier.from_env()
        self.supervisor = TaskSupervisor()
        self.runtime = runtime
        self.scheduler = Scheduler(runtime.policy, self.clock, runtime.limits)
        self.driver = SchedulerDriver(self.scheduler)
        self.metrics.attach_live(self._live_numbers)
        self.telemetry = LiveTelemetry(
            self.scheduler, self.driver, self.clock, lambda: self.runtime.config.telemetry
        )
        self.telemetry.register(self.metrics.registry)
        self.slo = SloAdmission()
        self.metrics.registry.register(
            SloCollector(self.slo, self._slo_totals, self.scheduler.admission.counts)
        )
        self.catalog = ModelCatalog(runtime.aliases)
        self.upstream = UpstreamSettings(
            connect_timeout_s=cfg.upstream.connect_timeout_s,
            first_byte_timeout_s=cfg.upstream.first_byte_timeout_s,
            read_timeout_s=cfg.upstream.read_timeout_s,
            max_retries=cfg.upstream.max_retries,
            pool_per_host=cfg.upstream.pool_per_host,
            pool_total=cfg.upstream.pool_total,
        )
        self.max_body_bytes = cfg.server.max_body_bytes
        self.draining = False
        self.started_at = int(time.time())
        self._session: aiohttp.ClientSession | None = None
        self._dispatcher: Dispatcher | None = None
        self._scrapers: dict[EndpointId, EndpointScraper] = {}
        self._detected: dict[EndpointId, EngineKind] = {}
        self._reload_lock = asyncio.Lock()
        self._health_changed = asyncio.Event()
        # [telemetry] prompt_tokens = "tokenize": exact counts from an engine; None: the estimate.
        self.prompt_counter: EnginePromptCounter | None = None
        self._configure_prompt_counter(runtime.config.telemetry)

    # ----------------------------------------------------------------- wiring
    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the HTTP session is not open")
        return self._session

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise RuntimeError("the dispatcher is not running")
        return self._dispatcher

    async def session_ctx(self, app: web.Application) -> AsyncIterator[None]:
        self._session = make_session(self.upstream)
        self._dispatcher = Dispatcher(
            session=self._session,
            driver=self.driver,
            metrics=self.metrics,
            clock=self.clock,
            settings=self.upstream,
        )
        yield
        await self._session.close()
        self._session = None

    async def fleet_ctx(self, app: web.Application) -> AsyncIterator[None]:
        self._apply_endpoints(self.runtime.endpoints)
        self.supervisor.spawn("queue-ticker", lambda: self.driver.tick_forever(QUEUE_TICK_S))
        self.supervisor.spawn("telemetry", self.telemetry.run)
        if self.notifier.watchdog_interval_s() is not None:
            self.supervisor.spawn("systemd-watchdog", lambda: watchdog_loop(self.notifier))
        yield
        await self.supervisor.close()

    async def first_round(self, timeout_s: float) -> None:
        """Wait until every scraper finished one round (or `timeout_s` passed: traffic never waits)."""
        waits = [s.round_done.wait() for s in self._scrapers.values()]
        if not waits:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*waits)
        except TimeoutError:
            log.warning("first_scrape_round_incomplete", timeout_s=timeout_s)

    async def wait_all_ready(self, timeout_s: float) -> bool:
        """Wait until every endpoint is ready (an event per health change); False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                while not all(e.health is EndpointHealth.READY for e in self.scheduler.snapshot().endpoints):
                    await self._health_changed.wait()
        except TimeoutError:
            return False
        return True

    def _configure_prompt_counter(self, cfg: TelemetryConfig) -> None:
        """Build the exact prompt counter for "tokenize" (a running one keeps what it learned and
        takes the new timeout); none for "estimate"."""
        if cfg.prompt_tokens != "tokenize":
            self.prompt_counter = None
        elif self.prompt_counter is not None:
            self.prompt_counter.timeout_s = cfg.tokenize_timeout_s
        else:
            self.prompt_counter = EnginePromptCounter(
                session=lambda: self.session,
                endpoints=lambda: self.scheduler.snapshot().endpoints,
                tokens=self.telemetry.tokens,
                metrics=self.metrics,
                clock=self.clock,
                timeout_s=cfg.tokenize_timeout_s,
            )

    def _note_health_change(self) -> None:
        changed, self._health_changed = self._health_changed, asyncio.Event()
        changed.set()

    # ----------------------------------------------------------------- endpoints and scrapers
    def _scrape_settings(self) -> ScrapeSettings:
        s = self.runtime.scrape
        return ScrapeSettings(
            interval_s=s.interval_s,
            timeout_s=s.timeout_s,
            unhealthy_after=s.unhealthy_after,
            models_refresh_s=s.models_refresh_s,
        )

    def _apply_endpoints(self, specs: Sequence[EndpointSpec]) -> None:
        specs = [self._with_detected(s) for s in specs]
        self.driver.apply(self.scheduler.sync_endpoints(specs))
        wanted = {s.id: s for s in specs}
        for eid in list(self._scrapers):
            spec = wanted.get(eid)
            if spec is None or spec.url != self._scrapers[eid].url:
                self._scrapers.pop(eid)
                self.supervisor.discard(f"scrape:{eid}")
                if spec is None:
                    self.metrics.endpoint_up.remove(eid)
        settings = self._scrape_settings()
        for eid, spec in wanted.items():
            if eid in self._scrapers:
                self._scrapers[eid].update_settings(settings)
                continue
            auto = self.runtime.engine_auto.get(eid, False)
            scraper = EndpointScraper(
                eid,
                spec.url,
                None if auto else dialect_for(spec.engine),
                self.session,
                settings,
                _Sink(self),
                self.clock,
            )
            self._scrapers[eid] = scraper
            self.metrics.endpoint_up.labels(eid).set(0)
            self.supervisor.spawn(f"scrape:{eid}", scraper.run)

    def _with_detected(self, spec: EndpointSpec) -> EndpointSpec:
        kind = self._detected.get(spec.id)
        if kind is None or not self.runtime.engine_auto.get(spec.id, False):
            return spec
        return EndpointSpec(
            id=spec.id,
            url=spec.url,
            engine=kind,
            models=spec.models,
            instance_class=spec.instance_class,
            cap=spec.cap,
            node=spec.node,
            priority_scheduling=spec.priority_scheduling,
        )

    def _slo_totals(self) -> dict[str, tuple[int, int]]:
        self.telemetry.drain()  # the requests finished since the last refresh count too
        totals = self.telemetry.fleet.attainment.totals()
        return {cls: (a.finished, a.met) for cls, a in totals.items()}

    def _live_numbers(self) -> LiveNumbers:
        snap = self.scheduler.snapshot()
        return LiveNumbers(
            queue_depth={str(m): n for m, n in self.scheduler.queue_depths().items()},
            inflight={e.id: e.inflight for e in snap.endpoints},
        )

    # ----------------------------------------------------------------- reload
    async def reload(self) -> bool:
        """SIGHUP: build the new runtime aside; swap on success, keep the old one on any error."""
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
                    detected=self._detected,
                )
            except ConfigError as e:
                self.metrics.config_reloads.labels("rejected").inc()
                log.error("config_reload_rejected", error=str(e), file=e.file, path=e.path)
                self.notifier.ready()
                return False
            self.runtime = new
            self.catalog = ModelCatalog(new.aliases)
            self._configure_prompt_counter(new.config.telemetry)
            self.driver.apply(self.scheduler.set_policy(new.policy))
            self.driver.apply(self.scheduler.set_limits(new.limits))
            self._apply_endpoints(new.endpoints)
            self.metrics.config_reloads.labels("ok").inc()
            for change in new.static_changes:
                log.warning("config_static_change_ignored", change=change)
            log.info("config_reloaded", policy=new.policy.name, endpoints=len(new.endpoints))
            self.notifier.ready()
            return True

    @property
    def ready(self) -> bool:
        return not self.draining and bool(self.scheduler.models(ready_only=True))


class _Sink:
    """Where scrapers report: the scheduler, the metrics and the log."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def on_health(self, eid: EndpointId, health: EndpointHealth) -> None:
        gw = self.gw
        gw.metrics.endpoint_up.labels(eid).set(1 if health is EndpointHealth.READY else 0)
        log.info("endpoint_health", endpoint=eid, health=health.value)
        gw.driver.apply(gw.scheduler.set_health(eid, health))
        gw._note_health_change()

    def on_gauges(self, eid: EndpointId, gauges: EngineGauges) -> None:
        gw = self.gw
        m = gw.metrics
        if gauges.running is not None:
            m.endpoint_engine_running.labels(eid).set(gauges.running)
        if gauges.waiting is not None:
            m.endpoint_engine_waiting.labels(eid).set(gauges.waiting)
        if gauges.kv_usage is not None:
            m.endpoint_kv_usage.labels(eid).set(gauges.kv_usage)
        gw.driver.apply(gw.scheduler.observe_gauges(eid, gauges))
        scraper = gw._scrapers.get(eid)
        if scraper is not None:
            gw.telemetry.on_scrape(eid, gauges, scraper.last_exposition, scraper.dialect)

    def on_models(self, eid: EndpointId, models: list[str]) -> None:
        log.info("endpoint_models", endpoint=eid, models=models)
        self.gw.driver.apply(self.gw.scheduler.set_models(eid, models))

    def on_engine(self, eid: EndpointId, kind: EngineKind) -> None:
        gw = self.gw
        if gw._detected.get(eid) is kind:
            return
        gw._detected[eid] = kind
        log.info("endpoint_engine_detected", endpoint=eid, engine=kind.value)
        gw.driver.apply(gw.scheduler.sync_endpoints([gw._with_detected(s) for s in gw.runtime.endpoints]))

    def on_scrape(self, eid: EndpointId, ok: bool, duration_s: float, bad_lines: int) -> None:
        m = self.gw.metrics
        m.scrapes.labels(eid, "ok" if ok else "error").inc()
        m.scrape_duration.labels(eid).observe(duration_s)


# --------------------------------------------------------------------- routes
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    if gw.ready:
        return web.json_response({"status": "ready"})
    reason = "draining" if gw.draining else "no ready endpoint"
    return web.json_response({"status": "not ready", "reason": reason}, status=503)


async def metrics(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    return web.Response(body=gw.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    listing = gw.catalog.listing(gw.scheduler.models(ready_only=True), gw.started_at)
    return web.json_response(listing)


def build_app(gw: Gateway) -> web.Application:
    # client_max_size is only a backstop: read_body enforces the configured limit with an OpenAI error.
    app = web.Application(client_max_size=gw.max_body_bytes + 1)
    app[GATEWAY_KEY] = gw
    app.cleanup_ctx.append(gw.session_ctx)
    app.cleanup_ctx.append(gw.fleet_ctx)
    r = app.router
    for api in ApiKind:
        r.add_post(api.path, make_api_handler(gw, api))
        r.add_route("*", api.path, method_not_allowed("POST"))
    for path, handler in (
        ("/v1/models", models),
        ("/healthz", healthz),
        ("/readyz", readyz),
        ("/metrics", metrics),
    ):
        r.add_get(path, handler)
        r.add_route("*", path, method_not_allowed("GET"))
    r.add_get(FLEET_PATH, make_fleet_handler(gw))
    r.add_route("*", FLEET_PATH, method_not_allowed("GET"))
    r.add_route("*", "/{tail:.*}", not_found)
    return app


async def serve(gw: Gateway) -> None:
    """Run until SIGTERM/SIGINT; SIGHUP reloads."""
    app = build_app(gw)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        shutdown_timeout=gw.cfg.server.drain_timeout_s,
        handler_cancellation=True,
        access_log=None,
    )
    await runner.setup()
    host, port = gw.cfg.server.host_port
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: gw.supervisor.spawn("reload", gw.reload, restart=False))
    await gw.first_round(timeout_s=gw.runtime.scrape.timeout_s * 2 + 1.0)
    settle()  # everything kept for the process's lifetime is built: freeze it, out of the collector's way
    gw.notifier.ready()
    log.info(
        "serving",
        listen=f"{host}:{port}",
        endpoints=len(gw.runtime.endpoints),
        policy=gw.runtime.policy.name,
        ready=gw.ready,
    )
    try:
        await stop.wait()
    finally:
        gw.draining = True
        gw.notifier.stopping()
        log.info("draining", timeout_s=gw.cfg.server.drain_timeout_s)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        gw.notifier.close()
        log.info("stopped")
