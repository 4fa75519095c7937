"""The endpoint set: the engines berth routes to, and one scraper per endpoint.

It applies the endpoint part of a runtime configuration (new endpoints get a scraper, removed ones lose
theirs, kept ones take new scrape settings), remembers the engine kind detected for endpoints configured
with `engine = auto`, and receives what the scrapers report (health, gauges, models, engine kind),
passing each to the scheduler, the telemetry service and the metrics. Endpoints started by node agents
join the same set.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import structlog
from prometheus_client import Counter, Gauge, Histogram

from gateway.config import RuntimeConfig
from gateway.core.clock import Clock
from gateway.core.metrics import GatewayMetrics
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, EngineKind
from gateway.dispatch.driver import SchedulerDriver
from gateway.lifecycle.kv_events import KvEventSources
from gateway.sched.types import EndpointSpec
from gateway.telemetry.engine_metrics import metrics_for
from gateway.telemetry.live import LiveTelemetry
from gateway.telemetry.scraper import EndpointScraper, ScrapeClient, ScrapeSettings
from gateway.upstream.credentials import EngineAuth

log = structlog.get_logger("berth.endpoints")


class _Series:
    """One endpoint's series of the scrape metrics, each looked up when first set and kept (a `labels()`
    call costs a few µs, and every scrape round made five); one never set is not exported, as before."""

    __slots__ = ("duration", "error", "kv_usage", "ok", "running", "waiting")

    def __init__(self) -> None:
        self.running: Gauge | None = None
        self.waiting: Gauge | None = None
        self.kv_usage: Gauge | None = None
        self.ok: Counter | None = None
        self.error: Counter | None = None
        self.duration: Histogram | None = None


class EndpointSet:
    def __init__(
        self,
        *,
        driver: SchedulerDriver,
        telemetry: LiveTelemetry,
        metrics: GatewayMetrics,
        clock: Clock,
        supervisor: TaskSupervisor,
        client: Callable[[], ScrapeClient],
        auth: EngineAuth | None = None,
        kv_events: KvEventSources | None = None,
    ) -> None:
        self._driver = driver
        self._kv_events = kv_events  # the precise prefix sources of endpoints that publish KV events
        self._auth = auth if auth is not None else EngineAuth()
        self._scheduler = driver.scheduler
        self._telemetry = telemetry
        self._metrics = metrics
        self._clock = clock
        self._supervisor = supervisor
        self._client = client  # read when a scraper is made: the client opens after this is built
        self._scrapers: dict[EndpointId, EndpointScraper] = {}
        self._series: dict[EndpointId, _Series] = {}
        self._detected: dict[EndpointId, EngineKind] = {}
        self._specs: tuple[EndpointSpec, ...] = ()
        self._engine_auto: Mapping[EndpointId, bool] = {}
        self._health_changed = asyncio.Event()
        self._runtime: RuntimeConfig | None = None
        self._agent_specs: tuple[EndpointSpec, ...] = ()

    @property
    def detected(self) -> Mapping[EndpointId, EngineKind]:
        """Engine kinds detected from /metrics (for endpoints configured with `engine = auto`)."""
        return self._detected

    def scrapers(self) -> list[EndpointScraper]:
        return list(self._scrapers.values())

    # ----------------------------------------------------------------- configuration
    def apply(self, runtime: RuntimeConfig) -> None:
        """Make the endpoint set equal to the runtime configuration's (plus the agent-started ones;
        credentials first: the scrapers and the dispatcher read them per call)."""
        self._auth.update(runtime.config.engine_keys)
        self._runtime = runtime
        self._sync()

    def set_agent_endpoints(self, specs: Sequence[EndpointSpec]) -> None:
        """The endpoints of instances node agents started (the lifecycle manager's), beside the
        configured ones: they are scraped, modelled and placed the same way."""
        self._agent_specs = tuple(specs)
        if self._runtime is not None:
            self._sync()

    def _sync(self) -> None:
        runtime = self._runtime
        assert runtime is not None
        configured = {s.id for s in runtime.endpoints}
        self._specs = runtime.endpoints + tuple(s for s in self._agent_specs if s.id not in configured)
        self._engine_auto = runtime.engine_auto
        specs = [self._with_detected(s) for s in self._specs]
        self._driver.run("endpoint", self._scheduler.sync_endpoints, specs)
        wanted = {s.id: s for s in specs}
        for eid in list(self._scrapers):
            spec = wanted.get(eid)
            if spec is None or spec.url != self._scrapers[eid].url:
                self._scrapers.pop(eid)
                self._supervisor.discard(f"scrape:{eid}")
                self._series.pop(eid, None)
                if spec is None:
                    self._metrics.endpoint_up.remove(eid)
                    self._auth.forget(eid)
        s = runtime.scrape
        settings = ScrapeSettings(
            interval_s=s.interval_s,
            timeout_s=s.timeout_s,
            unhealthy_after=s.unhealthy_after,
            models_refresh_s=s.models_refresh_s,
        )
        for eid, spec in wanted.items():
            if eid in self._scrapers:
                self._scrapers[eid].update_settings(settings)
                continue
            auto = self._engine_auto.get(eid, False)
            scraper = EndpointScraper(
                eid,
                spec.url,
                None if auto else metrics_for(spec.engine),
                self._client(),
                settings,
                self,
                self._clock,
                credentials=self._auth,
            )
            self._scrapers[eid] = scraper
            self._metrics.endpoint_up.labels(eid).set(0)
            self._supervisor.spawn(f"scrape:{eid}", scraper.run)
        if self._kv_events is not None:
            self._kv_events.sync(specs)

    def _with_detected(self, spec: EndpointSpec) -> EndpointSpec:
        kind = self._detected.get(spec.id)
        if kind is None or not self._engine_auto.get(spec.id, False):
            return spec
        return dataclasses.replace(spec, engine=kind)

    # ----------------------------------------------------------------- waiting for the fleet
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
                while not all(e.health is EndpointHealth.READY for e in self._scheduler.snapshot().endpoints):
                    await self._health_changed.wait()
        except TimeoutError:
            return False
        return True

    # ----------------------------------------------------------------- what the scrapers report
    def on_health(self, eid: EndpointId, health: EndpointHealth) -> None:
        self._metrics.endpoint_up.labels(eid).set(1 if health is EndpointHealth.READY else 0)
        log.info("endpoint_health", endpoint=eid, health=health.value)
        self._driver.run("endpoint", self._scheduler.set_health, eid, health)
        if self._kv_events is not None:
            self._kv_events.on_health(eid, health)
        changed, self._health_changed = self._health_changed, asyncio.Event()
        changed.set()

    def _series_of(self, eid: EndpointId) -> _Series:
        series = self._series.get(eid)
        if series is None:
            series = self._series[eid] = _Series()
        return series

    def on_gauges(self, eid: EndpointId, gauges: EngineGauges) -> None:
        m = self._metrics
        series = self._series_of(eid)
        if gauges.running is not None:
            if series.running is None:
                series.running = m.endpoint_engine_running.labels(eid)
            series.running.set(gauges.running)
        if gauges.waiting is not None:
            if series.waiting is None:
                series.waiting = m.endpoint_engine_waiting.labels(eid)
            series.waiting.set(gauges.waiting)
        if gauges.kv_usage is not None:
            if series.kv_usage is None:
                series.kv_usage = m.endpoint_kv_usage.labels(eid)
            series.kv_usage.set(gauges.kv_usage)
        self._driver.run("endpoint", self._scheduler.observe_gauges, eid, gauges)
        scraper = self._scrapers.get(eid)
        if scraper is not None:
            self._telemetry.on_scrape(eid, gauges, scraper.last_exposition, scraper.dialect)

    def on_models(self, eid: EndpointId, models: list[str]) -> None:
        log.info("endpoint_models", endpoint=eid, models=models)
        self._driver.run("endpoint", self._scheduler.set_models, eid, models)

    def on_engine(self, eid: EndpointId, kind: EngineKind) -> None:
        if self._detected.get(eid) is kind:
            return
        self._detected[eid] = kind
        log.info("endpoint_engine_detected", endpoint=eid, engine=kind.value)
        self._driver.run(
            "endpoint", self._scheduler.sync_endpoints, [self._with_detected(s) for s in self._specs]
        )

    def on_scrape(self, eid: EndpointId, ok: bool, duration_s: float, bad_lines: int) -> None:
        m = self._metrics
        series = self._series_of(eid)
        if ok:
            if series.ok is None:
                series.ok = m.scrapes.labels(eid, "ok")
            series.ok.inc()
        else:
            if series.error is None:
                series.error = m.scrapes.labels(eid, "error")
            series.error.inc()
        if series.duration is None:
            series.duration = m.scrape_duration.labels(eid)
        series.duration.observe(duration_s)
