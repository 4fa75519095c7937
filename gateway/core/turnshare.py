"""How long a background task's slice of work may hold the event loop before it yields.

Background work (telemetry's folding and fitting) shares the loop with the requests, so it runs in
slices with a yield between them. A fixed amount of work per slice does not fit every load: on a loop
turning every few hundred µs a slice must be small, or every turn that holds one is longer by as much
(the lag a timer or a request's next step sees); on a saturated loop, where one turn holds a step of
every request in flight (about 5 ms at 64 connections), a small slice per turn gets too small a share of
the CPU, the work falls behind and is then done in one piece (the fold of a backlog of tens of thousands
of finished requests once stalled the loop 40-120 ms). So a slice runs for `floor_s`, or for `share` of
the loop's last turn as the worker measured it (how long its last yield took to come back) when that is
longer: background work gets about `share` of a busy loop and little of a quiet one's turns.
"""

from __future__ import annotations

import asyncio
from typing import Final

from gateway.core.clock import Clock

#: The shortest slice: a small part of a turn with 8 requests in flight (about 1 ms).
FLOOR_S: Final = 0.0002
#: A slice's length relative to the last turn's, on a busy loop.
SHARE: Final = 0.2


class TurnShare:
    """A worker's slices: `begin` when the work starts, `over` after each piece of it (the slice has
    run its length), `pause` to yield to the loop (and measure the turn that took)."""

    __slots__ = ("_clock", "_floor", "_share", "_start", "budget_s")

    def __init__(self, clock: Clock, *, floor_s: float = FLOOR_S, share: float = SHARE) -> None:
        if not floor_s > 0 or not 0 < share <= 1:
            raise ValueError("floor_s must be > 0 and share in (0, 1]")
        self._clock = clock
        self._floor = floor_s
        self._share = share
        self.budget_s = floor_s  # this slice's length
        self._start = clock.now()

    def begin(self) -> None:
        """A slice starts now."""
        self._start = self._clock.now()

    def over(self) -> bool:
        """The slice has run its length."""
        return self._clock.now() - self._start >= self.budget_s

    async def pause(self) -> None:
        """Yield to the loop once; the next slice starts when it comes back and runs `share` of the time
        that took (at least `floor_s`)."""
        before = self._clock.now()
        await asyncio.sleep(0)
        after = self._start = self._clock.now()
        self.budget_s = max(self._floor, self._share * (after - before))
