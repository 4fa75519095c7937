"""Small streaming statistics for telemetry: an EWMA and a window of recent values with quantiles.

Both take one value in O(1) (no sorting, no allocation beyond the ring); quantiles are computed when
someone asks (the refresh loop, the admin API, a Prometheus scrape), never on the request path.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from itertools import compress
from typing import Final

#: Default smoothing: about the last 20 observations carry most of the weight.
DEFAULT_ALPHA: Final = 0.1


class Ewma:
    """Exponentially weighted moving average; the first value seeds it. Non-finite values are ignored."""

    __slots__ = ("alpha", "n", "value")

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.value: float | None = None
        self.n = 0

    def add(self, x: float) -> None:
        if not math.isfinite(x):
            return
        self.n += 1
        v = self.value
        self.value = x if v is None else v + self.alpha * (x - v)


class RecentWindow:
    """The last `size` values; quantiles over them on demand (nearest rank with linear interpolation).

    Held as plain doubles (an `array`, 8 bytes a value instead of a float object and its slot: an
    endpoint's window of 4,096 gaps is 32 KiB, not 128), filled up to `size`, then a ring whose oldest
    value is at `_head`."""

    __slots__ = ("_head", "_size", "_values", "total")

    def __init__(self, size: int = 512) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._size = size
        self._values = array("d")
        self._head = 0  # once full: the oldest value's slot (the next one overwritten)
        self.total = 0  # values ever added (the window holds at most `size` of them)

    def __len__(self) -> int:
        return len(self._values)

    def add(self, x: float) -> None:
        if math.isfinite(x):
            self._put((x,))
            self.total += 1

    def extend(self, xs: Sequence[float]) -> None:
        """Add values known to be finite (durations from a monotonic clock) in a few C-level calls."""
        self._put(xs)
        self.total += len(xs)

    def _put(self, xs: Sequence[float]) -> None:
        values, size = self._values, self._size
        room = size - len(values)
        if room > 0:  # still filling
            if len(xs) <= room:
                values.extend(xs)
                return
            values.extend(xs[:room])
            xs = xs[room:]
        n = len(xs)
        if n >= size:  # the window is the last `size` of them
            self._values = array("d", xs[n - size :])
            self._head = 0
            return
        head = self._head
        first = min(n, size - head)
        values[head : head + first] = array("d", xs[:first])
        if first < n:
            values[: n - first] = array("d", xs[first:])
        self._head = (head + n) % size

    def values(self) -> list[float]:
        """The values held, oldest first."""
        v, head = self._values, self._head
        return v[head:].tolist() + v[:head].tolist() if head else v.tolist()

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1) of the window; None when it is empty."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Iterable[float]) -> list[float | None]:
        """Several quantiles with one sort."""
        wanted = list(qs)
        for q in wanted:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile {q} is outside [0, 1]")
        if not self._values:
            return [None] * len(wanted)
        xs = sorted(self._values)
        last = len(xs) - 1
        out: list[float | None] = []
        for q in wanted:
            pos = q * last
            lo = math.floor(pos)
            hi = min(lo + 1, last)
            out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
        return out

    def mean(self) -> float | None:
        return sum(self.values()) / len(self._values) if self._values else None


class LatencyTracker:
    """One measured quantity (TTFT, ITL, tokens/s): an EWMA plus recent quantiles."""

    __slots__ = ("ewma", "recent")

    def __init__(self, *, alpha: float = DEFAULT_ALPHA, window: int = 512) -> None:
        self.ewma = Ewma(alpha)
        self.recent = RecentWindow(window)

    def add(self, x: float) -> None:
        self.ewma.add(x)
        self.recent.add(x)

    @property
    def n(self) -> int:
        return self.ewma.n

    def summary(self) -> dict[str, float | int | None]:
        """`{"ewma", "p50", "p90", "p99", "n"}` (None where there is no data yet)."""
        p50, p90, p99 = self.recent.quantiles((0.5, 0.9, 0.99))
        return {"ewma": self.ewma.value, "p50": p50, "p90": p90, "p99": p99, "n": self.ewma.n}


class RateMeter:
    """Amounts per second over the last `window_s` (e.g. output tokens of finished requests), in
    `bucket_s` buckets: O(1) to add, O(window / bucket) to read."""

    __slots__ = ("_amounts", "_epochs", "_n", "_read", "bucket_s", "window_s")

    def __init__(self, *, window_s: float = 60.0, bucket_s: float = 1.0) -> None:
        if not bucket_s > 0 or not window_s >= bucket_s:
            raise ValueError("need 0 < bucket_s <= window_s")
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._n = math.ceil(window_s / bucket_s)
        self._epochs = [-1] * self._n
        self._amounts = [0.0] * self._n
        # the last total read and the bucket it was read in: the same until the next `add` or bucket
        # (a refresh reads every endpoint's, a refit's hand-over the refitted ones' again)
        self._read: tuple[int, float] | None = None

    def add(self, amount: float, now: float) -> None:
        self._read = None
        epoch = int(now // self.bucket_s)
        slot = epoch % self._n
        if self._epochs[slot] != epoch:
            self._epochs[slot] = epoch
            self._amounts[slot] = 0.0
        self._amounts[slot] += amount

    def total(self, now: float) -> float:
        current = int(now // self.bucket_s)
        read = self._read
        if read is not None and read[0] == current:
            return read[1]  # nothing added since, and the window is the same buckets
        oldest = current - self._n + 1
        epochs = self._epochs
        if oldest <= min(epochs) and max(epochs) <= current:  # every bucket in the window (a busy one):
            total = sum(self._amounts)  # the same sum, in the same order, without the test per bucket
        else:
            # the buckets whose epoch is in the window, in order (a range's membership test, in C)
            total = sum(compress(self._amounts, map(range(oldest, current + 1).__contains__, epochs)))
        self._read = (current, total)
        return total

    def rate(self, now: float) -> float:
        return self.per_second(self.total(now))

    def per_second(self, total: float) -> float:
        """A `total` over the window as a rate (`rate` without reading the buckets again)."""
        return total / (self._n * self.bucket_s)
