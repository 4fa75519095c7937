"""The seam between the prefix index and its sources: one endpoint's blocks as one source knows them.

Both sources key blocks with `gateway.core.blockhash`: the *approximate* source
(`gateway.telemetry.prefix_approx`) by the text berth sent where, in blocks of characters; the
*precise* source by berth's own chain over the token ids each engine reports in its KV events. The
index (`gateway.telemetry.prefix_index`) asks a holder how many of a request's leading keys it holds
and turns blocks into tokens with the holder's `block_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

#: Which source answers for an endpoint.
SourceKind = Literal["approximate", "precise"]


class BlockHolder(Protocol):
    """One endpoint's blocks as one source knows them."""

    @property
    def block_tokens(self) -> int: ...  # tokens per block of this holder's keys

    def matched(self, keys: Sequence[int]) -> int: ...  # how many leading keys are held

    def cached_blocks(self) -> int: ...
