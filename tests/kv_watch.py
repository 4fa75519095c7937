"""A PreciseStore that wakes a waiting test on every call (no sleeps: the test awaits a condition)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.core.clock import SystemClock
from gateway.core.kvevents import KvBatch
from gateway.telemetry.prefix_precise import PreciseStore


class WatchedStore(PreciseStore):
    """A PreciseStore that wakes the test on every call."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint, now=SystemClock().now(), rebuild_s=3600.0)
        self.changed = asyncio.Event()

    def _poke(self) -> None:
        self.changed.set()

    def connected(self, now: float) -> None:
        super().connected(now)
        self._poke()

    def disconnected(self, now: float) -> None:
        super().disconnected(now)
        self._poke()

    def on_live(self, seq: int, batch: KvBatch, now: float, wall: float) -> int | None:
        r = super().on_live(seq, batch, now, wall)
        self._poke()
        return r

    def rebuild(self, now: float, seq: int) -> None:
        super().rebuild(now, seq)
        self._poke()

    def end_replay(self, now: float, upto: int) -> bool:
        r = super().end_replay(now, upto)
        self._poke()
        return r

    def on_replayed(self, seq: int, batch: KvBatch, now: float, wall: float) -> None:
        super().on_replayed(seq, batch, now, wall)
        self._poke()

    async def until(self, pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not pred():
                self.changed.clear()
                await self.changed.wait()
