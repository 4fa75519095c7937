"""The gateway's Prometheus metrics, on a registry object (no module globals).

Names follow `berth_<subsystem>_<thing>_<unit>`; labels stay low-cardinality (model, endpoint,
outcome, result).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "berth_requests", "Requests finished, by model and outcome", ["model", "outcome"], registry=r
        )
        self.ttft = Histogram(
            "berth_request_ttft_seconds",
            "Time to first token seen by the gateway (from arrival, queue included)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "berth_request_itl_seconds",
            "Gaps between streamed tokens",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "berth_request_e2e_seconds",
            "Arrival to last byte",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "berth_queue_wait_seconds",
            "Time spent in the gateway queue",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.output_tokens = Counter("berth_output_tokens", "Output tokens relayed", ["model"], registry=r)
        self.prompt_tokens = Counter(
            "berth_prompt_tokens", "Prompt tokens reported by engines", ["model"], registry=r
        )
        self.endpoint_up = Gauge(
            "berth_endpoint_up", "1 when the endpoint is ready", ["endpoint"], registry=r
        )
        self.endpoint_engine_running = Gauge(
            "berth_endpoint_engine_running_requests",
            "Engine-reported running requests (last scrape)",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_engine_waiting = Gauge(
            "berth_endpoint_engine_waiting_requests",
            "Engine-reported waiting requests (last scrape)",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_kv_usage = Gauge(
            "berth_endpoint_kv_usage_ratio", "Engine-reported KV-cache use", ["endpoint"], registry=r
        )
        self.scrapes = Counter(
            "berth_scrape", "Endpoint scrapes by result", ["endpoint", "result"], registry=r
        )
        self.scrape_duration = Histogram(
            "berth_scrape_duration_seconds", "Duration of a scrape round", ["endpoint"], registry=r
        )
        self.upstream_retries = Counter(
            "berth_upstream_retries", "Retries before the first byte", ["endpoint"], registry=r
        )
        self.config_reloads = Counter(
            "berth_config_reloads", "Config reloads by result", ["result"], registry=r
        )
        self.client_disconnects = Counter(
            "berth_client_disconnects", "Clients that went away mid-request", ["model"], registry=r
        )

    def attach_live(self, read: Callable[[], LiveNumbers]) -> None:
        """Export numbers read from the scheduler at scrape time (nothing to update on the hot path)."""
        self.registry.register(_LiveCollector(read))

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class LiveNumbers:
    queue_depth: Mapping[str, int]  # model -> requests waiting in the gateway queue
    inflight: Mapping[str, int]  # endpoint -> requests the gateway has running there


class _LiveCollector:
    def __init__(self, read: Callable[[], LiveNumbers]) -> None:
        self._read = read

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        live = self._read()
        q = GaugeMetricFamily(
            "berth_queue_depth_requests", "Requests waiting in the gateway queue", labels=["model"]
        )
        for model, n in sorted(live.queue_depth.items()):
            q.add_metric([model], n)
        yield q
        f = GaugeMetricFamily(
            "berth_endpoint_inflight_requests",
            "Requests the gateway has running on the endpoint",
            labels=["endpoint"],
        )
        for eid, n in sorted(live.inflight.items()):
            f.add_metric([eid], n)
        yield f
