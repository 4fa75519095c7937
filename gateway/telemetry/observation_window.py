"""A performance model part's window of observations: a bounded ring of rows of floats in preallocated
arrays (`gateway.telemetry.perfmodel` fits each part over one)."""

from __future__ import annotations

import numpy as np

from gateway.telemetry.robust_regression import Array


class ObservationWindow:
    """A bounded window of observations (rows of floats) in preallocated arrays; O(1) append."""

    __slots__ = ("_data", "_head", "_len", "total")

    def __init__(self, size: int, width: int) -> None:
        self._data = np.zeros((size, width))
        self._head = 0  # where the next row goes
        self._len = 0
        self.total = 0  # rows ever appended (the window keeps the last `size`)

    def __len__(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        return len(self._data)

    def append(self, *row: float) -> None:
        self._data[self._head] = row
        self._head = (self._head + 1) % len(self._data)
        self._len = min(self._len + 1, len(self._data))
        self.total += 1

    def rows(self) -> Array:
        """The observations, oldest first."""
        if self._len < len(self._data):
            return self._data[: self._len].copy()
        return np.concatenate((self._data[self._head :], self._data[: self._head]))

    def newest(self, n: int) -> list[list[float]]:
        """The `n` newest observations (at most the window), oldest first, as plain floats."""
        n = min(n, self._len)
        head = self._head
        if n <= head:
            rows: list[list[float]] = self._data[head - n : head].tolist()
            return rows
        older: list[list[float]] = self._data[len(self._data) - (n - head) :].tolist()
        newer: list[list[float]] = self._data[:head].tolist()
        return older + newer
