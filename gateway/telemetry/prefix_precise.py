"""The precise prefix source: one endpoint's cached blocks as its engine's KV events report them.

Sans-IO: the subscriber (`gateway.upstream.kv_events`) hands in what the wire said (a batch and its
sequence number, a replayed batch, the connection up or down, the endpoint's health) and does what
the store answers (replay from a sequence number, or rebuild); the store keeps the blocks and its
health, and answers the prefix index through `BlockHolder`.

Keys: every block an engine reports is re-keyed in berth's own key space (`core.blockhash.token_chain`
over its `token_ids`, chained to berth's key of its parent block), and the engine's hash is mapped to
that key so a later `BlockRemoved` finds it. A block whose parent berth does not hold (the store
joined after the parent was stored, or dropped it) cannot be keyed and is skipped (`orphans`), and so
are its descendants: the store only ever under-reports. Only blocks in GPU memory (medium "GPU" or
unspecified) are kept; blocks whose engine hash covers more than their tokens (LoRA, multimodal
inputs, cache salt) are skipped.

Sequence numbers: the publisher numbers its batches 0, 1, 2, ... A batch after a hole is a gap: the
store asks for a replay from the first missing number (state `replaying`); when the engine's replay
buffer no longer holds it (or no replay endpoint is configured), the store drops every block and
rebuilds from the events that follow (state `rebuilding` for `rebuild_s`, then `live`: meanwhile it
under-reports). A number lower than expected that no replay delivered means the engine's counter
began again (a restart): the store drops every block. `AllBlocksCleared`, a lost connection and an
unhealthy endpoint drop every block too; while the connection is down or the endpoint unhealthy the
store is `fallen_back` (the prefix index uses the approximate source for that endpoint).

Memory: at most `max_blocks` engine blocks are held; past it the oldest stored are forgotten first
(`evicted`). About 230 bytes per block on CPython 3.11 (an 8-byte engine hash, a tuple key and two
dict entries; see `tests/unit/test_prefix_precise.py::test_bytes_per_block`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from gateway.core.blockhash import ROOT, token_chain
from gateway.core.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, KvBatch

log = structlog.get_logger("berth.kv_events")

DEFAULT_MAX_BLOCKS: Final = 1 << 20  # ~230 MB at most per endpoint; an H100's 500k KV tokens are 31k blocks
DEFAULT_REBUILD_S: Final = 30.0
_GPU: Final = frozenset({None, "GPU", "gpu"})


class SourceState(enum.StrEnum):
    """The `state` label of `berth_prefix_source_state`."""

    LIVE = "live"  # every event since the store began (or since a clear) was applied
    REPLAYING = "replaying"  # a gap is being filled from the engine's replay buffer
    REBUILDING = "rebuilding"  # dropped after an unrecoverable gap: refilling, under-reports
    FALLEN_BACK = "fallen_back"  # no connection, or the endpoint is unhealthy: the approximate source serves

    @property
    def usable(self) -> bool:
        """Whether the index may answer from this store (it never over-reports while usable)."""
        return self is not SourceState.FALLEN_BACK


@dataclass(frozen=True, slots=True)
class PreciseStatus:
    """One store's health, for /admin/fleet, `berth top` and the metrics."""

    state: SourceState
    since: float  # when the state began (the clock's seconds)
    last_seq: int | None  # the last sequence number applied
    lag_s: float | None  # arrival wall time minus the batch's own time, of the last batch applied
    blocks: int
    batches: int
    events: int
    gaps: int
    replays: int
    rebuilds: int
    clears: int  # drops for any reason: AllBlocksCleared, restart, connection lost, unhealthy
    orphans: int
    skipped: int  # blocks not kept: another medium, not plain, another block size
    unknown: int  # events of unknown kinds
    evicted: int


class PreciseStore:
    """One endpoint's blocks from its KV events; a `BlockHolder`."""

    def __init__(
        self,
        endpoint: str,
        *,
        now: float,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        rebuild_s: float = DEFAULT_REBUILD_S,
        block_tokens: int = 16,
    ) -> None:
        if max_blocks <= 0:
            raise ValueError("max_blocks must be positive")
        self.endpoint = endpoint
        self._max_blocks = max_blocks
        self._rebuild_s = rebuild_s
        self._block_tokens = block_tokens
        self._by_engine: dict[tuple[int, EngineHash], int] = {}  # (group, engine hash) -> berth key
        self._held: dict[int, int] = {}  # berth key -> how many engine blocks have it
        self._state = SourceState.FALLEN_BACK
        self._since = now
        self._expected = 0  # the next sequence number wanted
        self._replayed_upto = -1  # the highest number a replay delivered
        self._replay_started = False
        self._resume = (self._state, now)  # the state (and since when) to go back to after a replay
        self._connected = False
        self._healthy = True
        self._last_seq: int | None = None
        self._lag_s: float | None = None
        self._n = dict.fromkeys(
            ("batches", "events", "gaps", "replays", "rebuilds", "clears", "orphans", "skipped", "unknown"), 0
        )
        self._evicted = 0
        # Told after every state change and every applied batch (the prefix index attaches the store
        # while it is usable and reads its lag).
        self.on_change: Callable[[PreciseStore], None] | None = None

    # ------------------------------------------------------------------ BlockHolder
    @property
    def block_tokens(self) -> int:
        return self._block_tokens

    def matched(self, keys: Sequence[int]) -> int:
        held = self._held
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def cached_blocks(self) -> int:
        return len(self._by_engine)

    def keys(self) -> frozenset[int]:
        """Every berth key held (tests, the admin view)."""
        return frozenset(self._held)

    # ------------------------------------------------------------------ health
    @property
    def state(self) -> SourceState:
        return self._state

    @property
    def lag_s(self) -> float | None:
        return self._lag_s

    def status(self, now: float) -> PreciseStatus:
        self._settle(now)
        n = self._n
        return PreciseStatus(
            state=self._state,
            since=self._since,
            last_seq=self._last_seq,
            lag_s=self._lag_s,
            blocks=len(self._by_engine),
            evicted=self._evicted,
            **n,
        )

    def _set_state(self, state: SourceState, now: float, reason: str) -> None:
        if state is self._state:
            return
        log.info(
            "prefix_source_state",
            endpoint=self.endpoint,
            state=state.value,
            was=self._state.value,
            reason=reason,
        )
        self._state = state
        self._since = now
        if self.on_change is not None:
            self.on_change(self)

    def _settle(self, now: float) -> None:
        if self._state is SourceState.REBUILDING and now - self._since >= self._rebuild_s:
            self._set_state(SourceState.LIVE, now, "rebuilt")

    # ------------------------------------------------------------------ the connection and the endpoint
    def connected(self, now: float) -> None:
        """The subscription is up: events are expected from the engine's first batch on."""
        self._connected = True
        if self._healthy and self._state is SourceState.FALLEN_BACK:
            self._drop()  # refilled from the engine's first batch on
            self._restart_sequence()
            self._set_state(SourceState.LIVE, now, "connected")

    def disconnected(self, now: float) -> None:
        """The publisher is gone (an engine stopped or restarted, or the network dropped it)."""
        self._connected = False
        self._fall_back(now, "disconnected")

    def health(self, healthy: bool, now: float) -> None:
        """The endpoint's health as its scraper sees it: unhealthy drops every block."""
        self._healthy = healthy
        if not healthy:
            self._fall_back(now, "unhealthy")
        elif self._connected:
            self.connected(now)

    def _fall_back(self, now: float, reason: str) -> None:
        if self._state is not SourceState.FALLEN_BACK:
            self._drop()
            self._set_state(SourceState.FALLEN_BACK, now, reason)

    def _restart_sequence(self) -> None:
        self._expected = 0
        self._replayed_upto = -1
        self._last_seq = None

    # ------------------------------------------------------------------ batches
    def on_live(self, seq: int, batch: KvBatch, now: float, wall: float) -> int | None:
        """A batch from the subscription. Returns None when handled (applied, or a duplicate), or the
        first missing sequence number when there is a gap (then the batch is not applied: repair it
        with `begin_replay` ... `end_replay`, or `rebuild`, and hand the batch in again)."""
        if self._state is SourceState.FALLEN_BACK:
            if not self._healthy:
                return None
            self.connected(now)  # a batch can arrive before the connection's own notice
        if seq < self._expected:
            if seq <= self._replayed_upto:
                return None  # already delivered by a replay
            self._drop()  # the engine's numbering began again: it restarted
            self._n["clears"] += 1
            self._restart_sequence()
            log.info("prefix_source_restart", endpoint=self.endpoint, seq=seq)
        if seq > self._expected:
            self._n["gaps"] += 1
            return self._expected
        self._apply(seq, batch, now, wall)
        return None

    def begin_replay(self, now: float, reason: str = "gap") -> None:
        self._n["replays"] += 1
        self._replay_started = False
        self._resume = (self._state, self._since)
        self._set_state(SourceState.REPLAYING, now, reason)

    def on_replayed(self, seq: int, batch: KvBatch, now: float, wall: float) -> None:
        """A batch the replay delivered (in order, from the number asked for or the oldest kept)."""
        if seq < self._expected:
            return
        if seq > self._expected:
            if self._replay_started:
                return  # a hole inside a replay: `end_replay` reports it incomplete
            # The engine no longer keeps the first missing batch: drop, rebuild from the oldest it has.
            self._drop()
            self._n["rebuilds"] += 1
            self._expected = seq
            if self._resume[0] is not SourceState.FALLEN_BACK:
                self._resume = (SourceState.REBUILDING, now)
        self._replay_started = True
        self._replayed_upto = max(self._replayed_upto, seq)
        self._apply(seq, batch, now, wall)

    def end_replay(self, now: float, upto: int) -> bool:
        """The replay ended (its end marker, or a timeout). True when it filled the gap up to `upto`
        (the number of the batch that revealed it); otherwise the caller calls `rebuild`."""
        state, since = self._resume
        filled = self._expected >= upto
        self._set_state(state, now, "replayed" if filled else "replay_incomplete")
        self._since = since
        return filled

    def rebuild(self, now: float, seq: int) -> None:
        """Drop every block and take events from `seq` on (the gap could not be filled)."""
        self._drop()
        self._n["rebuilds"] += 1
        self._expected = seq
        self._replayed_upto = -1
        if self._state is not SourceState.FALLEN_BACK:  # fallen back stays so until connected and healthy
            self._set_state(SourceState.REBUILDING, now, "gap_not_replayed")
            self._since = now

    # ------------------------------------------------------------------ applying events
    def _apply(self, seq: int, batch: KvBatch, now: float, wall: float) -> None:
        self._expected = seq + 1
        self._last_seq = seq
        self._lag_s = wall - batch.ts
        n = self._n
        n["batches"] += 1
        n["events"] += len(batch.events)
        n["unknown"] += batch.unknown
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                self._removed(event)
            elif isinstance(event, AllBlocksCleared):
                self._drop()
                n["clears"] += 1
                if self._state is SourceState.REBUILDING:  # nothing unknown is left
                    self._set_state(SourceState.LIVE, now, "cleared")
        self._settle(now)
        if self.on_change is not None:
            self.on_change(self)

    def _stored(self, ev: BlockStored) -> None:
        n = self._n
        if ev.medium not in _GPU or not ev.plain or ev.block_size <= 0:
            n["skipped"] += len(ev.block_hashes)
            return
        if ev.block_size != self._block_tokens:
            if self._by_engine:
                n["skipped"] += len(ev.block_hashes)
                return
            self._block_tokens = ev.block_size  # the engine's block size, learned from its first block
        by_engine = self._by_engine
        parent = ROOT
        if ev.parent is not None:
            known = by_engine.get((ev.group, ev.parent))
            if known is None:
                n["orphans"] += len(ev.block_hashes)
                return
            parent = known
        keys = token_chain(ev.token_ids, ev.block_size, parent)
        held = self._held
        for engine_hash, key in zip(ev.block_hashes, keys, strict=False):
            entry = (ev.group, engine_hash)
            if entry in by_engine:
                continue  # vLLM reports a reused block again
            by_engine[entry] = key
            held[key] = held.get(key, 0) + 1
        if len(ev.block_hashes) > len(keys):
            n["skipped"] += len(ev.block_hashes) - len(keys)
        while len(by_engine) > self._max_blocks:
            self._forget(next(iter(by_engine)))
            self._evicted += 1

    def _removed(self, ev: BlockRemoved) -> None:
        if ev.medium not in _GPU:
            return
        for engine_hash in ev.block_hashes:
            entry = (ev.group, engine_hash)
            if entry in self._by_engine:
                self._forget(entry)

    def _forget(self, entry: tuple[int, EngineHash]) -> None:
        key = self._by_engine.pop(entry)
        left = self._held[key] - 1
        if left:
            self._held[key] = left
        else:
            del self._held[key]

    def _drop(self) -> None:
        self._by_engine.clear()
        self._held.clear()
