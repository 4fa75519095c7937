"""The precise prefix store: engine blocks re-keyed in berth's key space, sequence gaps, drops."""

from __future__ import annotations

import sys
import tracemalloc
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.blockhash import token_chain
from gateway.core.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, KvBatch, KvEvent
from gateway.telemetry.prefix_precise import PreciseStore, SourceState
from gateway.telemetry.prefix_source import BlockHolder

BS = 4


def batch(*events: KvEvent, ts: float = 100.0) -> KvBatch:
    return KvBatch(ts=ts, events=events)


def stored(hashes: list[int], tokens: list[int], parent: int | None = None, **kw: object) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), BS, **kw)  # type: ignore[arg-type]


def live_store() -> PreciseStore:
    s = PreciseStore("e1", now=0.0, rebuild_s=10.0)
    s.connected(0.0)
    return s


def test_blocks_are_keyed_by_their_tokens_and_chained_to_their_parent() -> None:
    s = live_store()
    holder: BlockHolder = s
    prompt = list(range(12))
    assert s.on_live(0, batch(stored([11, 12], prompt[:8])), 1.0, 100.5) is None
    assert s.on_live(1, batch(stored([13], prompt[8:12], parent=12)), 1.0, 100.5) is None
    keys = token_chain(prompt, BS)
    assert holder.matched(keys) == 3
    assert holder.cached_blocks() == 3
    assert holder.block_tokens == BS
    assert s.matched(token_chain([*prompt[:4], 99, 99, 99, 99], BS)) == 1
    st_ = s.status(1.0)
    assert (st_.state, st_.last_seq, st_.lag_s) == (SourceState.LIVE, 1, 0.5)


def test_removal_uses_the_engine_hash_and_orphans_are_skipped() -> None:
    s = live_store()
    s.on_live(0, batch(stored([1, 2], list(range(8)))), 1.0, 100.0)
    s.on_live(1, batch(BlockRemoved((2,))), 1.0, 100.0)
    assert s.matched(token_chain(range(8), BS)) == 1
    s.on_live(2, batch(stored([5], [1, 1, 1, 1], parent=77)), 1.0, 100.0)  # parent unknown
    assert s.cached_blocks() == 1
    assert s.status(1.0).orphans == 1


def test_other_media_and_non_plain_blocks_are_not_kept() -> None:
    s = live_store()
    s.on_live(0, batch(stored([1], [1] * 4, medium="CPU"), stored([2], [2] * 4, plain=False)), 1.0, 100.0)
    assert s.cached_blocks() == 0
    assert s.status(1.0).skipped == 2


def test_all_blocks_cleared_drops_everything() -> None:
    s = live_store()
    s.on_live(0, batch(stored([1], [1] * 4)), 1.0, 100.0)
    s.on_live(1, batch(AllBlocksCleared()), 1.0, 100.0)
    assert s.cached_blocks() == 0
    assert s.keys() == frozenset()


def test_a_gap_asks_for_a_replay_and_a_full_replay_fills_it() -> None:
    s = live_store()
    s.on_live(0, batch(stored([1], [1] * 4)), 1.0, 100.0)
    assert s.on_live(3, batch(stored([4], [4] * 4, parent=3)), 1.0, 100.0) == 1
    s.begin_replay(1.0)
    assert s.status(1.0).state is SourceState.REPLAYING
    s.on_replayed(1, batch(stored([2], [2] * 4, parent=1)), 1.0, 100.0)
    s.on_replayed(2, batch(stored([3], [3] * 4, parent=2)), 1.0, 100.0)
    s.on_replayed(3, batch(stored([4], [4] * 4, parent=3)), 1.0, 100.0)
    assert s.end_replay(1.0, upto=3)
    assert s.state is SourceState.LIVE
    assert s.on_live(3, batch(stored([4], [4] * 4, parent=3)), 1.0, 100.0) is None  # a duplicate
    assert s.cached_blocks() == 4
    assert s.status(1.0).rebuilds == 0


def test_a_replay_that_starts_too_late_drops_and_rebuilds() -> None:
    s = live_store()
    s.on_live(0, batch(stored([1], [1] * 4)), 1.0, 100.0)
    assert s.on_live(9, batch(), 1.0, 100.0) == 1
    s.begin_replay(1.0)
    s.on_replayed(5, batch(stored([6], [6] * 4)), 1.0, 100.0)  # the buffer begins at 5
    for seq in range(6, 10):
        s.on_replayed(seq, batch(), 1.0, 100.0)
    assert s.end_replay(2.0, upto=9)
    assert s.status(2.0).state is SourceState.REBUILDING
    assert s.keys() == frozenset(token_chain([6] * 4, BS))  # block 1 (before the hole) is gone
    s.on_live(10, batch(), 11.5, 100.0)
    assert s.state is SourceState.LIVE  # rebuild_s after the drop


def test_no_replay_means_rebuild_and_a_restart_drops() -> None:
    s = live_store()
    s.on_live(0, batch(stored([1], [1] * 4)), 1.0, 100.0)
    assert s.on_live(5, batch(stored([2], [2] * 4)), 1.0, 100.0) == 1
    s.rebuild(1.0, 5)
    assert s.on_live(5, batch(stored([2], [2] * 4)), 1.0, 100.0) is None
    assert s.keys() == frozenset(token_chain([2] * 4, BS))
    # the engine's numbering starts again (no replay delivered these): a restart
    assert s.on_live(0, batch(stored([3], [3] * 4)), 1.0, 100.0) is None
    assert s.keys() == frozenset(token_chain([3] * 4, BS))


def test_disconnect_and_unhealthy_fall_back_and_drop() -> None:
    s = live_store()
    s.on_live(0, batch(stored([1], [1] * 4)), 1.0, 100.0)
    s.disconnected(2.0)
    assert (s.state, s.cached_blocks(), s.state.usable) == (SourceState.FALLEN_BACK, 0, False)
    s.connected(3.0)
    assert s.state is SourceState.LIVE
    s.on_live(0, batch(stored([1], [1] * 4)), 3.0, 100.0)
    s.health(False, 4.0)
    assert (s.state, s.cached_blocks()) == (SourceState.FALLEN_BACK, 0)
    assert s.on_live(1, batch(stored([2], [2] * 4)), 4.0, 100.0) is None  # ignored while unhealthy
    assert s.cached_blocks() == 0
    s.health(True, 5.0)
    assert s.state is SourceState.LIVE


def test_memory_is_bounded_oldest_first() -> None:
    s = PreciseStore("e1", now=0.0, max_blocks=3)
    s.connected(0.0)
    s.on_live(0, batch(stored([1, 2, 3, 4, 5], list(range(20)))), 1.0, 100.0)
    assert s.cached_blocks() == 3
    assert s.status(1.0).evicted == 2
    assert s.matched(token_chain(range(20), BS)) == 0  # the first blocks went first


def test_bytes_per_block() -> None:
    """Stated in the module docstring: about 230 bytes per block on CPython 3.11."""
    s = live_store()
    n = 20_000
    tokens = list(range(BS)) * n
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    parent = None
    for i in range(0, n, 1000):
        hashes = [(1 << 62) + j for j in range(i, i + 1000)]
        s.on_live(i // 1000, batch(stored(hashes, tokens[: 1000 * BS], parent=parent)), 1.0, 100.0)
        parent = hashes[-1]
    per_block = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    assert s.cached_blocks() == n
    if sys.version_info[:2] == (3, 11):
        assert 100 < per_block < 400, per_block


# ---------------------------------------------------------------------- any sequence vs a reference model
@dataclass
class Model:
    """What the engine holds, as berth should know it: engine hash -> the whole token prefix."""

    prefixes: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def keys(self) -> frozenset[int]:
        return frozenset(token_chain(p, BS)[-1] for p in self.prefixes.values())


@st.composite
def event_lists(draw: st.DrawFn) -> list[KvEvent]:
    events: list[KvEvent] = []
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["stored", "stored", "stored", "removed", "cleared"]))
        if kind == "stored":
            n = draw(st.integers(1, 3))
            hashes = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
            tokens = draw(st.lists(st.integers(0, 2), min_size=n * BS, max_size=n * BS))
            parent = draw(st.one_of(st.none(), st.integers(0, 40)))
            events.append(stored(hashes, tokens, parent=parent))
        elif kind == "removed":
            events.append(BlockRemoved(tuple(draw(st.lists(st.integers(0, 40), max_size=3)))))
        else:
            events.append(AllBlocksCleared())
    return events


def apply_model(model: Model, event: KvEvent) -> None:
    if isinstance(event, AllBlocksCleared):
        model.prefixes.clear()
    elif isinstance(event, BlockRemoved):
        for h in event.block_hashes:
            assert isinstance(h, int)
            model.prefixes.pop(h, None)
    else:
        if event.parent is None:
            prefix: tuple[int, ...] = ()
        elif event.parent in model.prefixes:
            assert isinstance(event.parent, int)
            prefix = model.prefixes[event.parent]
        else:
            return
        for i, h in enumerate(event.block_hashes):
            prefix = (*prefix, *event.token_ids[i * BS : (i + 1) * BS])
            assert isinstance(h, int)
            model.prefixes.setdefault(h, prefix)


@settings(max_examples=300, deadline=None)
@given(event_lists(), st.integers(1, 4))
def test_any_event_sequence_leaves_the_store_equal_to_the_model(
    events: list[KvEvent], per_batch: int
) -> None:
    s = live_store()
    model = Model()
    for seq, start in enumerate(range(0, len(events), per_batch)):
        chunk = events[start : start + per_batch]
        assert s.on_live(seq, batch(*chunk), 1.0, 100.0) is None
        for e in chunk:
            apply_model(model, e)
        assert s.keys() == model.keys()
        assert s.cached_blocks() == len(model.prefixes)


# ---------------------------------------------------------------------- gaps never leave stale blocks
@st.composite
def engine_histories(draw: st.DrawFn) -> tuple[list[KvEvent], dict[int, tuple[int, ...]]]:
    """Events as an engine makes them: a block's hash follows from its content and its parent's hash,
    so equal prefixes have equal hashes; removals name blocks stored before. Also every hash's prefix."""
    prefix_of: dict[int, tuple[int, ...]] = {}
    events: list[KvEvent] = []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["stored", "stored", "stored", "removed", "cleared"]))
        known = sorted(prefix_of)
        if kind == "stored":
            parent = draw(st.one_of(st.none(), st.sampled_from(known))) if known else None
            n = draw(st.integers(1, 3))
            tokens = draw(st.lists(st.integers(0, 1), min_size=n * BS, max_size=n * BS))
            prefix = () if parent is None else prefix_of[parent]
            hashes = []
            for i in range(n):
                prefix = (*prefix, *tokens[i * BS : (i + 1) * BS])
                h = hash(("engine", prefix))
                prefix_of[h] = prefix
                hashes.append(h)
            events.append(stored(hashes, tokens, parent=parent))
        elif kind == "removed" and known:
            events.append(BlockRemoved(tuple(draw(st.lists(st.sampled_from(known), max_size=3)))))
        else:
            events.append(AllBlocksCleared())
    return events, prefix_of


@settings(max_examples=300, deadline=None)
@given(engine_histories(), st.data())
def test_lost_batches_never_leave_stale_blocks(
    history: tuple[list[KvEvent], dict[int, tuple[int, ...]]], data: st.DataObject
) -> None:
    """One event per batch; some batches are lost on the way; the replay buffer begins at some batch
    (or there is no replay). Whatever is lost, the store holds only blocks the engine holds; with a
    buffer from the first batch it holds exactly what an in-order store would."""
    events, prefix_of = history
    lost = data.draw(st.lists(st.booleans(), min_size=len(events), max_size=len(events)))
    replay_from = data.draw(st.one_of(st.none(), st.integers(0, max(0, len(events) - 1))))
    s, reference = live_store(), live_store()
    cached: set[int] = set()
    for seq, event in enumerate(events):
        b = batch(event)
        reference.on_live(seq, b, 1.0, 100.0)
        if isinstance(event, AllBlocksCleared):
            cached.clear()
        elif isinstance(event, BlockRemoved):
            cached.difference_update(h for h in event.block_hashes if isinstance(h, int))
        else:
            cached.update(h for h in event.block_hashes if isinstance(h, int))
        if lost[seq]:
            continue
        gap = s.on_live(seq, b, 1.0, 100.0)
        if gap is not None:
            filled = False
            if replay_from is not None:
                s.begin_replay(1.0)
                for r in range(max(gap, replay_from), seq + 1):
                    s.on_replayed(r, batch(events[r]), 1.0, 100.0)
                filled = s.end_replay(1.0, seq)
            if not filled:
                s.rebuild(1.0, seq)
            assert s.on_live(seq, b, 1.0, 100.0) is None
        truth = {token_chain(prefix_of[h], BS)[-1] for h in cached}
        assert s.keys() <= truth
        if replay_from == 0:
            assert s.keys() == reference.keys()


def test_what_arrives_while_unhealthy_is_not_kept() -> None:
    s = PreciseStore("e1", now=0.0)
    s.health(False, 0.0)  # starting
    s.connected(0.0)
    s.begin_replay(0.0, "connected")  # the subscriber replays on connecting, whatever the health
    s.on_replayed(0, batch(stored([1], [1] * 4)), 0.0, 100.0)
    assert s.end_replay(0.0, 0)
    assert s.state is SourceState.FALLEN_BACK
    s.health(True, 1.0)
    assert (s.state, s.cached_blocks()) == (SourceState.LIVE, 0)
    assert s.on_live(3, batch(), 1.0, 100.0) == 0  # the next batch asks for everything again


def test_a_fallen_back_store_stays_so_through_replays_and_rebuilds() -> None:
    s = PreciseStore("e1", now=0.0)
    s.connected(0.0)
    s.health(False, 0.0)
    s.begin_replay(0.0, "connected")
    s.on_replayed(4, batch(stored([1], [1] * 4)), 0.0, 100.0)  # the buffer begins late
    assert not s.end_replay(0.0, 9)
    s.rebuild(0.0, 9)
    assert (s.state, s.cached_blocks()) == (SourceState.FALLEN_BACK, 0)
