"""Immutable views of the fleet that plugins decide on."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gateway.core.frozen import frozen
from gateway.core.types import EndpointHealth, EndpointId, EngineKind, InstanceClass, ModelName
from gateway.sched.perf import PerfCoefficients
from gateway.sched.running import RunningRequest

if TYPE_CHECKING:
    from gateway.sched.serving import ReadyServing


@dataclass(frozen=True, slots=True)
class EndpointEstimates:
    """What telemetry measured and fitted for one endpoint, as plain numbers (None: not known yet).

    The live daemon hands in a new one every few seconds (`Scheduler.set_estimates`); the offline
    simulator and tests set it the same way.
    """

    perf: PerfCoefficients | None = None  # the fitted performance model (the prior until enough data)
    kv_capacity_tokens: float | None = None  # the engine's KV cache in tokens
    ttft_ewma_s: float | None = None  # dispatch to first token, measured by the gateway
    itl_ewma_s: float | None = None  # per-token time of a stream, measured by the gateway
    tokens_per_s: float | None = None  # output tokens per second the endpoint delivered recently


@frozen
class EndpointView:
    id: EndpointId
    url: str
    engine: EngineKind
    models: frozenset[ModelName]
    instance_class: InstanceClass
    health: EndpointHealth
    cap: int  # the gateway's concurrency cap in force for this endpoint (see `max_cap`)
    inflight: int  # requests the gateway has running there now
    # Engine-reported gauges from the last fresh scrape; None when never scraped or stale.
    engine_running: float | None = None
    engine_waiting: float | None = None
    kv_usage: float | None = None
    dispatched_since_scrape: int = 0
    # Clock time of the last scrape (None: never scraped): `snap.now - scraped_at` is its age. A time
    # rather than an age, so that a view stays true, and is kept, until its endpoint changes.
    scraped_at: float | None = None
    node: str | None = None
    # Requests the gateway saw finish there since the last scrape (see `corrected_running`).
    completed_since_scrape: int = 0
    # The gateway's running-context sums over the requests it runs there (Aladdin's Σ l_in and Σ l_out):
    # prompt tokens (estimated at admission) and predicted output tokens.
    running_prompt_tokens: int = 0
    running_output_tokens: float = 0.0
    estimates: EndpointEstimates | None = None
    # The requests the gateway runs there (gateway.sched.running), oldest dispatch first.
    running: tuple[RunningRequest, ...] = ()
    # The engine runs with priority scheduling (vLLM --scheduling-policy priority): the request's
    # engine priority may be sent (an FCFS vLLM rejects a request that carries one).
    priority_scheduling: bool = False
    # The operator's hard maximum of `cap` (the configured cap): a `ConcurrencyController` moves `cap`
    # below it; 0 means "the same as cap" (views built by hand in tests).
    max_cap: int = 0
    # Token counters from the dispatcher's progress reports (`Scheduler.progress`), cumulative since the
    # endpoint was added: output tokens streamed, and the inter-token time measured over `gap_tokens` of
    # them (the time between two reports of a stream over the tokens between them; the first token's
    # wait is not a gap). A controller differences two readings for the recent per-token time and rate.
    streamed_tokens: int = 0
    gap_s: float = 0.0
    gap_tokens: int = 0
    # When the cap in force was last lowered (-inf: never), and the gaps of `gap_s`/`gap_tokens` that
    # began after it: a stream reports every few tokens, so for a while after a cut its gaps still hold
    # time it spent in the larger batch (a controller that judges the cut must not count those).
    cut_at: float = -math.inf
    gap_after_cut_s: float = 0.0
    gap_after_cut_tokens: int = 0
    # The engine's max batch (vLLM --max-num-seqs, SGLang --max-running-requests; None: unknown) and
    # its instance configuration's name: what the `sub-cluster` filter maps requests by.
    max_batch: int | None = None
    config: str | None = None

    @property
    def hard_cap(self) -> int:
        """The operator's maximum of the cap (`max_cap`, or `cap` when unset)."""
        return self.max_cap or self.cap

    @property
    def perf(self) -> PerfCoefficients | None:
        return None if self.estimates is None else self.estimates.perf

    @property
    def kv_capacity_tokens(self) -> float | None:
        return None if self.estimates is None else self.estimates.kv_capacity_tokens

    @property
    def ttft_ewma_s(self) -> float | None:
        return None if self.estimates is None else self.estimates.ttft_ewma_s

    @property
    def itl_ewma_s(self) -> float | None:
        return None if self.estimates is None else self.estimates.itl_ewma_s

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.estimates is None else self.estimates.tokens_per_s

    @property
    def corrected_running(self) -> float:
        """Requests the engine holds now (running + waiting), best guess: its last fresh report corrected
        by what the gateway dispatched and saw finish there since, so a burst between two scrapes counts
        at once. Without fresh metrics, the gateway's own in-flight count."""
        if self.engine_running is None:
            return float(self.inflight)
        reported = self.engine_running + (self.engine_waiting or 0.0)
        return max(0.0, reported + self.dispatched_since_scrape - self.completed_since_scrape)

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


@dataclass(frozen=True, slots=True, eq=False)
class FleetColumns:
    """Per-endpoint numbers of one tuple of views (`endpoints`), as arrays in its order, for placement
    plugins with a columnar form (`gateway.sched.columns` builds and updates them). Never mutated: an
    update makes new arrays, so a snapshot's columns stay those of its views."""

    endpoints: tuple[EndpointView, ...]
    inflight: npt.NDArray[np.int64]
    cap: npt.NDArray[np.int64]
    ready: npt.NDArray[np.bool_]
    waiting: npt.NDArray[np.float64]  # engine waiting from fresh gauges (`engine_waiting or 0.0`)
    outstanding: npt.NDArray[np.float64]  # inflight + waiting (`EndpointView.outstanding`)
    id_rank: npt.NDArray[np.int64]  # each endpoint's place in the order of the endpoint ids
    members: Mapping[ModelName, npt.NDArray[np.bool_]]  # per model: which endpoints serve it
    # The requests running there (`len(running)`: an endpoint's load has nothing to derive without any)
    # and the seats they run in (`gateway.sched.predict.seats_of`).
    busy: npt.NDArray[np.int64]
    seats: npt.NDArray[np.int64]
    # Per instance class: which endpoints are of it.
    classes: Mapping[InstanceClass, npt.NDArray[np.bool_]]
    # Each endpoint's prefill and decode coefficients (its fitted model, else the prior, as predictions
    # take them), one row per endpoint: k1, c1, k2, c2, c3 (`PerfCoefficients`).
    coef: npt.NDArray[np.float64]
    index: Mapping[EndpointId, int]  # each endpoint's place in `endpoints`

    def eligible(self, model: ModelName) -> npt.NDArray[np.bool_]:
        """`gateway.sched.profile.eligible` as a mask: serves the model, ready, room under its cap."""
        serves = self.members.get(model)
        if serves is None:
            return np.zeros(len(self.endpoints), dtype=np.bool_)
        return serves & self.ready & (self.inflight < self.cap)


class ViewsMemo:
    """What plugins derive from one tuple of views alone (`endpoints`), kept for every snapshot of that
    tuple: the scheduler hands the same memo to the snapshots it takes while its views stay the same
    objects (`gateway.sched.serving`). A snapshot whose views are another tuple (one cut to part of the
    fleet) does not use it."""

    __slots__ = ("endpoints", "ready")

    def __init__(self, endpoints: tuple[EndpointView, ...]) -> None:
        self.endpoints = endpoints
        self.ready: dict[ModelName, ReadyServing] = {}  # per model (`gateway.sched.serving.ready_serving`)


@frozen
class FleetSnapshot:
    now: float
    endpoints: tuple[EndpointView, ...]
    # Queue depth per model at the time of the snapshot (for plugins that weigh the backlog).
    queued: dict[ModelName, int] = field(default_factory=dict)
    # The endpoints' numbers as arrays, when the scheduler's profile places over columns; they belong to
    # `endpoints` only while `columns.endpoints is endpoints` (a snapshot cut to part of the fleet keeps
    # them but is placed the plain way).
    columns: FleetColumns | None = field(default=None, compare=False)
    # What plugins derive from `endpoints` alone, shared by the snapshots of the same views (used only
    # while `memo.endpoints is endpoints`).
    memo: ViewsMemo | None = field(default=None, compare=False)

    def serving(self, model: ModelName) -> tuple[EndpointView, ...]:
        return tuple(e for e in self.endpoints if model in e.models)

    def get(self, endpoint_id: EndpointId) -> EndpointView | None:
        for e in self.endpoints:
            if e.id == endpoint_id:
                return e
        return None
