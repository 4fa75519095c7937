"""Prometheus families of the prefix index, read from `PrefixIndex` at scrape time (nothing is updated
on the request path).

| family | labels | meaning |
| --- | --- | --- |
| berth_prefix_cached_blocks | endpoint | blocks the index holds for the endpoint (its source's) |
| berth_prefix_capacity_blocks | endpoint | blocks the approximate index keeps at most (from KV capacity) |
| berth_prefix_predicted_hit_ratio | endpoint | prompt tokens predicted cached at dispatch / dispatched |
| berth_prefix_engine_hit_ratio | endpoint | the engine's own prefix-cache hit rate, last scrape interval |
| berth_prefix_correction_ratio | endpoint | engine-measured over predicted hits (applied to prefill fits) |
| berth_prefix_event_lag_seconds | endpoint | how far the precise source's KV events are behind |
| berth_prefix_source_info | endpoint, source | 1 for the source answering for the endpoint |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.telemetry.prefix_index import PrefixIndex


class PrefixCollector:
    def __init__(self, index: Callable[[], PrefixIndex]) -> None:
        self._index = index

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        index = self._index()

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("endpoint",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        cached = gauge("berth_prefix_cached_blocks", "Blocks the prefix index holds for the endpoint")
        capacity = gauge("berth_prefix_capacity_blocks", "Blocks the approximate prefix index keeps at most")
        predicted = gauge(
            "berth_prefix_predicted_hit_ratio",
            "Prompt tokens predicted cached at dispatch over those dispatched",
        )
        engine = gauge(
            "berth_prefix_engine_hit_ratio", "The engine's prefix-cache hit rate (last scrape interval)"
        )
        correction = gauge(
            "berth_prefix_correction_ratio",
            "Engine-measured over predicted cached tokens (applied to the fits)",
        )
        lag = gauge("berth_prefix_event_lag_seconds", "Delay of the precise source's KV events")
        source = gauge(
            "berth_prefix_source_info", "The prefix index's source for the endpoint", ("endpoint", "source")
        )
        for eid in index.endpoints():
            s = index.stats(eid)
            if s is None:
                continue
            e = [str(eid)]
            cached.add_metric(e, s.cached_blocks)
            capacity.add_metric(e, s.capacity_blocks)
            if s.predicted_hit_rate is not None:
                predicted.add_metric(e, s.predicted_hit_rate)
            if s.engine_hit_rate is not None:
                engine.add_metric(e, s.engine_hit_rate)
            correction.add_metric(e, s.correction)
            if s.event_lag_s is not None:
                lag.add_metric(e, s.event_lag_s)
            source.add_metric([str(eid), s.source], 1.0)
        yield from (cached, capacity, predicted, engine, correction, lag, source)
