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
dict entry and a small int (the bitset): about 180 bytes for a block held by one endpoint
(`loadgen.diag.prefix_index` measures it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

#: Blocks a slot holds while the endpoint's KV capacity is unknown and none is configured.
DEFAULT_BLOCKS: Final = 32_768


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
        owners, keep = self._owners, ~slot.bit
        for k in slot.lru:
            o = owners.get(k, 0) & keep
            if o:
                owners[k] = o
            else:
                owners.pop(k, None)
        slot.lru.clear()

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
        for k in reversed(keys):
            if k in lru:
                move(k)
            else:
                lru[k] = None
                owners[k] = owners.get(k, 0) | bit
        self._evict(slot)

    def _evict(self, slot: _Slot) -> None:
        lru, owners, keep = slot.lru, self._owners, ~slot.bit
        over = len(lru) - slot.capacity
        for _ in range(over):
            k, _ = lru.popitem(last=False)
            o = owners.get(k, 0) & keep
            if o:
                owners[k] = o
            else:
                owners.pop(k, None)

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

    def match_all(self, keys: Sequence[int], mask: int | None = None) -> list[tuple[int, int]]:
        """(slots bitset, leading keys they hold) for every match length above zero, over the slots in
        `mask` (all when None).

        The slots holding the first `j` keys shrink as `j` grows; from each length where they change,
        the next change is found by galloping (1, 2, 4, ... keys ahead) and then bisecting: about
        ``2·log2(gap)`` dict lookups per distinct match length, nothing per endpoint. (Reading every
        key's bitset in one C-level `map` instead measured slower whenever few lengths are distinct:
        30 µs against 2 µs for one endpoint holding a 500-key prompt.)"""
        get = self._owners.get
        n = len(keys)
        if n == 0:
            return []
        m = get(keys[0], 0)
        if mask is not None:
            m &= mask
        out: list[tuple[int, int]] = []
        lo = 0  # every slot in `m` holds keys[: lo + 1]
        while m:
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
            out.append((m & ~rest, hi))
            m = rest
            lo = hi
        return out


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
