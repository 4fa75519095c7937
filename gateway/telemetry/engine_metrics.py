"""The metric half of the engine dialects: where vLLM and SGLang keep their health, model list and
metrics, what the metrics are called, and how to read gauges and histograms from a page.

Metric names (checked against the engines' sources):

vLLM V1 (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`), label names `model_name` and `engine`
(one label set per data-parallel engine core):
- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
  ("KV-cache usage. 1 means 100 percent usage": a fraction 0..1 despite the name); until 0.10 also the
  deprecated twin `vllm:gpu_cache_usage_perc` with the same value (the only name before 0.9);
- counters `vllm:prompt_tokens_total`, `vllm:generation_tokens_total` (prometheus_client adds `_total`);
- histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds` (0.11+; before
  that `vllm:time_per_output_token_seconds`, and 0.10/0.11 emit both with identical data),
  `vllm:e2e_request_latency_seconds`.

SGLang (`sglang/srt/metrics/collector.py`), labels `model_name` plus, on scheduler gauges,
`engine_type`, `tp_rank`, `pp_rank` (and more with DP attention / PD disaggregation):
- gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (used KV tokens /
  pool size, a fraction 0..1);
- counters `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`;
- histograms `sglang:time_to_first_token_seconds`, `sglang:inter_token_latency_seconds` (older releases:
  `sglang:time_per_output_token_seconds`, a per-request average), `sglang:e2e_request_latency_seconds`.
SGLang writes `sglang:`; the same series also circulate as `sglang_...` (the sgl-router's aggregated
`/engine_metrics` and Prometheus-normalised copies), and newer `prometheus_client` releases write
`vllm_...`/`sglang_...` sample names in OpenMetrics output, so both spellings are read.

When an engine emits a new name next to its deprecated twin the values are the same series twice, so a
dialect reads the first name present in its list and never adds names together. Across label sets of
one name it adds (requests, tokens) or averages (KV fraction: vLLM's own log line averages
`kv_cache_usage` over its engines).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import orjson

from gateway.core.types import EngineGauges, EngineKind
from gateway.telemetry.capacity import CAPACITY_SAMPLES
from gateway.telemetry.promtext import Exposition, Histogram, Sample

#: What a scrape reads of a latency histogram: base + one of these. Its buckets are not read: the
#: cross-checks take the engine's mean (the increments of `_sum` over those of `_count`), and the
#: buckets were most of a page's lines.
_SCRAPED_HISTOGRAM_SUFFIXES: Final = ("_count", "_sum")


def _spellings(base: str, *prefixes: str) -> tuple[str, ...]:
    return tuple(p + base for p in prefixes)


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """Where one kind of engine reports its state, and what its metrics are called. Name tuples are in
    order of preference."""

    kind: EngineKind
    prefixes: tuple[str, ...]  # metric-name prefixes that identify the engine
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]  # a fraction 0..1
    ttft: tuple[str, ...]  # histogram base names
    itl: tuple[str, ...]
    e2e: tuple[str, ...]
    prompt_tokens: tuple[str, ...]  # counter sample names
    generation_tokens: tuple[str, ...]
    # Prefix cache: cumulative hit and query tokens (vLLM), or a hit-rate gauge (SGLang).
    prefix_hits: tuple[str, ...] = ()
    prefix_queries: tuple[str, ...] = ()
    cache_hit_rate: tuple[str, ...] = ()
    health_path: str = "/health"
    models_path: str = "/v1/models"
    metrics_path: str = "/metrics"
    #: The sample names a scrape reads (the rest of the page is skipped, `PromParser.start`): the
    #: gauges, the TTFT and ITL histograms' `_count` and `_sum` (and their HELP and TYPE lines: what
    #: the engine cross-checks read, `EndpointTelemetry.observe_scrape`; not their buckets), the
    #: token counters and the KV capacity. Not the e2e latency histogram: nothing reads it live. The
    #: histograms read from such a page have no buckets (count and sum as from the whole page).
    scraped: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        histograms = (*self.ttft, *self.itl)
        names = {
            *self.running,
            *self.waiting,
            *self.kv_usage,
            *histograms,
            *(base + suffix for base in histograms for suffix in _SCRAPED_HISTOGRAM_SUFFIXES),
            *self.prompt_tokens,
            *self.generation_tokens,
            *self.prefix_hits,
            *self.prefix_queries,
            *self.cache_hit_rate,
            *CAPACITY_SAMPLES,
        }
        object.__setattr__(self, "scraped", frozenset(names))

    def gauges(self, expo: Exposition) -> EngineGauges:
        """Running, waiting and KV usage for the whole endpoint (summed / averaged over label sets)."""
        running = _total(expo, self.running)
        waiting = _total(expo, self.waiting)
        kv = _mean(expo, self.kv_usage)
        return EngineGauges(
            running=None if running is None else max(0.0, running),
            waiting=None if waiting is None else max(0.0, waiting),
            kv_usage=None if kv is None else min(1.0, max(0.0, kv)),
        )

    def ttft_histogram(self, expo: Exposition) -> Histogram | None:
        return _histogram(expo, self.ttft)

    def itl_histogram(self, expo: Exposition) -> Histogram | None:
        return _histogram(expo, self.itl)

    def e2e_histogram(self, expo: Exposition) -> Histogram | None:
        return _histogram(expo, self.e2e)

    def prompt_tokens_total(self, expo: Exposition) -> float | None:
        return _total(expo, self.prompt_tokens)

    def generation_tokens_total(self, expo: Exposition) -> float | None:
        return _total(expo, self.generation_tokens)

    def prefix_cache(self, expo: Exposition) -> tuple[float | None, float | None, float | None]:
        """(hit tokens, query tokens, hit rate) of the engine's prefix cache; None where not exported."""
        return (
            _total(expo, self.prefix_hits),
            _total(expo, self.prefix_queries),
            _mean(expo, self.cache_hit_rate),
        )

    def served_models(self, body: bytes) -> list[str]:
        return served_models(body)

    def speaks(self, expo: Exposition) -> bool:
        """Whether the page carries this engine's scheduler gauges."""
        return any(expo.has(name) for name in self.running)


VLLM_METRICS: Final = EngineMetrics(
    kind=EngineKind.VLLM,
    prefixes=("vllm:", "vllm_"),
    running=_spellings("num_requests_running", "vllm:", "vllm_"),
    waiting=_spellings("num_requests_waiting", "vllm:", "vllm_"),
    kv_usage=(
        *_spellings("kv_cache_usage_perc", "vllm:", "vllm_"),
        *_spellings("gpu_cache_usage_perc", "vllm:", "vllm_"),
    ),
    ttft=_spellings("time_to_first_token_seconds", "vllm:", "vllm_"),
    itl=(
        *_spellings("inter_token_latency_seconds", "vllm:", "vllm_"),
        *_spellings("time_per_output_token_seconds", "vllm:", "vllm_"),
    ),
    e2e=_spellings("e2e_request_latency_seconds", "vllm:", "vllm_"),
    prompt_tokens=_spellings("prompt_tokens_total", "vllm:", "vllm_"),
    generation_tokens=_spellings("generation_tokens_total", "vllm:", "vllm_"),
    # V1 names; before them (V0) `gpu_prefix_cache_*` with the same meaning.
    prefix_hits=(
        *_spellings("prefix_cache_hits_total", "vllm:", "vllm_"),
        *_spellings("gpu_prefix_cache_hits_total", "vllm:", "vllm_"),
    ),
    prefix_queries=(
        *_spellings("prefix_cache_queries_total", "vllm:", "vllm_"),
        *_spellings("gpu_prefix_cache_queries_total", "vllm:", "vllm_"),
    ),
)

SGLANG_METRICS: Final = EngineMetrics(
    kind=EngineKind.SGLANG,
    prefixes=("sglang:", "sglang_"),
    running=_spellings("num_running_reqs", "sglang:", "sglang_"),
    waiting=_spellings("num_queue_reqs", "sglang:", "sglang_"),
    kv_usage=_spellings("token_usage", "sglang:", "sglang_"),
    ttft=_spellings("time_to_first_token_seconds", "sglang:", "sglang_"),
    itl=(
        *_spellings("inter_token_latency_seconds", "sglang:", "sglang_"),
        *_spellings("time_per_output_token_seconds", "sglang:", "sglang_"),
    ),
    e2e=_spellings("e2e_request_latency_seconds", "sglang:", "sglang_"),
    prompt_tokens=_spellings("prompt_tokens_total", "sglang:", "sglang_"),
    generation_tokens=_spellings("generation_tokens_total", "sglang:", "sglang_"),
    cache_hit_rate=_spellings("cache_hit_rate", "sglang:", "sglang_"),
)

ENGINE_METRICS: Final[tuple[EngineMetrics, ...]] = (VLLM_METRICS, SGLANG_METRICS)
_BY_KIND: Final[dict[EngineKind, EngineMetrics]] = {m.kind: m for m in ENGINE_METRICS}


def metrics_for(kind: EngineKind) -> EngineMetrics:
    return _BY_KIND[kind]


def detect_engine(expo: Exposition) -> EngineKind | None:
    """Which engine served this page: the one whose scheduler gauges are on it, else the one whose
    metric prefix is on it. None when neither or both (a page that mixes engines is not an engine's)."""
    speaking = [d.kind for d in ENGINE_METRICS if d.speaks(expo)]
    if len(speaking) == 1:
        return speaking[0]
    if speaking:
        return None
    prefixed = {d.kind for d in ENGINE_METRICS for name in expo.sample_names() if name.startswith(d.prefixes)}
    return prefixed.pop() if len(prefixed) == 1 else None


def served_models(body: bytes) -> list[str]:
    """Model ids from an OpenAI `GET /v1/models` body (`{"object": "list", "data": [{"id": ...}]}`),
    in order, without repeats. vLLM lists LoRA adapters there too (with `parent` set): they are
    servable names. Raises ValueError when the body is not that shape."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"models list is not JSON: {e}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("models list has no 'data' array")
    out: list[str] = []
    for item in data:
        model_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(model_id, str) or not model_id:
            raise ValueError("models list has an entry without a string 'id'")
        if model_id not in out:
            out.append(model_id)
    return out


def _first_present(expo: Exposition, names: Iterable[str]) -> str | None:
    for name in names:
        if expo.has(name):
            return name
    return None


def _finite(expo: Exposition, name: str) -> list[float]:
    return [s.value for s in expo.samples(name) if math.isfinite(s.value)]


def _total(expo: Exposition, names: Iterable[str]) -> float | None:
    name = _first_present(expo, names)
    if name is None:
        return None
    values = _finite(expo, name)
    return sum(values) if values else None


def _mean(expo: Exposition, names: Iterable[str]) -> float | None:
    name = _first_present(expo, names)
    if name is None:
        return None
    values = _finite(expo, name)
    return sum(values) / len(values) if values else None


def _histogram(expo: Exposition, names: Iterable[str]) -> Histogram | None:
    for name in names:
        if expo.has(name + "_bucket") or expo.has(name + "_count"):
            return expo.histogram(name)
    return None


class HistogramReader:
    """Reads one histogram (names in order of preference, as a dialect's `ttft` or `itl`) from one
    endpoint's successive pages, and derives it again only when its samples changed: between two
    scrapes of an idle engine nothing changes, and deriving one (grouping, sorting, merging 20-odd
    buckets) cost more than the rest of what a scrape's sink does. The samples (`_bucket`, `_count`,
    `_sum`, with their labels) are the histogram's whole input, so an unchanged stamp gives the same
    histogram as deriving it again (a NaN value never compares equal: that one is derived again)."""

    __slots__ = ("_histogram", "_stamp")

    def __init__(self) -> None:
        self._stamp: tuple[str, tuple[Sample, ...], tuple[Sample, ...], tuple[Sample, ...]] | None = None
        self._histogram: Histogram | None = None

    def read(self, expo: Exposition, names: Iterable[str]) -> Histogram | None:
        for name in names:
            buckets = expo.series(name + "_bucket")
            counts = expo.series(name + "_count")
            if not buckets and not counts:
                continue
            stamp = (name, buckets, counts, expo.series(name + "_sum"))
            if stamp != self._stamp:
                self._histogram = expo.histogram(name)
                self._stamp = stamp
            return self._histogram
        return None
