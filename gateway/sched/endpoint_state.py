"""One endpoint's runtime state as the fleet (`gateway.sched.fleet.Fleet`) holds it, and the view of it
plugins see, kept until the endpoint changes or its gauges go stale (`EndpointState`); `KeptViews` is
the fleet's tuple of every endpoint's view with the entries out of date (`dirty`). Whoever changes an
endpoint's state calls `changed()`, which puts it on that list. Sans-IO."""

from __future__ import annotations

import math
from typing import Final

from gateway.core.types import EndpointHealth, EngineGauges, ModelName, RequestId
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetColumns
from gateway.sched.types import NO_PEER_LOAD, EndpointSpec


class KeptViews:
    """The tuple of every endpoint's view, kept until one's gauges go stale; an endpoint that changed
    has its own entry replaced (`dirty`), so a dispatch on a large fleet does not walk every endpoint."""

    __slots__ = ("columns", "columns_changed", "dirty", "endpoints", "fresh_until", "replaced")

    def __init__(self) -> None:
        self.endpoints: tuple[EndpointView, ...] | None = None  # None: remade whole on next use
        self.fresh_until = math.inf  # clock time when the first kept view's gauges go stale (or earlier)
        self.dirty: list[EndpointState] = []  # endpoints whose entry in `endpoints` is out of date
        # The columns last made (`Fleet.columns`), and the indexes whose entries were replaced in
        # `endpoints` since (None: the tuple was remade whole).
        self.columns: FleetColumns | None = None
        self.columns_changed: set[int] | None = None
        # The indexes whose entries were replaced since the scheduler's memo of the views was last made
        # (`Fleet.replaced`; None: the tuple was remade whole since, or it was never asked).
        self.replaced: set[int] | None = None


# Rebuild the views this long before a gauge's exact staleness time: the exact test is `now - scraped_at
# > stale_after_s`, and `scraped_at + stale_after_s` may round differently.
STALE_MARGIN_S: Final = 1e-6


class EndpointState:
    """The runtime state of one endpoint. Whoever changes a field calls `changed()` (the view is kept)."""

    __slots__ = (
        "_fleet",
        "_view",
        "_view_has_gauges",
        "cap",
        "completed_since_scrape",
        "cut_at",
        "dispatched_since_scrape",
        "estimates",
        "fresh_until",
        "gap_after_cut_s",
        "gap_after_cut_tokens",
        "gap_s",
        "gap_tokens",
        "gauges",
        "health",
        "index",
        "inflight",
        "models",
        "peer",
        "peer_running",
        "running",
        "running_output_tokens",
        "running_prompt_tokens",
        "scraped_at",
        "seats",
        "spec",
        "streamed_tokens",
    )

    def __init__(self, spec: EndpointSpec, fleet: KeptViews) -> None:
        self._fleet = fleet
        self.spec = spec
        # The engine's batch size its gauges showed (`Fleet.observe_gauges`); None: not seen yet.
        self.seats: int | None = None
        self.cap = self.bound  # the cap in force (a ConcurrencyController moves it within the bound)
        self.streamed_tokens = 0
        self.gap_s = 0.0
        self.gap_tokens = 0
        # When the cap in force was last lowered, and the gaps (as gap_s/gap_tokens) that began after it.
        self.cut_at = -math.inf
        self.gap_after_cut_s = 0.0
        self.gap_after_cut_tokens = 0
        self.models: frozenset[ModelName] = spec.models
        self.health = EndpointHealth.STARTING
        self.inflight = 0
        self.peer = NO_PEER_LOAD  # the other replicas' load here (cluster mode), added in the view
        self.peer_running: tuple[RunningRequest, ...] = ()  # ... as stand-in running requests
        self.gauges: EngineGauges | None = None
        self.scraped_at: float | None = None
        self.dispatched_since_scrape = 0
        self.completed_since_scrape = 0
        self.running_prompt_tokens = 0
        self.running_output_tokens = 0.0
        self.estimates: EndpointEstimates | None = None
        self.running: dict[RequestId, RunningRequest] = {}  # what the gateway runs here, by dispatch
        self._view: EndpointView | None = None
        self.index = 0  # its place in the fleet's tuple of views (set by `Fleet.sync`)
        self._view_has_gauges = False
        self.fresh_until = math.inf  # when the kept view's gauges go stale (inf: it shows none)

    @property
    def bound(self) -> int:
        """The hard maximum of the cap: the operator's, else the max batch its instance configuration
        gives the engine (berth holds what the engine would only queue), else one more than the engine's
        batch size seen in its gauges (`Fleet._learn_seats`), else the default cap."""
        s = self.spec
        if s.cap is not None:
            return s.cap
        if s.max_batch is not None:
            return s.max_batch
        return s.default_cap if self.seats is None else self.seats + 1

    def changed(self) -> None:
        if self._view is not None:  # else it is in the fleet's dirty list already, or never was viewed
            self._view = None
            self._fleet.dirty.append(self)

    def view(self, now: float, stale_after_s: float) -> EndpointView:
        """The view as of `now`: the kept one unless the endpoint changed or its gauges went stale."""
        v = self._view
        if v is not None and not (self._view_has_gauges and self._stale(now, stale_after_s)):
            return v
        scraped_at = self.scraped_at
        g = None if scraped_at is None or now - scraped_at > stale_after_s else self.gauges  # `_stale`
        s = self.spec
        peer = self.peer
        # Positional, in field order: a call with 29 keywords spends about 1 µs matching them to the
        # parameters, and a view is remade on every dispatch and completion.
        v = self._view = EndpointView(
            s.id,
            s.url,
            s.engine,
            self.models,
            s.instance_class,
            self.health,
            self.cap,
            self.inflight + peer.inflight,
            None if g is None else g.running,  # engine_running
            None if g is None else g.waiting,  # engine_waiting
            None if g is None else g.kv_usage,  # kv_usage
            self.dispatched_since_scrape,
            scraped_at,
            s.node,
            self.completed_since_scrape,
            self.running_prompt_tokens + peer.prompt_tokens,
            self.running_output_tokens + peer.output_tokens,
            self.estimates,
            tuple(self.running.values()) + self.peer_running
            if self.peer_running
            else tuple(self.running.values()),
            s.priority_scheduling,
            self.bound,  # max_cap
            self.streamed_tokens,
            self.gap_s,
            self.gap_tokens,
            self.cut_at,
            self.gap_after_cut_s,
            self.gap_after_cut_tokens,
            s.max_batch,
            s.config,
        )
        self._view_has_gauges = g is not None
        self.fresh_until = math.inf if scraped_at is None or g is None else scraped_at + stale_after_s
        return v

    def _stale(self, now: float, stale_after_s: float) -> bool:
        return self.scraped_at is None or now - self.scraped_at > stale_after_s
