"""The *oracle* source of the prefix index in the fleet simulator: each simulated engine's true prefix
cache, read directly, behind the same `BlockHolder` Protocol the approximate and precise sources meet
(`gateway.telemetry.prefix_source`). A benchmark's upper bound for what an index can know.

What it needs from the engine simulator (`TrueCache`): its prefix cache as an attribute
`prefix_cache` of the `SimEngine`, keyed by berth's own chain over each full block's token ids
(`gateway.core.blockhash.token_chain(token_ids, block_size)`), with `block_size`, `holds(key)` and
`cached_blocks()`. A request is matched by its token ids (`PromptKeys.token_keys`): the simulation
hands the index the token ids it gives its engines (`SimGateway.token_ids`).

The engine's own hit counters (what a live scrape reads as vLLM's `prefix_cache_hits_total` /
`prefix_cache_queries_total`) are read from its attributes `prefix_cache_hits` and
`prefix_cache_queries` (cumulative tokens) when it has them (`hit_counters`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class TrueCache(Protocol):
    """The engine simulator's prefix cache, as the oracle reads it."""

    @property
    def block_size(self) -> int: ...

    def holds(self, key: int) -> bool: ...  # a cached block with berth's key (token_chain)

    def cached_blocks(self) -> int: ...


class OracleHolder:
    """A `BlockHolder` over one engine's true cache: the leading keys it holds, exactly (a linear scan:
    an engine may evict a block before what extends it)."""

    __slots__ = ("_cache",)

    def __init__(self, cache: TrueCache) -> None:
        self._cache = cache

    @property
    def block_tokens(self) -> int:
        return self._cache.block_size

    def matched(self, keys: Sequence[int]) -> int:
        holds = self._cache.holds
        n = 0
        for k in keys:
            if not holds(k):
                break
            n += 1
        return n

    def cached_blocks(self) -> int:
        return self._cache.cached_blocks()


def true_cache(engine: object) -> TrueCache | None:
    """The engine's prefix cache when it has one (`prefix_cache`), else None."""
    cache = getattr(engine, "prefix_cache", None)
    return cache if isinstance(cache, TrueCache) else None


def hit_counters(engine: object) -> tuple[float, float] | None:
    """(hit tokens, query tokens) of the engine's prefix cache, cumulative; None without them."""
    hits = getattr(engine, "prefix_cache_hits", None)
    queries = getattr(engine, "prefix_cache_queries", None)
    if isinstance(hits, int | float) and isinstance(queries, int | float):
        return float(hits), float(queries)
    return None
