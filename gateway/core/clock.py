"""Clocks. Everything that reads time takes a Clock so tests can drive it."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...


class SystemClock:
    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to (tests, offline simulator)."""

    __slots__ = ("_t",)

    def __init__(self, start: float = 1000.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._t += seconds

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError("a clock does not go backwards")
        self._t = t
