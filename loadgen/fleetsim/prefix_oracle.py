"""The *oracle* source of the prefix index in the fleet simulator: each simulated engine's true prefix
cache, read directly, behind the same `BlockHolder` Protocol the approximate and precise sources meet
(`gateway.telemetry.prefix_source`). A benchmark's upper bound for what an index can know.

What it needs from the engine simulator (`TrueCache`): its prefix cache as an attribute
`prefix_cache` of the `SimEngine`, keyed by berth's own chain over each full block's token ids
(`gateway.core.blockhash.token_chain(token_ids, block_size)`), with `block_size`, `holds(key)` and
`cached_blocks()`. A request is matched by its token ids (`PromptKeys.token_keys`): the simulation
hands the index the token ids it gives its engines (`SimGateway.token_ids`).

The engine simulator keys its cache its own way (`PrefixCacheView.block_keys`, not berth's chain):
`ViewHolder` answers over that view, translating berth's token keys through a `KeyBridge` that learns
both chains from the token ids the simulation hands the index.

The engine's own hit counters (what a live scrape reads as vLLM's `prefix_cache_hits_total` /
`prefix_cache_queries_total`) are read from its attributes `prefix_cache_hits` and
`prefix_cache_queries` (cumulative tokens) when it has them (`hit_counters`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from gateway.core.blockhash import token_chain
from gateway.core.types import ApiKind
from loadgen.engine_sim.protocol import prompt_token_ids
from loadgen.engine_sim.tokens import TokenIds


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


@runtime_checkable
class CacheView(Protocol):
    """The engine simulator's cache as it exposes itself to an observer
    (`loadgen.engine_sim.prefix_cache.PrefixCacheView`): its own block keys for token ids, and how much
    of a key chain it holds now."""

    @property
    def block_size(self) -> int: ...

    def __len__(self) -> int: ...

    def block_keys(self, token_ids: TokenIds) -> list[int]: ...

    def cached_prefix_tokens(self, keys: list[int]) -> int: ...


#: Translations kept (berth key -> engine key); past this the table starts afresh (about 200 bytes each).
_BRIDGE_MAX: Final = 1_000_000


class KeyBridge:
    """Berth's token-id keys (`token_chain`) to the engine simulator's own block keys, learned from the
    token ids the simulation hands the index (`token_ids`, the `SimGateway.token_ids` hook): the engine
    keys its blocks its own way, so the oracle translates what the index asks about."""

    __slots__ = ("_to_engine", "_views")

    def __init__(self) -> None:
        self._to_engine: dict[tuple[int, int], int] = {}  # (block size, berth key) -> engine key
        self._views: dict[int, CacheView] = {}  # block size -> a view that keys blocks of that size

    def watch(self, view: CacheView) -> None:
        self._views.setdefault(view.block_size, view)

    def token_ids(self, api: ApiKind, body: Mapping[str, Any]) -> list[int] | None:
        """The ids the simulated engines give the body; their keys are learned on the way."""
        ids = prompt_token_ids("chat" if api == ApiKind.CHAT else "completion", dict(body))
        if ids is None:
            return None
        if len(self._to_engine) > _BRIDGE_MAX:
            self._to_engine.clear()
        as_list: list[int] = ids.tolist()
        for size, view in self._views.items():
            mine = token_chain(as_list, size)
            theirs = view.block_keys(ids)
            self._to_engine.update(((size, m), t) for m, t in zip(mine, theirs, strict=False))
        return as_list

    def engine_keys(self, size: int, keys: Sequence[int]) -> list[int]:
        """The engine keys of the leading `keys` it knows (stops at the first it does not)."""
        out: list[int] = []
        table = self._to_engine
        for k in keys:
            t = table.get((size, k))
            if t is None:
                break
            out.append(t)
        return out


class ViewHolder:
    """A `BlockHolder` over the engine simulator's cache view, asked through a `KeyBridge`."""

    __slots__ = ("_bridge", "_view")

    def __init__(self, view: CacheView, bridge: KeyBridge) -> None:
        self._view = view
        self._bridge = bridge
        bridge.watch(view)

    @property
    def block_tokens(self) -> int:
        return self._view.block_size

    def matched(self, keys: Sequence[int]) -> int:
        size = self._view.block_size
        return self._view.cached_prefix_tokens(self._bridge.engine_keys(size, keys)) // size

    def cached_blocks(self) -> int:
        return len(self._view)


def cache_view(engine: object) -> CacheView | None:
    """The engine's cache view when it has one (`prefix_cache` with block_keys), else None."""
    cache = getattr(engine, "prefix_cache", None)
    return cache if isinstance(cache, CacheView) else None
