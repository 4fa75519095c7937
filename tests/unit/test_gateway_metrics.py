"""The per-request metrics' lock-free paths (gateway.core.metrics) expose exactly what prometheus_client's
own Histogram and Counter do for the same updates."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from gateway.core.metrics import LATENCY_BUCKETS, BatchHistogram, LoopCounter

VALUES = [0.0, 0.001, 0.005, 0.0051, 0.3, 0.75, 2.5, 79.9, 80.0, 80.1, 1e6, 0.02, 0.02]


def _exposition(histogram: type[Histogram], counter: type[Counter]) -> bytes:
    r = CollectorRegistry()
    h = histogram("h_seconds", "h", ["model"], buckets=LATENCY_BUCKETS, registry=r)
    c = counter("c", "c", ["model", "outcome"], registry=r)
    for v in VALUES:
        h.labels("m").observe(v)
        c.labels("m", "ok").inc()
        c.labels("m", "ok").inc(v)
    return b"\n".join(
        line for line in generate_latest(r).splitlines() if b"_created" not in line
    )  # creation times differ between the two registries


def test_lock_free_updates_expose_what_prometheus_client_does() -> None:
    assert _exposition(BatchHistogram, LoopCounter) == _exposition(Histogram, Counter)


def test_batch_observation_equals_one_by_one() -> None:
    one, many = (
        BatchHistogram("h_seconds", "h", ["model"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
        for _ in range(2)
    )
    for v in VALUES:
        one.labels("m").observe(v)
    many.labels("m").observe_many(VALUES)

    def values(h: BatchHistogram) -> list[float]:
        return [s.value for m in h.collect() for s in m.samples if not s.name.endswith("_created")]

    assert values(one) == values(many)


def test_a_counter_still_refuses_a_negative_amount() -> None:
    r = CollectorRegistry()
    c = LoopCounter("c", "c", ["model"], registry=r)
    with pytest.raises(ValueError, match="non-negative"):
        c.labels("m").inc(-1)
    assert r.get_sample_value("c_total", {"model": "m"}) == 0.0
