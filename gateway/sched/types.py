"""What the scheduler is configured with: the endpoints it may place on and the bounds of its queues.

`gateway.config` builds these from gateway.toml (and --endpoint flags); the scheduler takes them through
`Scheduler.sync_endpoints` and `Scheduler.set_limits`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.types import EndpointId, EngineKind, InstanceClass, ModelName


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """An endpoint as configured (or given with --endpoint)."""

    id: EndpointId
    url: str
    engine: EngineKind
    models: frozenset[ModelName]  # empty: discover from the engine's /v1/models
    instance_class: InstanceClass = InstanceClass.MIXED
    # The operator's hard maximum of the endpoint's concurrency cap; None when the operator gave none:
    # the bound is then the engine's batch size as its gauges show it (`Fleet.observe_gauges`), and
    # `default_cap` until they have.
    cap: int | None = None
    node: str | None = None
    priority_scheduling: bool = False  # the engine orders by a request's priority (see EndpointView)
    max_batch: int | None = None  # the engine's max batch (--max-num-seqs); None: unknown
    config: str | None = None  # its instance configuration (models.toml [[models.configs]])
    default_cap: int = 64  # the bound while `cap` is None and the engine's batch size is not known
    # Where the engine publishes its KV events (ZMQ "tcp://HOST:PORT"), its replay socket and topic:
    # None when it does not (the scheduler never reads these; the KV-event subscribers do).
    kv_events: str | None = None
    kv_events_replay: str | None = None
    kv_events_topic: str = ""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    max_queue_per_model: int = 1024
    max_wait_s: float = 30.0
    retry_after_s: float = 1.0
    # Engine metrics older than this are stale: the gateway's own counts take over.
    stale_after_s: float = 10.0
