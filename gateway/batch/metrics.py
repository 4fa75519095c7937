"""The batch subsystem's Prometheus metrics (`berth_batch_*`), on the gateway's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry(auto_describe=True)
        self.lines = Counter(
            "berth_batch_lines",
            "Batch lines answered, by outcome (ok: 200; error: an HTTP error; expired: the window ended)",
            ["outcome"],
            registry=r,
        )
        self.retries = Counter(
            "berth_batch_line_retries",
            "Batch lines the gateway had no room for (queue, tenant limit, no ready endpoint), tried again",
            registry=r,
        )
        self.tokens = Counter(
            "berth_batch_tokens",
            "Tokens of answered batch lines, by kind (input, output)",
            ["kind"],
            registry=r,
        )
        self.in_flight = Gauge(
            "berth_batch_lines_in_flight", "Batch lines in the scheduler or at an engine now", registry=r
        )
        self.active = Gauge("berth_batch_active_batches", "Batches being run or finalized now", registry=r)
        self.finalize_failures = Counter(
            "berth_batch_finalize_failures",
            "Finalizations that failed (a full disk, most often) and will be tried again",
            registry=r,
        )
        self.finished = Counter(
            "berth_batch_batches", "Batches that reached a final status, by status", ["status"], registry=r
        )
