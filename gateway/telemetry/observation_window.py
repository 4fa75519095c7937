"""A performance model part's window of observations: a bounded ring of rows of floats in arrays that
grow to the window's size as observations come (`gateway.telemetry.perfmodel` fits each part over one)."""

from __future__ import annotations

from typing import Final

import numpy as np

from gateway.telemetry.robust_regression import Array

#: Rows a window holds room for at first; doubled as it fills, up to its size. An endpoint has four
#: windows of 2,000 rows: preallocated, 144 KiB per endpoint whether it ever sees a request or not.
FIRST_ROOM: Final = 64


class ObservationWindow:
    """A bounded window of observations (rows of floats); O(1) append (amortised while it grows)."""

    __slots__ = ("_data", "_head", "_len", "_size", "total")

    def __init__(self, size: int, width: int) -> None:
        self._size = size
        self._data = np.zeros((min(size, FIRST_ROOM), width))
        self._head = 0  # where the next row goes
        self._len = 0
        self.total = 0  # rows ever appended (the window keeps the last `size`)

    def __len__(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        return self._size

    def append(self, *row: float) -> None:
        data = self._data
        room = len(data)
        if self._len == room < self._size:  # full room, not yet the window's size: more room
            more = np.zeros((min(room, self._size - room), data.shape[1]))
            data = self._data = np.concatenate((data, more))
            self._head = room  # it never wrapped: the rows are in order, the next one after them
            room = len(data)
        data[self._head] = row
        self._head = (self._head + 1) % room
        self._len = min(self._len + 1, room)
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
