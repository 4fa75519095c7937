"""The schema of gateway.toml: one frozen msgspec Struct per section, unknown keys are errors.

Static sections (`server`, `upstream`, `ops`, `batch`) take effect at start only; `limits`, `scrape`,
`telemetry`, `auth` (and its keys file), `aliases`, `endpoints`, `tenants` and the policy file are
reloaded on SIGHUP (see `gateway.config.runtime`).
Numbers are range-checked here (msgspec `Meta`); checks that relate values to each other, URLs and
`listen` live in `gateway.config.validate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from gateway.config.cluster import ClusterConfig, ClusterSetup
from gateway.config.lifecycle import LifecycleConfig, LifecycleSetup, NodeConfig
from gateway.config.secrets import Secret
from gateway.core.looplag import LAG_INTERVAL_S
from gateway.core.types import EndpointId, EngineKind, InstanceClass, ModelName
from gateway.sched.types import EndpointSpec, QueueLimits

PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]

LogLevel = Literal["debug", "info", "warning", "error", "critical"]

#: Spelling of "detect the engine from its /metrics names" in files and flags; stored as None.
ENGINE_AUTO: Final = "auto"

DEFAULT_LISTEN: Final = "127.0.0.1:8080"


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[server] (static)."""

    listen: str = DEFAULT_LISTEN  # HOST:PORT; IPv6 hosts in brackets: "[::1]:8080"
    max_body_bytes: PositiveInt = 32 * 1024 * 1024  # larger request bodies get 413
    drain_timeout_s: NonNegativeFloat = 30.0  # on SIGTERM, let streams finish this long
    # On SIGTERM, keep accepting this long first, answering new requests 503 shutting_down (a second
    # SIGTERM ends it): connections queued for the listener get an answer rather than a reset.
    accept_grace_s: NonNegativeFloat = 0.5
    admin_token: str = ""  # BERTH_ADMIN_TOKEN in the environment overrides it
    log_level: LogLevel = "info"

    @property
    def host_port(self) -> tuple[str, int]:
        """`listen` split for aiohttp (brackets of an IPv6 host removed); assumes it was validated."""
        return split_host_port(self.listen)


class LimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[limits] (reloadable)."""

    max_queue_per_model: PositiveInt = 1024  # 429 past it
    max_queue_wait_s: PositiveFloat = 30.0  # 503 queue_timeout past it
    retry_after_s: NonNegativeFloat = 1.0
    default_endpoint_cap: PositiveInt = 64  # an endpoint without a cap, until its engine's batch size is seen


class UpstreamConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[upstream] (static)."""

    connect_timeout_s: PositiveFloat = 5.0  # connecting to an engine, a wait for a pooled slot included
    first_byte_timeout_s: PositiveFloat = 120.0  # 504 when the engine sends no headers in time
    read_timeout_s: PositiveFloat = 120.0  # 504 / error event when a stream goes silent this long
    max_retries: NonNegativeInt = 1  # on another endpoint, before the first byte only
    # Connections per engine host (host:port), for generation calls (and as many for the rest). Above an
    # engine's default batch of 256 and the one request more that berth lets in beyond a batch size it
    # learned from the engine's gauges (cap = seats + 1).
    pool_per_host: PositiveInt = 512
    # Connections overall, for generation calls (and as many for the rest). At least the fleet's seats
    # (the sum of its endpoints' caps): a request beyond it waits for a connection and gets 503
    # upstream_pool_exhausted after connect_timeout_s; startup and reload warn when the seats exceed it.
    pool_total: PositiveInt = 1024


class ScrapeConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[scrape] (reloadable)."""

    interval_s: PositiveFloat = 2.0
    timeout_s: PositiveFloat = 2.0  # one scrape (health or /metrics) of one endpoint
    unhealthy_after: PositiveInt = 3  # consecutive failed scrapes / health checks
    stale_after_s: PositiveFloat = 10.0
    models_refresh_s: PositiveFloat = 30.0


class PerfPriorConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[telemetry.prior]: performance-model coefficients used until an endpoint has enough data to fit
    its own (see gateway.telemetry.perfmodel); an omitted one keeps the built-in prior's value."""

    k1: NonNegativeFloat | None = None  # prefill seconds per prompt token
    c1: NonNegativeFloat | None = None  # prefill seconds per iteration
    k2: NonNegativeFloat | None = None  # decode seconds per (context token x running request)
    c2: NonNegativeFloat | None = None  # decode seconds per running request
    c3: NonNegativeFloat | None = None  # decode seconds per iteration
    h: NonNegativeFloat | None = None  # KV tokens per context token
    j: NonNegativeFloat | None = None  # KV tokens per request on top of its context
    thr1: NonNegativeFloat | None = None  # per-request decode tokens/s alone
    alpha: NonNegativeFloat | None = None  # throughput decay with concurrency
    beta: NonNegativeFloat | None = None  # the throughput curve's exponent of its decay with concurrency


class TelemetryConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[telemetry] (reloadable): measured latencies, fitted performance models, predictors."""

    refresh_interval_s: PositiveFloat = 1.0  # fold finished requests in, hand estimates to the scheduler
    refit_interval_s: PositiveFloat = 5.0  # refit the performance models (in the background)
    min_observations: PositiveInt = 20  # per model part, between refits once it has its own fit
    # A part still on the prior is fitted as soon as it has first_fit_min_observations (at least 3: the
    # decode model has three unknowns) and re-checked every first_fit_interval_s until it has a fit: the
    # prior is another machine's, and a few observations of this one predict it better.
    first_fit_min_observations: Annotated[int, Meta(ge=3)] = 5
    first_fit_interval_s: PositiveFloat = 1.0
    fit_window: PositiveInt = 2000  # observations kept per model part
    kv_capacity_tokens: PositiveInt | None = None  # for engines that do not export it
    disagreement_tolerance: Annotated[float, Meta(gt=1)] = 2.0  # engine vs gateway latency ratio
    # A request's prompt tokens: "estimate" (characters per token, calibrated per model from the
    # engines' usage) or "tokenize" (asked of a ready endpoint's tokenize route before admission,
    # the estimate when that fails or takes longer than tokenize_timeout_s).
    prompt_tokens: Literal["estimate", "tokenize"] = "estimate"
    # Added to a request's wait at most; bounded so that milliseconds written as seconds are caught.
    tokenize_timeout_s: Annotated[float, Meta(gt=0, le=5)] = 0.05
    prior: PerfPriorConfig = PerfPriorConfig()


class PrefixConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[prefix]: the prefix index (which prompt blocks each endpoint holds in its KV cache), fleet-wide."""

    # "auto": an endpoint's KV events when it publishes them, else what berth sent there; "approximate":
    # what berth sent where, always; "precise": KV events (an endpoint without live events falls back to
    # the approximate source, visibly); "off": no index (prefill is predicted on the whole prompt).
    source: Literal["auto", "approximate", "precise", "off"] = "auto"
    block_tokens: Annotated[int, Meta(ge=1, le=4096)] = 16  # tokens per block of the approximate index
    # Tokens each endpoint's approximate index holds when its engine does not export its KV capacity
    # (vLLM's cache_config_info, SGLang's max total tokens); unset: 32,768 blocks.
    index_tokens: PositiveInt | None = None


class AuthConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[auth] (reloadable): who may use the OpenAI routes."""

    # true: a request without a key of a tenant (Authorization: Bearer KEY, or api-key: KEY) gets 401.
    required: bool = False
    # A TOML file of `[[keys]]` (tenant, sha256) kept apart from gateway.toml, re-read on every reload;
    # relative paths resolve against the directory of gateway.toml.
    keys_file: str = ""
    # A request whose x-berth-slo-class is outside its tenant's allowed_classes: served in the tenant's
    # default class ("downgrade"), or refused with 403 slo_class_not_allowed ("reject").
    class_not_allowed: Literal["downgrade", "reject"] = "downgrade"


class OpsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[ops] (static): where /metrics and /admin/* are served."""

    # HOST:PORT of a second listener for /metrics, /healthz, /readyz and /admin/*; with it set, /metrics
    # and /admin/* leave the public listener (/healthz and /readyz stay there too, for load balancers).
    # Empty: everything on server.listen.
    listen: str = ""
    # /metrics asks for the admin token too (Authorization: Bearer <admin token>), like /admin/*.
    require_admin_token_for_metrics: bool = False
    # Seconds between two samples of the event-loop lag monitor (berth_event_loop_lag_seconds,
    # GET /admin/loop-lag). 0.1 is plenty for an alert; a benchmark that reads a p99 over a short window
    # samples more often (0.01: 100 a second, each a timer of a few µs).
    loop_lag_interval_s: Annotated[float, Meta(ge=0.001, le=60.0)] = LAG_INTERVAL_S

    @property
    def host_port(self) -> tuple[str, int]:
        """`listen` split for aiohttp; assumes it was validated and is not empty."""
        return split_host_port(self.listen)


class BatchConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[batch] (static): the OpenAI Files and Batches API (docs/batch.md)."""

    # Where batches and their files live (a SQLite database and a files/ directory); relative paths
    # resolve against the directory of gateway.toml. Empty: $STATE_DIRECTORY/batch under systemd, else
    # ./berth-state/batch (created on first use). `berth serve --batch-dir DIR` overrides it.
    dir: str = ""
    # Batch lines in the gateway (its queue or an engine) at once, over all batches; the rest wait in the
    # store and are fed as these finish.
    max_lines_in_flight: PositiveInt = 64
    max_file_bytes: PositiveInt = 200 * 1024 * 1024  # an upload past it gets 413
    max_lines: Annotated[int, Meta(ge=1, le=1_000_000)] = 50_000  # requests in one batch
    file_expiry_s: Annotated[int, Meta(ge=3600)] = 30 * 86400  # of batch files without expires_after
    # The longest completion_window accepted (OpenAI's is 24h; berth also takes "90m", "2d", ...).
    max_window_s: Annotated[float, Meta(gt=0, le=365 * 86400)] = 30 * 86400.0
    # The SLO class batch lines run in; empty: the policy's first class of kind "batch", else its default.
    slo_class: str = ""
    retry_s: PositiveFloat = 1.0  # before a line the gateway had no room for is tried again


def split_host_port(listen: str) -> tuple[str, int]:
    """A validated HOST:PORT split for aiohttp (brackets of an IPv6 host removed)."""
    host, _, port = listen.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One [[keys]] item of the auth keys file: the SHA-256 of a key and the tenant it belongs to."""

    tenant: str
    sha256: str

    def __repr__(self) -> str:
        return f"KeyEntry(tenant={self.tenant!r}, sha256=<hidden>)"


class KeysFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The auth keys file ([auth] keys_file) exactly as written."""

    keys: tuple[KeyEntry, ...] = ()


class EngineKey(Secret):
    """An engine's API key, read from the environment or a file; its repr and str hide it."""

    __slots__ = ()


class PolicySection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[policy]: which policy file to run; empty means the packaged default policy."""

    file: str = ""  # relative paths resolve against the directory of gateway.toml


class EndpointConfig(
    msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, rename={"instance_class": "class"}
):
    """One [[endpoints]] item, or one --endpoint flag."""

    url: str  # the engine's base URL (http:// or https://), without /v1
    id: str | None = None  # default: "host:port" of the url
    engine: EngineKind | None = None  # None: "auto", detect from the engine's /metrics names
    models: tuple[str, ...] = ()  # empty: discover from the engine's /v1/models
    instance_class: InstanceClass = InstanceClass.MIXED  # key `class`: which traffic it prefers (Chiron)
    node: str | None = None  # the GPU machine it runs on ([[nodes]] name), for co-location and eviction
    cap: PositiveInt | None = None  # None: the engine's batch size (limits.default_endpoint_cap until known)
    # "priority": the engine runs priority scheduling (vLLM --scheduling-policy priority), so berth
    # sends each request's priority; an FCFS vLLM rejects a request that carries one.
    scheduling: Literal["fcfs", "priority"] = "fcfs"
    # The engine's API key (sent as Authorization: Bearer on every call): the name of an environment
    # variable holding it, or a file holding it (mode 0600 or stricter). Never the key itself.
    api_key_env: str | None = None
    api_key_file: str | None = None  # relative paths resolve against the directory of gateway.toml
    # The engine's max batch (vLLM --max-num-seqs, SGLang --max-running-requests) and the name of its
    # instance configuration (models.toml [[models.configs]]): the `sub-cluster` filter sends requests
    # with tight deadlines to small batches; an unset cap is at most the max batch (berth holds the rest).
    max_batch: PositiveInt | None = None
    config: str | None = None  # its instance configuration's name (models.toml [[models.configs]])
    # The engine's KV-event publisher (vLLM/SGLang `--kv-events-config` "endpoint" as berth reaches it,
    # "tcp://HOST:PORT"): the precise prefix source for this endpoint (docs/kv-events.md).
    kv_events: str | None = None
    kv_events_replay: str | None = None  # the engine's "replay_endpoint"; none: a gap drops and rebuilds
    kv_events_topic: str = ""  # the engine's "topic"

    @property
    def endpoint_id(self) -> EndpointId:
        return EndpointId(self.id if self.id is not None else default_endpoint_id(self.url))

    @property
    def engine_auto(self) -> bool:
        """The engine kind is to be detected from the endpoint's /metrics."""
        return self.engine is None

    def spec(self, *, default_cap: int, detected: EngineKind | None = None) -> EndpointSpec:
        """The scheduler's view; an "auto" engine is `detected`, else provisionally vLLM."""
        return EndpointSpec(
            id=self.endpoint_id,
            url=self.url.rstrip("/"),
            engine=self.engine or detected or EngineKind.VLLM,
            models=frozenset(ModelName(m) for m in self.models),
            instance_class=self.instance_class,
            cap=self.cap,
            default_cap=default_cap,
            node=self.node,
            priority_scheduling=self.scheduling == "priority",
            max_batch=self.max_batch,
            config=self.config,
            kv_events=self.kv_events,
            kv_events_replay=self.kv_events_replay,
            kv_events_topic=self.kv_events_topic,
        )


def default_endpoint_id(url: str) -> str:
    """`host:port` of `url` (the scheme's default port when it names none)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return f"{host}:{port}"


class TenantConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One [[tenants]] item (reloadable): who an API key belongs to, that tenant's SLO defaults, the
    classes it may use and its limits.

    A request's `Authorization: Bearer KEY` (or `api-key: KEY`) picks the tenant; its class and targets
    apply where the request's own x-berth-* headers say nothing. Keys are never logged (this struct's
    repr hides them). Keys may also come from [auth] keys_file.
    """

    name: str  # the tenant's name (metrics and logs; never its keys)
    api_keys: tuple[str, ...] = ()  # the keys themselves (prefer api_key_sha256 in files)
    api_key_sha256: tuple[str, ...] = ()  # hex SHA-256 of each key
    slo_class: str | None = None  # default: the policy's rules, then its default class
    ttft_ms: Annotated[float, Meta(gt=0, le=1e9)] | None = None  # overrides the class's TTFT target
    itl_ms: Annotated[float, Meta(gt=0, le=1e9)] | None = None  # overrides the class's ITL target
    deadline_ms: Annotated[float, Meta(gt=0, le=1e9)] | None = None  # overrides the class's deadline
    # The SLO classes this tenant may ask for (empty: any). The tenant's default class is slo_class,
    # else the first of these.
    allowed_classes: tuple[str, ...] = ()
    requests_per_s: Annotated[float, Meta(gt=0, le=1e6)] | None = None  # burst: one second's worth, >= 1
    tokens_per_min: Annotated[int, Meta(ge=1, le=10**12)] | None = None  # prompt + completion tokens
    max_concurrency: PositiveInt | None = None  # requests in flight at once

    def __repr__(self) -> str:
        keys = len(self.api_keys) + len(self.api_key_sha256)
        return f"TenantConfig(name={self.name!r}, keys=<{keys} hidden>, slo_class={self.slo_class!r})"


class GatewayFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """gateway.toml exactly as written (after the loader maps `engine = "auto"` to None)."""

    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    scrape: ScrapeConfig = ScrapeConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    prefix: PrefixConfig = PrefixConfig()
    policy: PolicySection = PolicySection()
    auth: AuthConfig = AuthConfig()
    ops: OpsConfig = OpsConfig()
    batch: BatchConfig = BatchConfig()
    aliases: dict[str, str] = {}  # client model name -> engine served name
    endpoints: tuple[EndpointConfig, ...] = ()
    tenants: tuple[TenantConfig, ...] = ()
    lifecycle: LifecycleConfig | None = None
    nodes: tuple[NodeConfig, ...] = ()
    cluster: ClusterConfig | None = None


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The gateway's configuration after defaults, checks and command-line overrides."""

    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    scrape: ScrapeConfig = ScrapeConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    prefix: PrefixConfig = PrefixConfig()
    aliases: dict[str, str] = {}  # client model name -> engine served name
    endpoints: tuple[EndpointConfig, ...] = ()
    tenants: tuple[TenantConfig, ...] = ()
    auth: AuthConfig = AuthConfig()
    ops: OpsConfig = OpsConfig()
    batch: BatchConfig = BatchConfig()
    batch_dir: Path | None = None  # [batch] dir made absolute (or --batch-dir); None: the default
    keys: tuple[KeyEntry, ...] = ()  # from auth.keys_file
    keys_file: Path | None = None  # absolute
    engine_keys: Mapping[EndpointId, EngineKey] = {}  # endpoints with api_key_env / api_key_file
    file: Path | None = None  # the gateway.toml it came from; None: built-in defaults and flags
    policy_file: Path | None = None  # absolute; None: the packaged default policy
    lifecycle: LifecycleSetup | None = None  # [lifecycle] + [[nodes]], checked (None: no node agents)
    cluster: ClusterSetup | None = None  # [cluster], checked (None: one gateway, nothing shared)

    def endpoint_specs(self, detected: Mapping[EndpointId, EngineKind] | None = None) -> list[EndpointSpec]:
        """The endpoints for the scheduler; `detected` supplies engine kinds found for "auto" ones."""
        found = detected or {}
        cap = self.limits.default_endpoint_cap
        return [e.spec(default_cap=cap, detected=found.get(e.endpoint_id)) for e in self.endpoints]

    def queue_limits(self) -> QueueLimits:
        return QueueLimits(
            max_queue_per_model=self.limits.max_queue_per_model,
            max_wait_s=self.limits.max_queue_wait_s,
            retry_after_s=self.limits.retry_after_s,
            stale_after_s=self.scrape.stale_after_s,
        )
