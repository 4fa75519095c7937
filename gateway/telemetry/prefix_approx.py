"""The approximate source of the prefix index: what berth sent where, kept as blocks per endpoint.

Every endpoint gets a slot (a bit). One dict maps each block key to the bitset of the slots holding it,
so one request is matched against every endpoint at once: the slots holding its first `k` keys shrink
as `k` grows (a block's key chains its whole prefix, and each slot evicts a block only after every
block that extends it, see below), so a galloping search over the keys, stopping only where the set
of slots changes, finds every slot's match length in a few dict lookups per distinct length
(`match_all`).

Each slot is an LRU of its keys (an `OrderedDict`) sized from the endpoint's KV capacity in blocks. A
request's keys are touched from its last block to its first, so a prefix is always more recent than
what extends it and is evicted after it, as the engines evict (vLLM frees a request's blocks
tail-first). What the engine really evicted is not known here: this source assumes the engine's whole
KV capacity caches what berth sent last.

Memory: per block held, one entry in the slot's `OrderedDict` and, shared by the slots holding it, one
dict entry and a small int (the bitset): about 150 bytes for a block held by one endpoint
(`loadgen.diag.prefix_index` measures it). Matching keeps nothing per block: only a list of the ints
up to the longest prompt's block count, shared by every match (`_positions`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import accumulate, compress, islice, repeat
from operator import and_, is_not, itemgetter, xor
from typing import Final

#: Blocks a slot holds while the endpoint's KV capacity is unknown and none is configured.
DEFAULT_BLOCKS: Final = 32_768
#: Distinct match lengths found by galloping before the rest of a prompt is read in one pass.
GALLOP_GROUPS: Final = 2
#: ... when they are on average fewer keys apart than this (galloping costs about 2·log2(gap) dict
#: lookups and some Python steps per length, the one pass a few tens of ns per key).
SCAN_GAP: Final = 16


class _Slot:
    __slots__ = ("bit", "capacity", "lru")

    def __init__(self, bit: int, capacity: int) -> None:
        self.bit = bit
        self.capacity = capacity
        self.lru: OrderedDict[int, None] = OrderedDict()


class ApproximateBlocks:
    """Block keys per slot, with one shared key -> slots bitset for matching all slots at once."""

    __slots__ = ("_free", "_owners", "_slots")

    def __init__(self) -> None:
        self._owners: dict[int, int] = {}
        self._slots: dict[int, _Slot] = {}
        self._free: list[int] = []

    # ----------------------------------------------------------------- slots
    def add_slot(self, capacity_blocks: int = DEFAULT_BLOCKS) -> int:
        """A new empty slot; its index (a freed one is reused)."""
        idx = self._free.pop() if self._free else len(self._slots)
        self._slots[idx] = _Slot(1 << idx, max(1, capacity_blocks))
        return idx

    def drop_slot(self, idx: int) -> None:
        """Forget everything slot `idx` holds and free it."""
        self.clear(idx)
        if self._slots.pop(idx, None) is not None:
            self._free.append(idx)

    def clear(self, idx: int) -> None:
        slot = self._slots.get(idx)
        if slot is None:
            return
        self._drop(slot.lru, slot.bit)
        slot.lru.clear()

    def _drop(self, keys: Iterable[int], bit: int) -> None:
        """`bit` leaves the bitsets of `keys` (a key no slot holds any more is forgotten)."""
        owners, keep = self._owners, ~bit
        was: int | None = None
        now = 0
        for k in keys:
            o = owners.get(k, 0)
            if o is not was:  # equal bitsets stay one object (`_scan` compares them by identity)
                was, now = o, o & keep
            if now:
                owners[k] = now
            else:
                owners.pop(k, None)

    def set_capacity(self, idx: int, capacity_blocks: int) -> None:
        slot = self._slots.get(idx)
        if slot is not None:
            slot.capacity = max(1, capacity_blocks)
            self._evict(slot)

    def capacity(self, idx: int) -> int:
        return self._slots[idx].capacity

    def held(self, idx: int) -> int:
        """Blocks slot `idx` holds."""
        slot = self._slots.get(idx)
        return 0 if slot is None else len(slot.lru)

    @property
    def total_blocks(self) -> int:
        """Distinct keys held by any slot."""
        return len(self._owners)

    @property
    def mask(self) -> int:
        """Every slot's bit."""
        m = 0
        for s in self._slots.values():
            m |= s.bit
        return m

    # ----------------------------------------------------------------- updates
    def insert(self, idx: int, keys: Sequence[int]) -> None:
        """Slot `idx` holds `keys` now (a prompt sent there, or its answer): the most recent blocks, the
        first ones most recent of all; the least recent beyond its capacity are evicted."""
        slot = self._slots.get(idx)
        if slot is None or not keys:
            return
        lru, owners, bit = slot.lru, self._owners, slot.bit
        move = lru.move_to_end
        was: int | None = None
        now = 0
        for k in reversed(keys):
            if k in lru:
                move(k)
            else:
                lru[k] = None
                o = owners.get(k, 0)
                if o is not was:  # equal bitsets stay one object (`_scan` compares them by identity)
                    was, now = o, o | bit
                owners[k] = now
        self._evict(slot)

    def _evict(self, slot: _Slot) -> None:
        lru = slot.lru
        over = len(lru) - slot.capacity
        if over > 0:
            pop = lru.popitem
            self._drop([pop(last=False)[0] for _ in range(over)], slot.bit)

    # ----------------------------------------------------------------- queries
    def matched(self, idx: int, keys: Sequence[int]) -> int:
        """How many leading `keys` slot `idx` holds (binary search on the prefix)."""
        slot = self._slots.get(idx)
        if slot is None or not keys:
            return 0
        lru = slot.lru
        lo, hi = 0, len(keys)  # keys[:lo] held; keys[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] in lru:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def match_all(
        self, keys: Sequence[int], mask: int | None = None, *, gallop_groups: int = GALLOP_GROUPS
    ) -> list[tuple[int, int]]:
        """(slots bitset, leading keys they hold) for every match length above zero, over the slots in
        `mask` (all when None), in increasing length (`match_lists` as pairs)."""
        sets, ends = self.match_lists(keys, mask, gallop_groups=gallop_groups)
        return list(zip(sets, ends, strict=True))

    def match_lists(
        self, keys: Sequence[int], mask: int | None = None, *, gallop_groups: int = GALLOP_GROUPS
    ) -> tuple[list[int], list[int]]:
        """The slots bitsets holding each distinct match length above zero of `keys`, and the lengths,
        in increasing length, over the slots in `mask` (all when None).

        The slots holding the first `j` keys shrink as `j` grows. From each length where they change,
        the next change is found by galloping (1, 2, 4, ... keys ahead) and then bisecting: about
        ``2·log2(gap)`` dict lookups per distinct match length, nothing per endpoint. Once
        `gallop_groups` lengths are found fewer than `SCAN_GAP` keys apart on average, many more are
        likely (every endpoint holding its own length of a shared document): the rest, up to where no
        slot holds a key, is read in one C-level pass (`_scan`), a few tens of ns per key instead of
        some hundreds per length."""
        get = self._owners.get
        n = len(keys)
        sets: list[int] = []
        ends: list[int] = []
        if n == 0:
            return sets, ends
        m = get(keys[0], 0)
        if mask is not None:
            m &= mask
        lo = 0  # every slot in `m` holds keys[: lo + 1]
        while m:
            found = len(ends)
            # The gaps between the lengths found so far, the first length aside (a shared system
            # prompt often puts the first change far in, and the rest close together).
            if found >= gallop_groups and lo - (ends[0] if found > 1 else 0) < SCAN_GAP * max(found - 1, 1):
                more_sets, more_ends = self._scan(keys, lo + 1, m, nested=mask is None)
                sets += more_sets
                ends += more_ends
                break
            step = 1
            hi = n
            while lo + step < n:
                j = lo + step
                if get(keys[j], 0) & m == m:
                    lo = j
                    step += step
                else:
                    hi = j
                    break
            while hi - lo > 1:  # every slot of m holds keys[lo]; not every one holds keys[hi]
                mid = (lo + hi) >> 1
                if get(keys[mid], 0) & m == m:
                    lo = mid
                else:
                    hi = mid
            rest = get(keys[hi], 0) & m if hi < n else 0
            sets.append(m & ~rest)
            ends.append(hi)
            m = rest
            lo = hi
        return sets, ends

    def _scan(self, keys: Sequence[int], start: int, m: int, *, nested: bool) -> tuple[list[int], list[int]]:
        """`match_lists` from `start` on, for the slots `m`, which hold keys[:start]: one pass in C-level
        iterators over the keys up to the first that no slot of `m` holds (found by galloping).

        The bitsets along the keys only shrink (a slot holding a key holds its prefix), so where the
        bitset changes, a run of equal bitsets ends: its slots hold every key up to there, and the
        slots it loses at the change are those whose match ends there. `nested`: no slot outside `m`
        holds a key past `start` (no mask narrowed `m`), so the runs need no intersecting with it.

        Per key: one dict lookup (`itemgetter`), one identity comparison and one step of `compress`,
        all in C; per change, a few more. The positions come from a list of ints kept for the purpose
        (iterating a `range` would allocate an int per key)."""
        get = self._owners.get
        n = len(keys)
        lo, hi = start - 1, n  # some slot of m holds keys[lo] (or lo < start); none holds keys[hi]
        step = 1
        while lo + step < n:
            if get(keys[lo + step], 0) & m:
                lo += step
                step += step
            else:
                hi = lo + step
                break
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if get(keys[mid], 0) & m:
                lo = mid
            else:
                hi = mid
        if hi == start:  # no slot of m holds keys[start]: they all end there
            return [m], [start]
        try:  # every key up to `hi` is held by some slot (a slot holding a key holds its prefix)
            if hi - start > 1:
                vals = itemgetter(*keys[start:hi])(self._owners)
            else:
                vals = (self._owners[keys[start]],)  # itemgetter of one key is no tuple
        except KeyError:  # not so (never by insert and evict alone): read with a default
            vals = tuple(map(get, keys[start:hi], repeat(0)))
        # Where the bitset object changes (and at `hi`, where every run ends). Equal bitsets are mostly
        # one object (`insert` and `_drop` keep a run of them so), and comparing identities is cheaper
        # than comparing values; two equal ones that are not the same object only add a change that
        # loses no slot (dropped below).
        changed = list(map(is_not, vals, islice(vals, 1, None)))
        first = vals[0]
        if nested and (first is m or first == m):  # no match ends at `start` (the common case)
            runs = [*compress(vals, changed), vals[-1]]
            ends = [*compress(_positions(hi)[start + 1 : hi], changed), hi]
        else:
            runs = [m, *compress(vals, changed), vals[-1]]
            ends = [start, *compress(_positions(hi)[start + 1 : hi], changed), hi]
        if not nested:
            runs = list(accumulate(runs, and_))
        runs.append(0)
        gone = list(map(xor, runs, islice(runs, 1, None)))
        if 0 in gone:  # equal bitsets that were not one object, or a mask leaving some runs empty
            return list(compress(gone, gone)), list(compress(ends, gone))
        return gone, ends


_POSITIONS: list[int] = list(range(1024))


def _positions(n: int) -> list[int]:
    """A list of the ints 0, 1, ... with at least `n` of them (grown as longer prompts come)."""
    global _POSITIONS  # noqa: PLW0603 (a cache of ints, grown in place of a per-call range)
    if len(_POSITIONS) < n:
        _POSITIONS = list(range(max(n, 2 * len(_POSITIONS))))
    return _POSITIONS


class ApproximateHolder:
    """One endpoint's slot as a `BlockHolder` (`gateway.telemetry.prefix_source`)."""

    __slots__ = ("_blocks", "_tokens", "idx")

    def __init__(self, blocks: ApproximateBlocks, idx: int, block_tokens: int) -> None:
        self._blocks = blocks
        self.idx = idx
        self._tokens = block_tokens

    @property
    def block_tokens(self) -> int:
        """Tokens per block: the block's characters over the model's characters per token (estimated)."""
        return self._tokens

    def matched(self, keys: Sequence[int]) -> int:
        return self._blocks.matched(self.idx, keys)

    def cached_blocks(self) -> int:
        return self._blocks.held(self.idx)
