"""Counters and histograms a simulated engine keeps (sans-IO; rendered by `metrics`)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field


class Histogram:
    """A cumulative Prometheus-style histogram (``le`` upper bounds, plus ``+Inf``)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(bounds):
            raise ValueError("histogram bounds must be sorted")
        self.bounds: tuple[float, ...] = tuple(float(b) for b in bounds)
        self.counts: list[int] = [0] * (len(self.bounds) + 1)  # last slot: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        """Counts per bound (cumulative, ``le`` semantics), the last one being ``+Inf``."""
        out: list[int] = []
        running = 0
        for c in self.counts:
            running += c
            out.append(running)
        return out


@dataclass(frozen=True, slots=True)
class HistogramBuckets:
    ttft: tuple[float, ...]
    itl: tuple[float, ...]
    e2e: tuple[float, ...]
    queue: tuple[float, ...]


@dataclass(slots=True)
class EngineStats:
    buckets: HistogramBuckets
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    preempted_input_tokens: int = 0
    preempted_output_tokens: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    requests_aborted: int = 0
    requests_received: int = 0
    iterations: int = 0
    busy_s: float = 0.0
    ttft: Histogram = field(init=False)
    itl: Histogram = field(init=False)
    e2e: Histogram = field(init=False)
    queue: Histogram = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = Histogram(self.buckets.ttft)
        self.itl = Histogram(self.buckets.itl)
        self.e2e = Histogram(self.buckets.e2e)
        self.queue = Histogram(self.buckets.queue)
