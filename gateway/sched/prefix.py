"""A request's cached prompt tokens per endpoint: what the prefix index predicted the engines hold.

The scheduler is sans-IO: it never asks the index. Admission looks the request's prompt up once
(`gateway.telemetry.prefix_index`) and hands the answer in as a value (`SchedRequest.cached`); the
predictions (`gateway.sched.predict`) then charge prefill on the uncached tokens only, so ordering,
placement and admission all see cache reuse through the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from gateway.core.types import EndpointId


class PrefixHits(Mapping[EndpointId, int]):
    """Cached prompt tokens by endpoint (endpoints holding nothing are left out). Read-only once made,
    hashable by value (a `SchedRequest` is a frozen value type)."""

    __slots__ = ("_hits_hash", "_tokens")

    def __init__(self, tokens: Mapping[EndpointId, int] | None = None) -> None:
        self._tokens: dict[EndpointId, int] = {e: t for e, t in (tokens or {}).items() if t > 0}
        self._hits_hash: int | None = None

    @classmethod
    def trusted(cls, tokens: dict[EndpointId, int]) -> PrefixHits:
        """Made from a dict of positive counts the caller hands over (not copied, not filtered)."""
        hits = cls.__new__(cls)
        hits._tokens = tokens
        hits._hits_hash = None
        return hits

    def __getitem__(self, key: EndpointId) -> int:
        return self._tokens[key]

    def get_tokens(self, key: EndpointId) -> int:
        """Tokens cached on `key` (0 when none)."""
        return self._tokens.get(key, 0)

    def __iter__(self) -> Iterator[EndpointId]:
        return iter(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def __hash__(self) -> int:
        if self._hits_hash is None:
            self._hits_hash = hash(frozenset(self._tokens.items()))
        return self._hits_hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PrefixHits):
            return self._tokens == other._tokens
        return NotImplemented

    def __repr__(self) -> str:
        return f"PrefixHits({self._tokens!r})"

    @property
    def best(self) -> int:
        """The most tokens any endpoint holds (0: none)."""
        return max(self._tokens.values(), default=0)


#: A request nothing is known to be cached for (the default).
NO_HITS: Final = PrefixHits()


def uncached(prompt: int, cached: int) -> int:
    """The tokens an engine prefills of a `prompt`-token prompt of which `cached` are in its cache: at
    least one (an engine recomputes the last prompt token even on a full hit, to get its logits)."""
    if cached <= 0:
        return prompt
    return max(1, prompt - cached) if prompt > 0 else prompt
