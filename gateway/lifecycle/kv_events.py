"""The precise prefix sources of the fleet: one KV-event subscriber and one store per endpoint that
names its engine's publisher (`kv_events = "tcp://HOST:PORT"`).

`sync` follows the endpoint set (a new or changed publisher gets a fresh store and subscriber, a
removed endpoint loses both); `on_health` passes the scrapers' verdict on (an unhealthy endpoint's
blocks are dropped, its source falls back). The prefix index asks `holder(endpoint)`: the store
while it is usable, None while it has fallen back (the approximate source answers then). Every
subscriber runs as a supervised task `kv-events:<endpoint>`. The metrics are read from the stores
when /metrics is rendered (`KvEventsCollector`); each state change also writes one log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.core.clock import Clock
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import EndpointHealth, EndpointId
from gateway.sched.types import EndpointSpec
from gateway.telemetry.prefix_index import PrefixIndex
from gateway.telemetry.prefix_precise import DEFAULT_MAX_BLOCKS, PreciseStatus, PreciseStore, SourceState
from gateway.telemetry.prefix_source import BlockHolder
from gateway.upstream.kv_events import KvEventsTarget, KvEventSubscriber


def target_of(spec: EndpointSpec) -> KvEventsTarget | None:
    if spec.kv_events is None:
        return None
    return KvEventsTarget(spec.kv_events, spec.kv_events_replay, spec.kv_events_topic)


class KvEventSources:
    def __init__(
        self,
        *,
        clock: Clock,
        supervisor: TaskSupervisor,
        context: Callable[[], zmq.asyncio.Context] = zmq.asyncio.Context.instance,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        index: PrefixIndex | None = None,
    ) -> None:
        self._index = index  # told which endpoints have a usable precise store, and their event lag
        self._clock = clock
        self._supervisor = supervisor
        self._context = context
        self._max_blocks = max_blocks
        self._stores: dict[EndpointId, PreciseStore] = {}
        self._subscribers: dict[EndpointId, KvEventSubscriber] = {}

    @staticmethod
    def task_name(eid: EndpointId) -> str:
        return f"kv-events:{eid}"

    def sync(self, specs: Sequence[EndpointSpec]) -> None:
        wanted = {s.id: t for s in specs if (t := target_of(s)) is not None}
        for eid, sub in list(self._subscribers.items()):
            if wanted.get(eid) != sub.target:
                self._supervisor.discard(self.task_name(eid))
                del self._subscribers[eid]
                del self._stores[eid]
                if self._index is not None:
                    self._index.attach(eid, None)
        for eid, target in wanted.items():
            if eid in self._subscribers:
                continue
            store = PreciseStore(eid, now=self._clock.now(), max_blocks=self._max_blocks)
            store.on_change = self._publish
            sub = KvEventSubscriber(eid, target, store, self._clock, context=self._context())
            self._stores[eid] = store
            self._subscribers[eid] = sub
            self._supervisor.spawn(self.task_name(eid), sub.run)

    def _publish(self, store: PreciseStore) -> None:
        """Attach a usable store to the prefix index (detach one that fell back) with its lag."""
        index = self._index
        if index is None:
            return
        eid = EndpointId(store.endpoint)
        usable = store.state.usable
        index.attach(eid, store if usable else None)
        if usable:
            index.set_lag(eid, store.lag_s)

    def on_health(self, eid: EndpointId, health: EndpointHealth) -> None:
        store = self._stores.get(eid)
        if store is not None:
            store.health(health is EndpointHealth.READY, self._clock.now())

    def holder(self, eid: EndpointId) -> BlockHolder | None:
        """The endpoint's precise blocks while its source is usable; None: use the approximate source."""
        store = self._stores.get(eid)
        return store if store is not None and store.state.usable else None

    def store(self, eid: EndpointId) -> PreciseStore | None:
        return self._stores.get(eid)

    def statuses(self) -> dict[EndpointId, PreciseStatus]:
        now = self._clock.now()
        return {eid: store.status(now) for eid, store in self._stores.items()}

    def decode_errors(self) -> dict[EndpointId, int]:
        return {eid: sub.decode_errors for eid, sub in self._subscribers.items()}


_COUNTERS: Final = (
    ("batches", "berth_kv_events_batches", "KV-event batches applied"),
    ("events", "berth_kv_events_events", "KV events received in applied batches"),
    ("gaps", "berth_kv_events_gaps", "sequence gaps seen"),
    ("replays", "berth_kv_events_replays", "replays asked of the engine to fill a gap"),
    ("rebuilds", "berth_kv_events_rebuilds", "drops after a gap the replay could not fill"),
    (
        "clears",
        "berth_kv_events_clears",
        "drops of every block (AllBlocksCleared, restart, disconnect, unhealthy)",
    ),
    ("orphans", "berth_kv_events_orphan_blocks", "blocks not kept: their parent is unknown"),
    (
        "skipped",
        "berth_kv_events_skipped_blocks",
        "blocks not kept: another medium, not plain, other block size",
    ),
    ("unknown", "berth_kv_events_unknown_events", "events of unknown kinds"),
    ("evicted", "berth_kv_events_evicted_blocks", "blocks forgotten at the memory bound"),
)


class KvEventsCollector:
    """| family | labels | meaning |
    | --- | --- | --- |
    | berth_kv_events_source_state | endpoint, state | 1 for the source's state (`SourceState`) |
    | berth_kv_events_blocks | endpoint | blocks the engine holds as its events tell |
    | berth_kv_events_lag_seconds | endpoint | arrival time minus the engine's time of the last batch |
    | berth_kv_events_last_seq | endpoint | sequence number of the last batch applied |
    | berth_kv_events_<thing>_total | endpoint | the counters of `_COUNTERS`, and decode errors |
    """

    def __init__(
        self,
        statuses: Callable[[], Mapping[EndpointId, PreciseStatus]],
        errors: Callable[[], Mapping[EndpointId, int]],
    ) -> None:
        self._statuses = statuses
        self._errors = errors

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        statuses = self._statuses()
        state = GaugeMetricFamily(
            "berth_kv_events_source_state",
            "1 for the precise prefix source's current state",
            labels=["endpoint", "state"],
        )
        blocks = GaugeMetricFamily(
            "berth_kv_events_blocks", "Blocks the engine holds as its KV events tell", labels=["endpoint"]
        )
        lag = GaugeMetricFamily(
            "berth_kv_events_lag_seconds",
            "Arrival time minus the engine's own time of the last KV-event batch",
            labels=["endpoint"],
        )
        last = GaugeMetricFamily(
            "berth_kv_events_last_seq",
            "Sequence number of the last KV-event batch applied",
            labels=["endpoint"],
        )
        counters = {
            field: CounterMetricFamily(name, help_, labels=["endpoint"]) for field, name, help_ in _COUNTERS
        }
        for eid, st in statuses.items():
            for s in SourceState:
                state.add_metric([eid, s.value], 1.0 if st.state is s else 0.0)
            blocks.add_metric([eid], st.blocks)
            if st.lag_s is not None:
                lag.add_metric([eid], st.lag_s)
            if st.last_seq is not None:
                last.add_metric([eid], st.last_seq)
            for field, family in counters.items():
                family.add_metric([eid], getattr(st, field))
        errors = CounterMetricFamily(
            "berth_kv_events_decode_errors", "KV-event batches that did not decode", labels=["endpoint"]
        )
        for eid, n in self._errors().items():
            errors.add_metric([eid], n)
        yield from (state, blocks, lag, last, *counters.values(), errors)
