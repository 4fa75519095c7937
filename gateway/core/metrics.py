"""The gateway's Prometheus metrics, on a registry object (no module globals).

Names follow `berth_<subsystem>_<thing>_<unit>`; labels stay low-cardinality (model, endpoint,
outcome, result).

The hot path reaches labelled children through `Children` caches (`m.ttft_of(model)`) instead of
calling `.labels()` per request, the finish phase writes a request's figures through its model's
`ModelRequestMetrics` in one call (one lookup instead of one per metric), and a stream's inter-token
gaps go into their histogram with one `observe_many` call instead of one `observe` per token. The
per-request metrics (`LoopCounter`, `BatchHistogram`) are written by the event loop's thread alone, so
they add without prometheus_client's lock per value (its `observe` locks the count or bucket and the
sum and walks the bounds in Python: 0.7 µs against 0.25; `inc` 0.35 against 0.15; a request makes about
six such updates).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from gateway.core.decisiontime import DecisionCollector, DecisionTimes
from gateway.core.gcpauses import GcCollector, GcPauses
from gateway.core.looplag import RecentLag

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
LAG_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TOKENIZE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)

CONTENT_TYPE = CONTENT_TYPE_LATEST

M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """The labelled children of one metric, each made by `.labels()` on first use and kept.

    A child appears in the exposition when it is first made, exactly as with `.labels()`.
    """

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._cache: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._metric.labels(*values)
        return child


class BatchHistogram(Histogram):
    """A Histogram that also takes a batch of observations in one call (a stream's inter-token gaps).

    `observe_many(xs)` adds to the same buckets and sum as `observe(x)` for each x, but locks each
    bucket once per batch rather than once per value. The values must not be NaN (they are durations).
    `observe(x)` takes no lock: only the event loop's thread observes (the module docstring). Both need
    a labelled child (`Children`), as the hot path always has.
    """

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        self._sum._value += amount
        self._buckets[bisect_left(self._upper_bounds, amount)]._value += 1

    def observe_many(self, amounts: Sequence[float]) -> None:
        if self._labelnames and not self._labelvalues:
            raise ValueError("histogram metric is missing label values")  # as observe() says
        bounds = self._upper_bounds  # ascending, the last one +Inf
        counts = [0] * len(bounds)
        for a in amounts:
            counts[bisect_left(bounds, a)] += 1  # the first bound >= a: Prometheus' `le`
        self._sum.inc(sum(amounts))
        for bucket, n in zip(self._buckets, counts, strict=True):
            if n:
                bucket.inc(n)


class LoopCounter(Counter):
    """A Counter whose labelled children add without a lock: only the event loop's thread increments
    them (the module docstring). Negative amounts are refused, as by `Counter.inc`."""

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value._value += amount


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.requests = LoopCounter(
            "berth_requests", "Requests finished, by model and outcome", ["model", "outcome"], registry=r
        )
        self.ttft = BatchHistogram(
            "berth_request_ttft_seconds",
            "Time to first token seen by the gateway (from arrival, queue included)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = BatchHistogram(
            "berth_request_itl_seconds",
            "Gaps between streamed tokens",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = BatchHistogram(
            "berth_request_e2e_seconds",
            "Arrival to last byte",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = BatchHistogram(
            "berth_queue_wait_seconds",
            "Time spent in the gateway queue",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.output_tokens = LoopCounter(
            "berth_output_tokens", "Output tokens relayed", ["model"], registry=r
        )
        self.prompt_tokens = LoopCounter(
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
        # [telemetry] prompt_tokens = "tokenize": the engine calls that count a prompt exactly.
        self.tokenize_requests = Counter(
            "berth_tokenize_requests",
            "Prompt-token counts asked of an engine, by result (anything but ok: the estimate is used)",
            ["result"],
            registry=r,
        )
        self.tokenize_duration = Histogram(
            "berth_tokenize_duration_seconds",
            "Duration of the engine tokenize calls that were made (timeouts included)",
            buckets=TOKENIZE_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "berth_event_loop_lag_seconds",
            "How late the event loop ran a timer (gateway.core.looplag): time it spent on other work",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        # The same samples as they were, for GET /admin/loop-lag (the monitor feeds this; it feeds the
        # histogram).
        self.loop_lag_recent = RecentLag(self.loop_lag)
        # The scheduler's call times (the live driver records them; exported at scrape time).
        self.decisions = DecisionTimes()
        r.register(DecisionCollector(self.decisions))
        # The cyclic collector's pauses (the GC schedule installs the callback; exported at scrape time).
        self.gc_pauses = GcPauses()
        r.register(GcCollector(self.gc_pauses))
        # Preemption (gateway.dispatch.runner): requests that gave up their seat to more urgent work, and
        # how their resumed streams ended.
        self.preemptions = Counter(
            "berth_preemptions",
            "Running requests preempted, by the policy's reason",
            ["model", "reason"],
            registry=r,
        )
        self.resumes = Counter(
            "berth_resumes",
            "Preempted requests by how their resumed stream ended",
            ["model", "outcome"],
            registry=r,
        )
        self.recomputed_tokens = Counter(
            "berth_recomputed_tokens",
            "Tokens an engine recomputed as prompt to resume preempted requests",
            ["model"],
            registry=r,
        )
        # The per-request metrics' children, by label values (see Children).
        self.requests_of = Children(self.requests)
        self.ttft_of = Children(self.ttft)
        self.itl_of = Children(self.itl)
        self.e2e_of = Children(self.e2e)
        self.queue_wait_of = Children(self.queue_wait)
        self.output_tokens_of = Children(self.output_tokens)
        self.prompt_tokens_of = Children(self.prompt_tokens)
        self.client_disconnects_of = Children(self.client_disconnects)
        self.upstream_retries_of = Children(self.upstream_retries)
        self.tokenize_requests_of = Children(self.tokenize_requests)
        self.preemptions_of = Children(self.preemptions)
        self.resumes_of = Children(self.resumes)
        self.recomputed_tokens_of = Children(self.recomputed_tokens)
        self._models: dict[str, ModelRequestMetrics] = {}

    def of_model(self, model: str) -> ModelRequestMetrics:
        """The per-request metrics of the label value `model` (kept once made)."""
        mm = self._models.get(model)
        if mm is None:
            mm = self._models[model] = ModelRequestMetrics(self, model)
        return mm

    def attach_live(self, read: Callable[[], LiveNumbers]) -> None:
        """Export numbers read from the scheduler at scrape time (nothing to update on the hot path)."""
        self.registry.register(_LiveCollector(read))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelRequestMetrics:
    """The metrics a finished request of one model writes (`GatewayMetrics.of_model`), in one call.

    Each labelled child is the one `Children` keeps (`m.ttft_of(model)` is the same object), made when
    it is first written: a series appears in the exposition exactly when writing through `Children`
    would make it appear."""

    __slots__ = ("_e2e", "_itl", "_metrics", "_model", "_outcomes", "_output", "_prompt", "_queue", "_ttft")

    def __init__(self, metrics: GatewayMetrics, model: str) -> None:
        self._metrics = metrics
        self._model = model
        self._outcomes: dict[str, LoopCounter] = {}
        self._queue: BatchHistogram | None = None
        self._e2e: BatchHistogram | None = None
        self._ttft: BatchHistogram | None = None
        self._itl: BatchHistogram | None = None
        self._output: LoopCounter | None = None
        self._prompt: LoopCounter | None = None

    # Positional on purpose: called once per request, where keywords cost time to match.
    def finished(  # noqa: PLR0917
        self,
        outcome: str,
        queue_wait: float | None,
        e2e: float | None,
        ttft: float | None,
        gaps: Sequence[float],
        output_tokens: int,
        prompt_tokens: int | None,
    ) -> None:
        """One finished request: counted by `outcome`; its time in the queue (None: never dispatched),
        arrival to end (None: not observed), time to first token, inter-token gaps and the tokens the
        engine reported (0 or None: none) observed."""
        m, model = self._metrics, self._model
        c = self._outcomes.get(outcome)
        if c is None:
            c = self._outcomes[outcome] = m.requests_of(model, outcome)
        c.inc()
        if queue_wait is not None:
            h = self._queue
            if h is None:
                h = self._queue = m.queue_wait_of(model)
            h.observe(queue_wait)
        if e2e is not None:
            h = self._e2e
            if h is None:
                h = self._e2e = m.e2e_of(model)
            h.observe(e2e)
        if ttft is not None:
            h = self._ttft
            if h is None:
                h = self._ttft = m.ttft_of(model)
            h.observe(ttft)
        if gaps:
            h = self._itl
            if h is None:
                h = self._itl = m.itl_of(model)
            h.observe_many(gaps)
        if output_tokens:
            t = self._output
            if t is None:
                t = self._output = m.output_tokens_of(model)
            t.inc(output_tokens)
        if prompt_tokens:
            t = self._prompt
            if t is None:
                t = self._prompt = m.prompt_tokens_of(model)
            t.inc(prompt_tokens)


@dataclass(frozen=True, slots=True)
class LiveNumbers:
    queue_depth: Mapping[str, int]  # model -> requests waiting in the gateway queue
    inflight: Mapping[str, int]  # endpoint -> requests the gateway has running there
    cap: Mapping[str, int]  # endpoint -> its concurrency cap in force
    # (endpoint, instance class, request kind) -> requests the gateway runs there of that SLO kind
    running_by_kind: Mapping[tuple[str, str, str], int]
    waiting: int = 0  # requests awaiting the scheduler's decision (queued or about to be placed)
    tasks: int = 0  # asyncio tasks of the process (handlers, background loops): leaks show here
    upstream_in_use: int = 0  # connections to engines held by a call, a scrape or a health check
    upstream_idle: int = 0  # connections to engines kept for reuse
    upstream_pool_total: int = 0  # the most generation-call connections open at once ([upstream] pool_total)


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
        yield GaugeMetricFamily(
            "berth_scheduler_waiting_requests",
            "Requests awaiting the scheduler's decision (admitted, not yet placed or rejected)",
            value=live.waiting,
        )
        yield GaugeMetricFamily(
            "berth_asyncio_tasks",
            "asyncio tasks of the process (request handlers included)",
            value=live.tasks,
        )
        c = GaugeMetricFamily(
            "berth_upstream_connections",
            "Connections to engines: in_use (held by a call, scrape or health check) or idle (pooled)",
            labels=["state"],
        )
        c.add_metric(["in_use"], live.upstream_in_use)
        c.add_metric(["idle"], live.upstream_idle)
        yield c
        yield GaugeMetricFamily(
            "berth_upstream_pool_limit_connections",
            "Generation-call connections to engines open at most ([upstream] pool_total); a request "
            "beyond it waits for one",
            value=live.upstream_pool_total,
        )
        c = GaugeMetricFamily(
            "berth_endpoint_cap_requests",
            "The endpoint's concurrency cap in force (static, or set by an adaptive controller)",
            labels=["endpoint"],
        )
        for eid, n in sorted(live.cap.items()):
            c.add_metric([eid], n)
        yield c
        k = GaugeMetricFamily(
            "berth_endpoint_running_requests",
            "Requests the gateway runs on the endpoint, by the endpoint's instance class and the "
            "requests' SLO kind",
            labels=["endpoint", "instance_class", "kind"],
        )
        for labels, n in sorted(live.running_by_kind.items()):
            k.add_metric(list(labels), n)
        yield k
