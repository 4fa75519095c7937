from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class BlockHolder(Protocol):
    """One endpoint's blocks as one source knows them."""

    @property
    def block_tokens(self) -> int: ...  # tokens per block of this holder's keys
    def matched(self, keys: Sequence[int]) -> int: ...  # how many leading keys are held
    def cached_blocks(self) -> int: ...
