"""berth's side of the simulation: the components the daemon builds, built by the same config code and
called the way the daemon calls them, without sockets or an event loop.

- configuration: `gateway.toml` (when given) through `load_gateway_config`, the policy file through
  `load_policy`, each simulated endpoint as an `[[endpoints]]` item (`EndpointConfig.spec`);
- the request path of the front's `admit` phase: body validation (`parse_body`), model resolution,
  SLO resolution with task clocks (`SloAdmission`), the scheduler's request (`to_sched_request`, with the
  live token estimator and output-length predictor);
- the scheduler (`Scheduler`) and the live telemetry service (`LiveTelemetry`), whose refresh and refit
  the simulation calls at the configured intervals of virtual time;
- the prefix index (`[prefix]`, or the run's `prefix` option): its approximate source told what was
  dispatched where, as the dispatcher tells it; with `prefix = "oracle"`, the engines' true caches
  instead (`loadgen.fleetsim.prefix_oracle`);
- the finish phase's bookkeeping (`finished_record` to telemetry, `SloAdmission.on_finish`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Final

import msgspec

from gateway.admission.models import ModelCatalog
from gateway.admission.state import SloAdmission
from gateway.config import GatewayConfig, default_config, load_gateway_config, load_policy
from gateway.config.policy import load_default_policy
from gateway.config.schema import EndpointConfig, PrefixConfig
from gateway.core.types import ApiKind, EndpointHealth, EndpointId, EngineGauges, EngineKind
from gateway.dispatch.context import RequestContext
from gateway.front.api import learn, resolve_slo, scheduler_request
from gateway.front.schemas import parse_body
from gateway.sched.plugins import default_registry
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec
from gateway.telemetry.live import LiveTelemetry
from loadgen.engine_sim.spec import EndpointSpec as EngineSpec
from loadgen.fleetsim.clock import VirtualClock
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.prefix_events import EventFeed
from loadgen.fleetsim.prefix_oracle import KeyBridge, OracleHolder, ViewHolder, cache_view, true_cache


def endpoint_ids(fleet: Sequence[EngineSpec]) -> list[str]:
    """berth's id of each simulated endpoint: its `id` key, else `e000`, `e001`, ... by position."""
    ids = [s.id if s.id is not None else f"e{i:03d}" for i, s in enumerate(fleet)]
    if len(set(ids)) != len(ids):
        raise ValueError("the fleet names an endpoint id twice")
    return ids


def endpoint_config(eid: str, spec: EngineSpec) -> EndpointConfig:
    """The `[[endpoints]]` item an operator would write for this endpoint (models are discovered)."""
    return EndpointConfig(
        url=f"http://{eid}.sim",
        id=eid,
        engine=EngineKind(spec.flavor),
        instance_class=spec.instance_class,  # type: ignore[arg-type]  # msgspec converts on decode
        node=spec.node,
        cap=spec.cap,
        scheduling=spec.scheduling_policy,
        config=spec.config,
        max_batch=None if spec.config is None else spec.resolve().engine.max_num_seqs,
    )


class SimGateway:
    def __init__(self, opts: SimOptions, clock: VirtualClock) -> None:
        registry = default_registry()
        self.cfg: GatewayConfig = (
            default_config() if opts.gateway is None else load_gateway_config(opts.gateway)
        )
        self.policy = (
            load_default_policy(registry, seed=opts.seed)
            if opts.policy is None
            else load_policy(opts.policy, registry, seed=opts.seed)
        )
        self.clock = clock
        self.scheduler = Scheduler(self.policy, clock, self.cfg.queue_limits())
        self.telemetry = LiveTelemetry(
            self.scheduler, clock, self.cfg.telemetry, prefix=self.prefix_config(opts)
        )
        # The token ids the simulation gives its engines for a request body (None: not known), so that a
        # source keyed by token ids (the oracle, `loadgen.fleetsim.prefix_oracle`) can match it.
        self.token_ids: Callable[[ApiKind, Mapping[str, Any]], Sequence[int] | None] | None = None
        self._bridge: KeyBridge | None = None  # the oracle over the engine simulator's cache views
        self._feed: EventFeed | None = None  # the precise source: the engines' KV events
        self.slo = SloAdmission()
        self.catalog = ModelCatalog(self.cfg.aliases)
        self.ids = [EndpointId(e) for e in endpoint_ids(opts.fleet)]
        cap = self.cfg.limits.default_endpoint_cap
        self.specs: list[EndpointSpec] = [
            endpoint_config(eid, s).spec(default_cap=cap) for eid, s in zip(self.ids, opts.fleet, strict=True)
        ]
        self.scheduler.sync_endpoints(self.specs)

    def prefix_config(self, opts: SimOptions) -> PrefixConfig:
        """[prefix] of the gateway file, its source overridden by the run's option (`prefix`: "oracle"
        reads the engines' true caches where they have one, the approximate index elsewhere)."""
        cfg = self.cfg.prefix
        if opts.prefix is None:
            return cfg
        source = "auto" if opts.prefix == "oracle" else opts.prefix
        return msgspec.structs.replace(cfg, source=source)

    def attach_oracle(self, eid: EndpointId, engine: object) -> bool:
        """Give the prefix index the engine's true cache as `eid`'s source (the oracle); False when the
        engine has none."""
        cache = true_cache(engine)
        if cache is not None:
            self.telemetry.prefix.attach(eid, OracleHolder(cache))
            return True
        view = cache_view(engine)
        if view is None:
            return False
        if self._bridge is None:  # the engine simulator's own keys: learned from the token ids
            self._bridge = KeyBridge()
            self.token_ids = self._bridge.token_ids
        self.telemetry.prefix.attach(eid, ViewHolder(view, self._bridge))
        return True

    def attach_events(self, eid: EndpointId, engine: object) -> bool:
        """Give the prefix index `eid`'s engine's KV events as its precise source (`prefix_events`);
        False when the engine has no prefix cache."""
        if self._feed is None:
            self._feed = EventFeed(self.telemetry.prefix)
            self.token_ids = self._feed.token_ids
        return self._feed.attach(eid, engine, self.clock.now())

    def detach_events(self, eid: EndpointId) -> None:
        """`eid`'s engine is gone: its KV events no longer feed the prefix index."""
        if self._feed is not None:
            self._feed.detach(eid)

    def dispatched(self, ctx: RequestContext, req: SchedRequest, eid: EndpointId) -> None:
        """What the dispatcher tells the prefix index when it sends `req` to `eid`."""
        ctx.cached_tokens = self.telemetry.prefix.dispatched(eid, ctx.prefix_keys, req.prompt_tokens)

    def bring_up(self, fleet: Sequence[EngineSpec]) -> None:
        """What the first scrape round tells the daemon: every endpoint ready, with its models."""
        for eid, spec in zip(self.ids, fleet, strict=True):
            self.scheduler.set_models(eid, spec.models)
            self.scheduler.set_health(eid, EndpointHealth.READY)

    def listed_models(self) -> list[str]:
        """What a client sees at /v1/models."""
        listing = self.catalog.listing(self.scheduler.models(ready_only=True), 0)
        return [str(m["id"]) for m in listing["data"]]

    def admit(
        self, ctx: RequestContext, api: ApiKind, body: bytes, headers: Sequence[tuple[str, str]]
    ) -> SchedRequest:
        """The front's read -> parse -> admit phases for one request; raises the BerthError a client
        would get."""
        parsed = parse_body(api, body)
        ctx.client_model = parsed.model
        ctx.stream = parsed.stream
        resolved = resolve_slo(
            ctx,
            parsed,
            headers,
            None,
            catalog=self.catalog,
            known=self.scheduler.known_models(),
            state=self.slo,
            policy=self.policy.slo,
        )
        sreq = scheduler_request(ctx, parsed, resolved, ctx.id, self.telemetry)
        if self._feed is not None:  # the engines' events so far, before matching
            self._feed.pump(self.clock.now())
        keys = ctx.prefix_keys
        ids = None if keys is None or self.token_ids is None else self.token_ids(api, parsed.body)
        if keys is not None and ids is not None:  # matched again, now by token ids too
            keys.with_token_ids(ids)
            sreq = dataclasses.replace(sreq, cached=self.telemetry.prefix.lookup(keys, sreq.prompt_tokens))
        # The simulated client's stream survives an engine abort, so every request may be preempted and
        # resumed (the live front decides this per request).
        sreq = resumable(sreq)
        ctx.sched = sreq
        return sreq

    def finish(self, ctx: RequestContext) -> None:
        """The finish phase's bookkeeping (metrics and the log line have no reader here)."""
        ctx.finished_at = self.clock.now()
        learn(ctx, self.telemetry, self.slo)

    def scrape(
        self,
        eid: EndpointId,
        gauges: EngineGauges,
        kv_capacity_tokens: float,
        prefix_counters: tuple[float, float] | None = None,
    ) -> None:
        """One scrape of an endpoint: the scheduler's gauges and the telemetry's sample (and the
        engine's prefix-cache hit and query tokens, when it counts them)."""
        self.scheduler.observe_gauges(eid, gauges)
        self.telemetry.observe_engine(eid, gauges, kv_capacity_tokens=kv_capacity_tokens)
        if prefix_counters is not None:
            hits, queries = prefix_counters
            self.telemetry.prefix.observe_engine(eid, hits=hits, queries=queries)


#: `SchedRequest`'s fields in their order (every one an `__init__` argument), read in one call.
_FIELDS: Final = tuple(f.name for f in dataclasses.fields(SchedRequest))
_VALUES: Final = attrgetter(*_FIELDS)
_RESUMABLE: Final = _FIELDS.index("resumable")
assert all(f.init for f in dataclasses.fields(SchedRequest))


def resumable(sreq: SchedRequest) -> SchedRequest:
    """`dataclasses.replace(sreq, resumable=True)`, the same request, without `replace`'s walk over the
    fields by name (once per simulated request)."""
    values = list(_VALUES(sreq))
    values[_RESUMABLE] = True
    return SchedRequest(*values)
