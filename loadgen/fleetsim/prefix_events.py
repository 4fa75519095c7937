"""The *precise* source of the prefix index in the fleet simulator: each simulated engine's KV events
(`BlockStored` / `BlockRemoved` / `AllBlocksCleared`, as `--kv-events` publishes them) fed into the
gateway's own event store (`gateway.telemetry.prefix_precise.PreciseStore`), the same code a live
subscriber feeds. What it knows is what the oracle knows (`prefix_oracle`), as late as the events
arrive: the engine's batches are handed in when the gateway next asks (a request arrives), so the lag
is the time since the engine step that stored or evicted a block, not a transport's.

The store re-keys every block by berth's chain over its token ids, so a request is matched by its token
ids (`EventFeed.token_ids`, the `SimGateway.token_ids` hook).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.core.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, KvBatch, KvEvent
from gateway.core.types import ApiKind, EndpointId
from gateway.telemetry.prefix_index import PrefixIndex
from gateway.telemetry.prefix_precise import PreciseStore
from loadgen.engine_sim import prefix_cache as sim
from loadgen.engine_sim.protocol import prompt_token_ids


def gateway_event(ev: sim.KVEvent) -> KvEvent:
    """The engine simulator's event as the gateway's decoder would hand it over."""
    if isinstance(ev, sim.BlockStored):
        return BlockStored(tuple(ev.block_hashes), ev.parent_block_hash, tuple(ev.token_ids), ev.block_size)
    if isinstance(ev, sim.BlockRemoved):
        return BlockRemoved(tuple(ev.block_hashes))
    return AllBlocksCleared()


class EventFeed:
    """The engines' caches, recording their events, and one `PreciseStore` per engine attached to the
    prefix index; `pump` hands each engine's new events to its store as one batch."""

    def __init__(self, index: PrefixIndex) -> None:
        self._index = index
        self._feeds: dict[EndpointId, tuple[sim.PrefixCache, PreciseStore]] = {}
        self._seq: dict[EndpointId, int] = {}

    def attach(self, eid: EndpointId, engine: object, now: float) -> bool:
        """Record `engine`'s KV events and answer the index for `eid` from them; False without a cache."""
        cache = getattr(engine, "prefix_cache", None)
        if not isinstance(cache, sim.PrefixCache):
            return False
        if cache.events is None:
            cache.events = []
        store = PreciseStore(str(eid), now=now, rebuild_s=0.0, block_tokens=cache.block_size)
        store.connected(now)
        self._feeds[eid] = (cache, store)
        self._seq[eid] = 0
        self._index.attach(eid, store)
        return True

    def detach(self, eid: EndpointId) -> None:
        """Stop feeding `eid`'s store (its engine was removed): the index answers for it from the
        approximate source until it forgets the endpoint."""
        self._seq.pop(eid, None)
        if self._feeds.pop(eid, None) is not None:
            self._index.attach(eid, None)

    def attached(self) -> frozenset[EndpointId]:
        """The endpoints whose engines' events are fed."""
        return frozenset(self._feeds)

    def pump(self, now: float) -> None:
        """Every engine's events since the last pump, applied (stamped now: the lag is the pump's)."""
        for eid, (cache, store) in self._feeds.items():
            events = cache.take_events()
            if not events:
                continue
            seq = self._seq[eid]
            self._seq[eid] = seq + 1
            store.on_live(seq, KvBatch(now, tuple(map(gateway_event, events))), now, now)

    def token_ids(self, api: ApiKind, body: Mapping[str, Any]) -> Sequence[int] | None:
        """The ids the simulated engines give the body (the store's keys are chains over them)."""
        ids = prompt_token_ids("chat" if api == ApiKind.CHAT else "completion", dict(body))
        return None if ids is None else ids.tolist()
