"""Every long-lived component of one process, built once and wired together (`Gateway`), with their
cleanup contexts and the reload transaction; the batch runner's and cluster mode's wiring beside it.
`gateway.app.process` runs the process on them."""

from __future__ import annotations

import asyncio
import os
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
from gateway.batch.model import replica_tag
from gateway.batch.runner import BatchRunner, BatchSettings
from gateway.batch.sqlite_store import SqliteBatchStore
from gateway.cluster import Cluster
from gateway.cluster.directory import ReplicaDirectory
from gateway.cluster.exporter import ClusterCollector
from gateway.config import GatewayConfig, RuntimeConfig, load_runtime
from gateway.config.cluster import advertised_url
from gateway.config.schema import EndpointConfig
from gateway.core.clock import Clock, SystemClock
from gateway.core.errors import ConfigError
from gateway.core.heap import GcSchedule, GcScheduleCollector
from gateway.core.looplag import watch_lag
from gateway.core.metrics import GatewayMetrics, LiveNumbers
from gateway.core.sdnotify import Notifier, watchdog_loop
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import EndpointId, ModelName
from gateway.dispatch.driver import SchedulerDriver
from gateway.dispatch.runner import Dispatcher
from gateway.front.admin import running_by_kind
from gateway.front.batch_lines import FrontLines
from gateway.front.batch_peers import BatchPeers
from gateway.front.services import RequestSettings, Services
from gateway.lifecycle.endpoints import EndpointSet
from gateway.lifecycle.kv_events import KvEventsCollector, KvEventSources
from gateway.lifecycle.manager import LifecycleManager
from gateway.sched.registry import PluginRegistry
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import PeerLoad
from gateway.telemetry.live import LiveTelemetry
from gateway.upstream.client import (
    POOL_HINT,
    UpstreamSettings,
    make_fetcher,
    make_pool,
    make_session,
    pool_counts,
    pool_shortfalls,
)
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
        self.driver = SchedulerDriver(scheduler, metrics.decisions)
        # The collector's thresholds (settled once startup is done) and idle collections.
        self.gc = GcSchedule(metrics.gc_pauses)
        metrics.registry.register(GcScheduleCollector(self.gc))
        self.telemetry = LiveTelemetry(
            scheduler, clock, runtime.config.telemetry, prefix=runtime.config.prefix
        )
        self.telemetry.register(metrics.registry)
        slo = SloAdmission()
        tenancy = TenantAccounting()
        # [cluster]: limits, task clocks and endpoint load shared through Redis, one leader for the fleet.
        self.cluster: Cluster | None = None
        if cfg.cluster is not None:
            self.cluster = Cluster(cfg.cluster, retry_after_s=cfg.limits.retry_after_s)
            tenancy.shared = self.cluster.limits
            slo.shared = self.cluster.tasks
            hooks = self.cluster.member.hooks
            hooks.own_load = scheduler.own_loads
            hooks.on_peers = lambda loads: self.driver.run("peers", scheduler.observe_peers, loads)
            metrics.registry.register(ClusterCollector(self.cluster))
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
        if self.cluster is not None:
            self.services.cluster_document = self.cluster.document
        self.services.reconfigure(runtime)
        self.batch = self.services.batch = batch_runner(cfg, self.services)
        self.directory: ReplicaDirectory | None = None
        if self.cluster is not None:
            # Files and batches: the ids this replica makes carry its tag, the others forward to it.
            self.directory, self.services.batch_peers = batch_cluster(cfg, self.cluster, self.services)
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
                leadership=None if self.cluster is None else self.cluster.member,
            )
            if self.cluster is not None:
                lifecycle = self.lifecycle
                hooks = self.cluster.member.hooks
                hooks.on_cold = lambda models: lifecycle.on_cold(ModelName(m) for m in models)
                hooks.on_fleet = lifecycle.on_fleet_changed
                hooks.on_load_failed = lifecycle.on_load_failed
                hooks.on_leader = lifecycle.on_leadership
                hooks.own_load = lambda: published_load(scheduler, lifecycle)
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

    async def cluster_ctx(self, app: web.Application) -> AsyncIterator[None]:
        """The Redis link, closed after the fleet's tasks (the beat leaves the cluster as it ends)."""
        yield
        if self.cluster is not None:
            await self.cluster.close()

    async def fleet_ctx(self, app: web.Application) -> AsyncIterator[None]:
        self.endpoints.apply(self.runtime)
        self.check_pool()
        if self.cluster is not None:
            self.cluster.start(self.supervisor)
        if self.directory is not None:
            self.supervisor.spawn("cluster-directory", self.directory.run)
        self.supervisor.spawn("queue-ticker", lambda: self.driver.tick_forever(QUEUE_TICK_S))
        self.supervisor.spawn("telemetry", self.telemetry.run)
        if self.lifecycle is not None:
            self.supervisor.spawn("lifecycle", self.lifecycle.run)
        lag_interval = self.cfg.ops.loop_lag_interval_s
        self.metrics.loop_lag_recent.interval_s = lag_interval
        self.supervisor.spawn("loop-lag", lambda: watch_lag(self.metrics.loop_lag_recent, lag_interval))
        self.supervisor.spawn("gc-schedule", lambda: self.gc.run(lambda: self.driver.busy))
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

    def check_pool(self) -> None:
        """A warning for each engine-call pool limit (`[upstream] pool_total`, `pool_per_host`) below the
        seats of the fleet (the sum of its endpoints' cap bounds): at startup and after each reload. A
        bound learned later from an engine's gauges is not checked again; `berth_endpoint_cap_requests`
        beside `berth_upstream_pool_limit_connections` shows it."""
        seats = [(e.url, e.hard_cap) for e in self.scheduler.snapshot().endpoints]
        for short in pool_shortfalls(self.upstream, seats):
            log.warning(
                "upstream_pool_smaller_than_seats",
                key=short.key,
                pool=short.size,
                seats=short.seats,
                **({"host": short.host} if short.host else {}),
                hint=POOL_HINT,
            )

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
            upstream_pool_total=self.upstream.pool_total,
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
            self.driver.run("policy", self.scheduler.set_policy, new.policy)
            self.driver.run("policy", self.scheduler.set_limits, new.limits)
            self.endpoints.apply(new)
            self.check_pool()
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
        id_tag="" if cfg.cluster is None else replica_tag(cfg.cluster.name),
    )
    store = SqliteBatchStore(settings.dir / "batch.sqlite3")
    lines = FrontLines(services, slo_class=b.slo_class)
    return BatchRunner(store, settings, lines, BatchMetrics(services.metrics.registry))


def batch_cluster(
    cfg: GatewayConfig, cluster: Cluster, services: Services
) -> tuple[ReplicaDirectory, BatchPeers]:
    """Cluster mode's Files and Batches: this replica's address in the directory, and the forwarding."""
    assert cfg.cluster is not None
    directory = ReplicaDirectory(
        cluster.link,
        cluster.member,
        advertised_url(cfg.cluster.config, cfg.server.host_port),
        refresh_s=cfg.cluster.config.lease_s,
    )
    return directory, BatchPeers(directory, services.session)


def published_load(scheduler: Scheduler, lifecycle: LifecycleManager) -> dict[EndpointId, PeerLoad]:
    """What a replica publishes (cluster mode): its own load per endpoint, and its requests still running
    on endpoints it has stopped placing on (a drain the leader runs waits for them)."""
    loads = scheduler.own_loads()
    for eid, n in lifecycle.leaving_inflight().items():
        if eid not in loads:
            loads[eid] = PeerLoad(n)
    return loads
