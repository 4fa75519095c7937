"""The per-request metrics' lock-free paths (gateway.core.metrics) expose exactly what prometheus_client's
own Histogram and Counter do for the same updates, and a model's finished requests written in one call
expose what writing each metric's child would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from gateway.core.metrics import LATENCY_BUCKETS, BatchHistogram, GatewayMetrics, LoopCounter

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


# (outcome, queue wait, e2e, ttft, gaps, output tokens, prompt tokens) of finished requests, in order.
_FINISHED: list[tuple[str, float | None, float | None, float | None, list[float], int, int | None]] = [
    ("invalid_request", None, None, None, [], 0, None),  # refused before dispatch: only counted
    ("ok", 0.001, 0.2, 0.05, [], 16, 12),
    ("ok", 0.003, 1.4, 0.02, [0.01, 0.02, 0.5], 4, None),
    ("engine_error", 0.002, 0.3, None, [], 0, 0),
]


def _written(by_model: bool) -> bytes:
    m = GatewayMetrics(CollectorRegistry())
    for outcome, queue, e2e, ttft, gaps, out, prompt in _FINISHED:
        if by_model:
            m.of_model("m").finished(outcome, queue, e2e, ttft, gaps, out, prompt)
            continue
        m.requests_of("m", outcome).inc()  # one child at a time, each made when first written
        if queue is not None:
            m.queue_wait_of("m").observe(queue)
        if e2e is not None:
            m.e2e_of("m").observe(e2e)
        if ttft is not None:
            m.ttft_of("m").observe(ttft)
        if gaps:
            m.itl_of("m").observe_many(gaps)
        if out:
            m.output_tokens_of("m").inc(out)
        if prompt:
            m.prompt_tokens_of("m").inc(prompt)
    return b"\n".join(line for line in m.render().splitlines() if b"_created" not in line)


def test_a_models_finished_requests_write_what_each_child_would() -> None:
    """`ModelRequestMetrics.finished` writes the same series and values as writing each child through
    `Children` (a series appears when first written), after the first request and after all."""
    assert _written(by_model=True) == _written(by_model=False)
    m = GatewayMetrics(CollectorRegistry())
    m.of_model("m").finished(*_FINISHED[0])
    assert m.of_model("m") is m.of_model("m")
    assert b'berth_request_ttft_seconds_count{model="m"}' not in m.render()  # not written yet
