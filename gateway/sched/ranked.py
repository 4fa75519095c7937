"""A queue's requests by rank, for orderings that keep a ranked queue (`RankedOrdering`).

A rank is (group, position): the ordering gives each queued request one when it joins (again when its
request changes, or when the ordering's `rank_epoch` for the model moves, e.g. after a refit), and the
index keeps each group sorted by (position, arrival order). The ordering then finds the request to serve
next with a few binary searches (`first_from`) instead of a key per waiting request.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Set
from typing import Final

from gateway.sched.interfaces import Rank

#: Position before every other (a search from it finds a group's first request).
FIRST: Final = -float("inf")

_Entry = tuple[float, int, int]  # (position, seq, token)


class RankIndex:
    """Ranked tokens of one queue, each group a list sorted by (position, seq)."""

    __slots__ = ("_groups", "_of", "epoch", "ordering")

    def __init__(self, ordering: object, epoch: Hashable) -> None:
        self.ordering = ordering  # the ordering the ranks were given by
        self.epoch = epoch  # its rank epoch then
        self._groups: dict[int, list[_Entry]] = {}
        self._of: dict[int, tuple[int, _Entry]] = {}  # token -> (group, entry)

    def __len__(self) -> int:
        return len(self._of)

    def add(self, token: int, seq: int, rank: Rank) -> None:
        group, position = rank
        entry = (position, seq, token)
        self._of[token] = (group, entry)
        entries = self._groups.get(group)
        if entries is None:
            self._groups[group] = [entry]
        else:
            insort(entries, entry)

    def discard(self, token: int) -> bool:
        """Forget `token`; False when it had no rank."""
        got = self._of.pop(token, None)
        if got is None:
            return False
        group, entry = got
        entries = self._groups[group]
        del entries[bisect_left(entries, entry)]
        return True

    def first_from(self, group: int, at: float, skipped: Set[int]) -> tuple[float, int] | None:
        """(position, token) of the first request of `group` whose position is `at` or later (ties in
        arrival order), leaving out the requests whose seq is in `skipped`; None when there is none."""
        entries = self._groups.get(group)
        if not entries:
            return None
        i = bisect_left(entries, (at, -1, -1)) if at != FIRST else 0
        n = len(entries)
        while i < n:
            position, seq, token = entries[i]
            if seq not in skipped:
                return position, token
            i += 1
        return None
