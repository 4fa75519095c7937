"""Cross-checks the engine's own latency histograms against what the gateway measures itself.

The engine exports cumulative histograms (vLLM `time_to_first_token_seconds`, ...); the difference
between two scrapes is what it saw in between. The gateway times the same streams from dispatch to
first token and between tokens. Their means should roughly agree: the gateway's include the network
and HTTP framing, so they run a little higher. A large disagreement means clock trouble (a stalled
event loop), metric trouble (a misbehaving exporter, an engine behind a proxy that also takes other
traffic) or a wrong engine behind the URL, and is reported as a metric rather than acted on.

`CrossCheck` collects both sides until each has `min_samples` observations, then gives one verdict
(the ratio gateway mean / engine mean) and starts a new window. Sans-IO; counter resets of the engine
(a restart) start the engine side over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class CumulativeDelta:
    """Turns successive (count, sum) readings of a cumulative histogram into increments."""

    __slots__ = ("_count", "_sum")

    def __init__(self) -> None:
        self._count: float | None = None
        self._sum = 0.0

    def advance(self, count: float, total: float) -> tuple[float, float] | None:
        """The (count, sum) added since the last reading; None on the first reading, on a reset
        (the count went down: the engine restarted) and on unusable values."""
        if not (math.isfinite(count) and math.isfinite(total)):
            return None
        prev, prev_sum = self._count, self._sum
        self._count, self._sum = count, total
        if prev is None or count < prev:
            return None
        return count - prev, total - prev_sum


@dataclass(frozen=True, slots=True)
class Verdict:
    gateway_mean_s: float
    engine_mean_s: float
    ratio: float  # gateway mean / engine mean
    disagrees: bool


class CrossCheck:
    """One quantity (TTFT or ITL) of one endpoint."""

    __slots__ = (
        "_eng_n",
        "_eng_sum",
        "_gw_n",
        "_gw_sum",
        "floor_s",
        "last",
        "min_samples",
        "tolerance",
    )

    def __init__(self, *, min_samples: int = 20, tolerance: float = 2.0, floor_s: float = 0.005) -> None:
        if min_samples < 1 or not tolerance > 1.0:
            raise ValueError("need min_samples >= 1 and tolerance > 1")
        self.min_samples = min_samples
        self.tolerance = tolerance
        # Below this both means are noise (loopback engines answer in microseconds): never a disagreement.
        self.floor_s = floor_s
        self._gw_n = 0
        self._gw_sum = 0.0
        self._eng_n = 0.0
        self._eng_sum = 0.0
        self.last: Verdict | None = None

    def gateway(self, total_s: float, n: int) -> None:
        """`n` gateway measurements adding up to `total_s`."""
        if n > 0 and math.isfinite(total_s):
            self._gw_n += n
            self._gw_sum += total_s

    def engine(self, count: float, total_s: float) -> None:
        """An increment of the engine's histogram (from CumulativeDelta)."""
        if count > 0 and math.isfinite(total_s) and total_s >= 0:
            self._eng_n += count
            self._eng_sum += total_s

    def verdict(self) -> Verdict | None:
        """A verdict when both sides have `min_samples` since the last one (then a new window starts)."""
        if self._gw_n < self.min_samples or self._eng_n < self.min_samples:
            return None
        gw = self._gw_sum / self._gw_n
        eng = self._eng_sum / self._eng_n
        self._gw_n, self._gw_sum, self._eng_n, self._eng_sum = 0, 0.0, 0.0, 0.0
        if max(gw, eng) < self.floor_s:
            v = Verdict(gw, eng, 1.0, False)
        elif eng <= 0.0:
            v = Verdict(gw, eng, math.inf, True)
        else:
            ratio = gw / eng
            v = Verdict(gw, eng, ratio, not 1.0 / self.tolerance <= ratio <= self.tolerance)
        self.last = v
        return v
