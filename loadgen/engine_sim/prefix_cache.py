"""`PrefixCache`: block-level automatic prefix caching as vLLM does it (sans-IO, no clock).

- **Blocks are content-addressed.** A prompt's full blocks of ``block_size`` tokens get a chain of keys:
  each block's key hashes its token ids (folded to 64 bits) and its parent's key, the first block's
  parent being a root drawn at random once per process (vLLM's ``NONE_HASH``), so the keys, and the block
  hashes published in KV events, differ between processes and consumers cannot rely on them. A partial
  last block has no key and is never cached.
- **Hits** are the longest run of the prompt's leading keys that the cache holds, at most
  ``(context - 1) // block_size`` blocks (vLLM computes at least the last prompt token). Prefill is charged
  on the other tokens only.
- **Admission** references every full prompt block: blocks already held are shared (a block shared by two
  running requests takes its space once), the others are stored (they are computed by this prefill). A
  request also holds its *private* tokens: the partial last block, the generated tokens, the slot of the
  token being computed (the engine's ``kv_held``).
- **Release** (finish, abort, preemption) drops the references; a block nobody references stays cached but
  *free*. The full blocks the request computed past its prompt (its generated tokens, whose KV it held
  privately) are cached free too, as vLLM caches a decode's blocks: a conversation that sends an answer
  back finds it (when the answer's text tokenizes to the ids generated). Free blocks are evicted
  least-recently-used when KV space is needed, a request's blocks entering the free list tail first (its
  deepest block is evicted first), as vLLM frees them. A block in use is never evicted.

Accounting, in tokens as the engine counts them: the engine's ``kv_used`` is the tokens in use (private
tokens plus ``block_size`` per block in use); the cache's `free_tokens` is ``block_size`` per free block;
``kv_used + free_tokens <= capacity`` holds after every engine step (`evict_to`).

Counters: `queries` and `hits` (tokens, vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``: every
admission queries its whole context), and the hit rate of the last prefill batch (SGLang's
``cache_hit_rate``). With `record_events` the cache keeps the KV events a publisher sends (`take_events`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np

from loadgen.engine_sim.tokens import GENERATED_TOKEN_ID, TokenIds

MASK64: Final = (1 << 64) - 1
# vLLM draws its root hash (NONE_HASH) per process unless PYTHONHASHSEED is set; so does the simulator.
_PROCESS_ROOT: Final = int.from_bytes(os.urandom(8), "big")


class CachedRequest(Protocol):
    """What the cache reads and writes on an engine request (`engine.SimRequest`)."""

    block_keys: list[int] | None
    token_ids: TokenIds | None
    blocks_held: int
    cached_tokens: int
    kv_held: int
    generated: int


class PrefixCacheView(Protocol):
    """What an observer may read of an engine's cache (an oracle placement in the fleet simulator)."""

    @property
    def block_size(self) -> int: ...

    def __len__(self) -> int: ...

    def block_keys(self, token_ids: TokenIds, parent: int | None = None) -> list[int]: ...

    def cached_prefix_tokens(self, keys: list[int]) -> int: ...


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class AdmitPlan:
    """What admitting a request would take: ``need`` tokens of KV space not in use now (new blocks, free
    cached blocks it reuses, its private tokens) and ``hit_tokens`` whose prefill is skipped."""

    need: int
    hit_tokens: int


class PrefixCache:
    def __init__(self, block_size: int, *, root: int | None = None, record_events: bool = False) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self._root = _PROCESS_ROOT if root is None else root
        self._mults = np.random.default_rng(block_size).integers(1, 1 << 62, size=block_size) | 1
        self._refs: dict[int, int] = {}  # every cached block -> its running references
        self._free: OrderedDict[int, None] = OrderedDict()  # blocks with no reference, LRU first
        self.free_tokens = 0
        self.queries = 0
        self.hits = 0
        self.evictions = 0
        self._batch_at: float | None = None
        self._batch_queries = 0
        self._batch_hits = 0
        self.events: list[KVEvent] | None = [] if record_events else None

    # ---- observation -------------------------------------------------------------------------
    def __len__(self) -> int:
        """Blocks cached (in use or free)."""
        return len(self._refs)

    def __contains__(self, key: int) -> bool:
        return key in self._refs

    @property
    def blocks_in_use(self) -> int:
        return len(self._refs) - len(self._free)

    def refs(self, key: int) -> int:
        return self._refs.get(key, 0)

    def free_order(self) -> list[int]:
        """The free blocks, next to be evicted first."""
        return list(self._free)

    @property
    def last_batch_hit_rate(self) -> float:
        return self._batch_hits / self._batch_queries if self._batch_queries else 0.0

    def block_keys(self, token_ids: TokenIds, parent: int | None = None) -> list[int]:
        """The chained keys of the full blocks of `token_ids`: each block's ids folded to one 64-bit
        value (a dot product with odd random multipliers, modulo 2**64), then hashed with the parent's
        key (about 0.25 us per block; numpy's integer dot product wraps around silently)."""
        bs = self.block_size
        n = len(token_ids) // bs
        if n == 0:
            return []
        folded = np.asarray(token_ids[: n * bs], dtype=np.int64).reshape(n, bs) @ self._mults
        key = self._root if parent is None else parent
        keys: list[int] = []
        for value in folded.tolist():
            key = hash((key, value))
            keys.append(key)
        return keys

    def cached_prefix_tokens(self, keys: list[int]) -> int:
        """Tokens of the longest leading run of `keys` held now (no side effect: an oracle's view)."""
        n = 0
        refs = self._refs
        for key in keys:
            if key not in refs:
                break
            n += 1
        return n * self.block_size

    # ---- admission and release ---------------------------------------------------------------
    def plan(self, req: CachedRequest, context: int) -> AdmitPlan:
        keys = req.block_keys or ()
        bs = self.block_size
        refs = self._refs
        max_hit = (context - 1) // bs
        hit = 0
        new = 0
        reused_free = 0
        for i, key in enumerate(keys):
            held = refs.get(key)
            if held is None:
                new += 1
                continue
            if hit == i and i < max_hit:
                hit += 1
            if held == 0:
                reused_free += 1
        private = context + 1 - bs * len(keys)
        return AdmitPlan(need=private + bs * (new + reused_free), hit_tokens=hit * bs)

    def admit(self, req: CachedRequest, context: int, plan: AdmitPlan, at: float) -> int:
        """Reference the request's blocks (storing the new ones); returns the tokens now in use that were
        not (``plan.need``). The caller then makes room with `evict_to`."""
        keys = req.block_keys or []
        bs = self.block_size
        refs = self._refs
        stored_from: int | None = None
        for i, key in enumerate(keys):
            held = refs.get(key)
            if held is None:
                refs[key] = 1
                if stored_from is None:
                    stored_from = i
                continue
            if stored_from is not None:
                self._stored(req, keys, stored_from, i)
                stored_from = None
            if held == 0:
                del self._free[key]
                self.free_tokens -= bs
            refs[key] = held + 1
        if stored_from is not None:
            self._stored(req, keys, stored_from, len(keys))
        req.blocks_held = len(keys)
        req.cached_tokens = plan.hit_tokens
        req.kv_held = context + 1 - bs * len(keys)
        self.queries += context
        self.hits += plan.hit_tokens
        if at != self._batch_at:
            self._batch_at, self._batch_queries, self._batch_hits = at, 0, 0
        self._batch_queries += context
        self._batch_hits += plan.hit_tokens
        return plan.need

    def release(self, req: CachedRequest) -> int:
        """Drop the request's references; returns the tokens no longer in use (its private tokens and
        the blocks that became free)."""
        keys = req.block_keys or []
        refs = self._refs
        bs = self.block_size
        freed = req.kv_held
        self._cache_output(req, keys)
        for key in reversed(keys[: req.blocks_held]):  # tail first: the deepest block is evicted first
            held = refs[key] - 1
            refs[key] = held
            if held == 0:
                self._free[key] = None
                self.free_tokens += bs
                freed += bs
        req.blocks_held = 0
        req.kv_held = 0
        return freed

    def _cache_output(self, req: CachedRequest, keys: list[int]) -> None:
        """Cache, free, the full blocks computed past the prompt's (its own tokens: the partial last prompt
        block and the generated tokens, all but the last one, whose KV is not computed yet)."""
        ids = req.token_ids
        if ids is None or req.blocks_held != len(keys) or req.generated < 2:
            return
        bs = self.block_size
        start = len(keys) * bs
        computed = len(ids) + req.generated - 1
        if computed - start < bs:
            return
        tail = np.concatenate([ids[start:], np.full(computed - len(ids), GENERATED_TOKEN_ID, dtype=np.int64)])
        new = self.block_keys(tail, parent=keys[-1] if keys else None)
        refs = self._refs
        stored: list[int] = []
        for key in new:
            if key in refs:
                break  # cached already (another request's identical output): so are the blocks after it
            stored.append(key)
        for key in reversed(stored):
            refs[key] = 0
            self._free[key] = None
            self.free_tokens += bs
        if stored and self.events is not None:
            parent = keys[-1] & MASK64 if keys else None
            self.events.append(
                BlockStored([k & MASK64 for k in stored], parent, tail[: len(stored) * bs].tolist(), bs)
            )

    def evict_to(self, room: int) -> None:
        """Evict free blocks, least recently used first, until they take at most `room` tokens."""
        removed: list[int] = []
        free = self._free
        while self.free_tokens > room and free:
            key, _ = free.popitem(last=False)
            if self._refs.pop(key) != 0:  # pragma: no cover - the free list holds unreferenced blocks only
                raise AssertionError("a block in use was about to be evicted")
            self.free_tokens -= self.block_size
            removed.append(key)
        if removed:
            self.evictions += len(removed)
            if self.events is not None:
                self.events.append(BlockRemoved([k & MASK64 for k in removed]))

    def clear(self) -> None:
        """Drop every free block (an engine reset); blocks in use stay."""
        self.evict_to(0)
        if self.events is not None:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        if not self.events:
            return []
        out, self.events = self.events, []
        return out

    def _stored(self, req: CachedRequest, keys: list[int], start: int, end: int) -> None:
        if self.events is None:
            return
        bs = self.block_size
        ids = req.token_ids
        tokens = [] if ids is None else ids[start * bs : end * bs].tolist()
        parent = keys[start - 1] & MASK64 if start else None
        self.events.append(BlockStored([k & MASK64 for k in keys[start:end]], parent, tokens, bs))
