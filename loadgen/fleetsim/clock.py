"""The simulation's clock: virtual seconds, moved only by the event loop."""

from __future__ import annotations


class VirtualClock:
    __slots__ = ("t",)

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t
