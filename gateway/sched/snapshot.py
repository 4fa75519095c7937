"""Immutable views of the fleet that plugins decide on."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.core.types import EndpointHealth, EndpointId, EngineKind, InstanceClass, ModelName


@dataclass(frozen=True, slots=True)
class EndpointView:
    id: EndpointId
    url: str
    engine: EngineKind
    models: frozenset[ModelName]
    instance_class: InstanceClass
    health: EndpointHealth
    cap: int  # the gateway's concurrency cap for this endpoint
    inflight: int  # requests the gateway has running there now
    # Engine-reported gauges from the last fresh scrape; None when never scraped or stale.
    engine_running: float | None = None
    engine_waiting: float | None = None
    kv_usage: float | None = None
    dispatched_since_scrape: int = 0
    scrape_age_s: float | None = None
    node: str | None = None

    @property
    def has_room(self) -> bool:
        return self.inflight < self.cap

    @property
    def fresh(self) -> bool:
        return self.engine_running is not None

    @property
    def outstanding(self) -> float:
        """Load for least-outstanding: the gateway's in-flight plus what waits inside the engine.

        `inflight` is exact and current (it already counts what was dispatched since the last scrape);
        the engine's waiting count adds traffic that reached the engine by other routes. Without fresh
        metrics the gateway's own count is all there is.
        """
        waiting = self.engine_waiting or 0.0
        return float(self.inflight) + waiting


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    now: float
    endpoints: tuple[EndpointView, ...]
    # Queue depth per model at the time of the snapshot (for plugins that weigh the backlog).
    queued: dict[ModelName, int] = field(default_factory=dict)

    def serving(self, model: ModelName) -> tuple[EndpointView, ...]:
        return tuple(e for e in self.endpoints if model in e.models)

    def get(self, endpoint_id: EndpointId) -> EndpointView | None:
        for e in self.endpoints:
            if e.id == endpoint_id:
                return e
        return None
