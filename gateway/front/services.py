"""What the routes may use: one typed object, built by the composition root and stored under one
`web.AppKey`. The routes never see the composition root itself.

Reloadable settings reach the front one way: the reload transaction calls `reconfigure` with the new
runtime configuration, which swaps `settings` (one reference) and adjusts the prompt counter.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from aiohttp import web

from gateway.admission.models import ModelCatalog
from gateway.admission.prompt_tokens import EnginePromptCounter
from gateway.admission.slo import Tenants
from gateway.admission.state import SloAdmission
from gateway.admission.tenancy import TenantAccounting
from gateway.batch.runner import BatchRunner
from gateway.config import RuntimeConfig
from gateway.config.schema import TelemetryConfig
from gateway.core.clock import Clock
from gateway.core.metrics import GatewayMetrics
from gateway.core.slo import SloPolicy
from gateway.dispatch.runner import Dispatcher
from gateway.front.batch_peers import BatchPeers
from gateway.sched.scheduler import Scheduler
from gateway.telemetry.live import LiveTelemetry
from gateway.telemetry.records import FinishedRequest
from gateway.upstream.credentials import EngineAuth


@dataclass(frozen=True, slots=True)
class RequestSettings:
    """The reloadable settings the request path reads, swapped whole on reload."""

    catalog: ModelCatalog
    policy_name: str
    slo: SloPolicy
    tenants: Tenants  # API key digest -> tenant ([[tenants]] and [auth] keys_file)
    auth_required: bool = False  # [auth] required: no tenant, no service (401)
    reject_disallowed: bool = False  # [auth] class_not_allowed = "reject"

    @classmethod
    def of(cls, runtime: RuntimeConfig) -> RequestSettings:
        cfg = runtime.config
        return cls(
            catalog=ModelCatalog(runtime.aliases),
            policy_name=runtime.policy.name,
            slo=runtime.policy.slo,
            tenants=Tenants(cfg.tenants, cfg.keys),
            auth_required=cfg.auth.required,
            reject_disallowed=cfg.auth.class_not_allowed == "reject",
        )


@dataclass(slots=True, kw_only=True)
class Services:
    clock: Clock
    metrics: GatewayMetrics
    scheduler: Scheduler
    telemetry: LiveTelemetry
    slo: SloAdmission
    settings: RequestSettings
    max_body_bytes: int
    admin_token: str
    # /metrics asks for the admin token ([ops] require_admin_token_for_metrics).
    metrics_need_token: bool = False
    # The shared upstream session, read per call: it opens after the services are built.
    session: Callable[[], aiohttp.ClientSession]
    # Exact prompt tokens from an engine ([telemetry] prompt_tokens = "tokenize"); None: estimated.
    prompt_counter: EnginePromptCounter | None = None
    tenancy: TenantAccounting = field(default_factory=TenantAccounting)
    engine_auth: EngineAuth = field(default_factory=EngineAuth)
    draining: bool = False
    # Node agents ([lifecycle]): whether every node's agent has answered, and the lifecycle part of
    # /admin/fleet. None: no lifecycle (a fixed fleet).
    lifecycle_answered: Callable[[], bool] | None = None
    lifecycle_document: Callable[[], dict[str, Any]] | None = None
    # Every admitted request's finish record (the lifecycle's autoscaler counts SLA violations from it).
    lifecycle_finished: Callable[[FinishedRequest], None] | None = None
    # The Files and Batches API (gateway.batch); None: its routes answer 404.
    batch: BatchRunner | None = None
    # Cluster mode: who holds which file or batch, and passing requests to it; None: no [cluster].
    batch_peers: BatchPeers | None = None
    # Cluster mode: /admin/cluster's document (gateway.cluster); None: no [cluster].
    cluster_document: Callable[[], dict[str, Any]] | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))
    _dispatcher: Dispatcher | None = None
    _keys: Iterator[int] = field(default_factory=itertools.count)

    def next_key(self) -> str:
        """berth's own id for a request, unique in this process: the scheduler and the dispatcher key
        requests by it. A client's X-Request-Id is only echoed and logged (two requests may carry the
        same one, by mistake or on purpose)."""
        return f"b{next(self._keys)}"

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise RuntimeError("the dispatcher is not running")
        return self._dispatcher

    def start_dispatch(self, dispatcher: Dispatcher | None) -> None:
        """The dispatcher once the upstream session is open (None again when it closes)."""
        self._dispatcher = dispatcher

    @property
    def ready(self) -> bool:
        if self.draining:
            return False
        if self.lifecycle_answered is not None:
            # An empty fleet is ready once the agents answered: models load on demand.
            return self.lifecycle_answered()
        return bool(self.scheduler.models(ready_only=True))

    def reconfigure(self, runtime: RuntimeConfig) -> None:
        self.settings = settings = RequestSettings.of(runtime)
        self.tenancy.configure(
            settings.tenants.by_name, self.clock.now(), retry_after_s=runtime.config.limits.retry_after_s
        )
        self._configure_prompt_counter(
            runtime.config.telemetry, ids=any(e.kv_events is not None for e in runtime.endpoints)
        )

    def _configure_prompt_counter(self, cfg: TelemetryConfig, *, ids: bool = False) -> None:
        """Build the exact prompt counter for "tokenize", or when the precise prefix source needs the
        prompts' token ids (`ids`: some endpoint publishes KV events); a running one keeps what it
        learned and takes the new timeout; none otherwise."""
        if cfg.prompt_tokens != "tokenize" and not ids:
            self.prompt_counter = None
            return
        if self.prompt_counter is not None:
            self.prompt_counter.timeout_s = cfg.tokenize_timeout_s
        else:
            self.prompt_counter = EnginePromptCounter(
                session=self.session,
                endpoints=lambda: self.scheduler.snapshot().endpoints,
                tokens=self.telemetry.tokens,
                metrics=self.metrics,
                clock=self.clock,
                timeout_s=cfg.tokenize_timeout_s,
                auth=self.engine_auth,
            )
        self.prompt_counter.ids = ids


SERVICES: Final[web.AppKey[Services]] = web.AppKey("services", Services)
