"""The order of one replica's seat changes in Redis against its reconcile.

A replica's seats live in Redis as one number per tenant (`s:REPLICA` in the tenant's hash): admissions
add to it, releases and slice give-backs take from it, and the reconcile overwrites it with the count the
replica holds. An overwrite is only right if nothing the replica sent is still on its way: an admission
under way may or may not take a seat, and a release sent just before or just after the overwrite is
applied before or after it, in an order the replica cannot know (its calls travel on different
connections). So the reconcile runs alone: no new seat change starts while it waits for the ones under
way to be answered (or given up after `[cluster] timeout_s`), takes its count and is answered; then the
changes held back go. The count it writes is then exact: no seat too many (a refused admission counted),
none too few (a release overwritten, or an admission applied before the overwrite it was not in).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class SeatOrder:
    def __init__(self) -> None:
        self.under_way = 0  # seat changes sent, not answered
        self._open = asyncio.Event()  # clear while a reconcile runs: new seat changes wait
        self._open.set()
        self._idle = asyncio.Event()  # set while no seat change is under way
        self._idle.set()
        self._alone = asyncio.Lock()
        self.held_back = 0  # seat changes that waited for a reconcile (a figure for /admin/cluster)

    @contextlib.asynccontextmanager
    async def change(self) -> AsyncIterator[None]:
        """Around one call that may change this replica's seats in Redis (compute what it sends inside:
        a reconcile may have changed it while the call waited)."""
        if not self._open.is_set():
            self.held_back += 1
            while not self._open.is_set():
                await self._open.wait()
        self.under_way += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.under_way -= 1
            if not self.under_way:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Around the reconcile: once every seat change under way was answered, none starts until it ends.
        Never entered from inside `change` (it would wait for itself)."""
        async with self._alone:
            self._open.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._open.set()
