"""`/metrics` of a simulated endpoint: the engine's real metric names, types and labels, rendered as
Prometheus text format 0.0.4 the way ``prometheus_client`` writes it (counters named ``*_total`` in HELP
and TYPE, labels sorted, ``le`` on buckets, floats in Go style). No global registry: every endpoint
renders its own engine's state on each scrape.

vLLM V1 (labels ``engine="0"``, ``model_name``): gauges ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0..1); counters ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``,
``vllm:num_preemptions_total``, ``vllm:request_success_total{finished_reason}``,
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens; 0 with caching off, as
vLLM exports them); histograms
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds``; info gauge
``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``: the KV capacity, and
``enable_prefix_caching``). Counters and histograms also carry ``*_created`` gauges, as vLLM V1's do.
Like current vLLM (the engine tier's recording), it exports no deprecated twins such as
``vllm:gpu_cache_usage_perc``; berth still reads those from older engines.

SGLang (label ``model_name``; scheduler gauges also ``engine_type="unified"``, ``tp_rank``, ``pp_rank``):
gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:token_usage`` (0..1), ``sglang:num_used_tokens``, ``sglang:max_total_num_tokens``,
``sglang:gen_throughput``, ``sglang:cache_hit_rate`` (of the last prefill batch, as SGLang's scheduler
logs it; 0 with caching off); counters ``sglang:prompt_tokens_total``,
``sglang:generation_tokens_total``, ``sglang:num_requests_total``, ``sglang:num_aborted_requests_total``,
``sglang:num_retracted_requests_total`` (preemptions); histograms ``sglang:time_to_first_token_seconds``,
``sglang:inter_token_latency_seconds``, ``sglang:e2e_request_latency_seconds``,
``sglang:queue_time_seconds``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from loadgen.engine_sim.engine import SimEngine
from loadgen.engine_sim.flavors import Flavor
from loadgen.engine_sim.stats import Histogram

Labels = Mapping[str, str]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Every name berth's scraper reads, per flavour (the metrics test checks each one is exported).
VLLM_NAMES: tuple[str, ...] = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:cache_config_info",
)
SGLANG_NAMES: tuple[str, ...] = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cache_hit_rate",
    "sglang:max_total_num_tokens",
)

GARBAGE = "this is not {prometheus text\nvllm:num_requests_running{model_name= 1 2 3\n\x00\xff}}}\n"


def fmt_float(value: float) -> str:
    """Go-style float text, as prometheus_client's floatToGoString."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    s = repr(float(value))
    dot = s.find(".")
    if value > 0 and dot > 6 and "e" not in s:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0").rstrip(".")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = dict(labels)
    if extra is not None:
        items[extra[0]] = extra[1]
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(items.items()))
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    __slots__ = ("_created", "_lines")

    def __init__(self, created_unix: float | None) -> None:
        self._lines: list[str] = []
        self._created = created_unix

    def _head(self, name: str, help_text: str, kind: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def gauge(self, name: str, help_text: str, series: Iterable[tuple[Labels, float]]) -> None:
        self._head(name, help_text, "gauge")
        for labels, value in series:
            self._lines.append(f"{name}{_labels(labels)} {fmt_float(value)}")

    def counter(self, name: str, help_text: str, series: Iterable[tuple[Labels, float]]) -> None:
        """`name` without ``_total``."""
        series = list(series)
        self._head(f"{name}_total", help_text, "counter")
        for labels, value in series:
            self._lines.append(f"{name}_total{_labels(labels)} {fmt_float(value)}")
        self._created_gauge(name, help_text, [labels for labels, _ in series])

    def histogram(self, name: str, help_text: str, labels: Labels, hist: Histogram) -> None:
        self._head(name, help_text, "histogram")
        cumulative = hist.cumulative()
        for bound, count in zip((*hist.bounds, math.inf), cumulative, strict=True):
            le = fmt_float(bound)
            self._lines.append(f"{name}_bucket{_labels(labels, ('le', le))} {fmt_float(count)}")
        self._lines.append(f"{name}_count{_labels(labels)} {fmt_float(hist.count)}")
        self._lines.append(f"{name}_sum{_labels(labels)} {fmt_float(hist.sum)}")
        self._created_gauge(name, help_text, [labels])

    def _created_gauge(self, name: str, help_text: str, label_sets: list[Labels]) -> None:
        if self._created is None:
            return
        created = self._created
        self.gauge(f"{name}_created", help_text, [(labels, created) for labels in label_sets])

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def render(
    flavor: Flavor, engine: SimEngine, model_name: str, *, started_unix: float, gen_throughput: float = 0.0
) -> str:
    if flavor.name == "vllm":
        return _render_vllm(engine, model_name, started_unix)
    return _render_sglang(engine, model_name, gen_throughput)


def _render_vllm(engine: SimEngine, model_name: str, started_unix: float) -> str:
    st = engine.stats
    lab = {"engine": "0", "model_name": model_name}
    w = _Writer(created_unix=started_unix)
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        [(lab, engine.num_running)],
    )
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        [(lab, engine.num_waiting)],
    )
    w.gauge(
        "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", [(lab, engine.kv_usage)]
    )
    w.counter(
        "vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(lab, st.preemptions)]
    )
    w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(lab, st.prompt_tokens)])
    cache = engine.prefix_cache
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        [(lab, 0 if cache is None else cache.queries)],
    )
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        [(lab, 0 if cache is None else cache.hits)],
    )
    w.counter(
        "vllm:generation_tokens", "Number of generation tokens processed.", [(lab, st.generation_tokens)]
    )
    finished = dict(st.requests_finished)
    finished["abort"] = st.requests_aborted
    w.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [({**lab, "finished_reason": r}, finished.get(r, 0)) for r in ("stop", "length", "abort")],
    )
    w.histogram(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab, st.ttft
    )
    w.histogram(
        "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab, st.itl
    )
    w.histogram(
        "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lab, st.e2e
    )
    w.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        lab,
        st.queue,
    )
    block_size = engine.config.block_size
    info = {
        "block_size": str(block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": str(cache is not None),
        "engine": "0",
        "gpu_memory_utilization": "0.9",
        "num_gpu_blocks": str(engine.config.kv_capacity_tokens // block_size),
    }
    w.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [(info, 1.0)])
    return w.text()


def _render_sglang(engine: SimEngine, model_name: str, gen_throughput: float) -> str:
    st = engine.stats
    lab = {"model_name": model_name}  # tokenizer-manager metrics
    sched = {"engine_type": "unified", "model_name": model_name, "pp_rank": "0", "tp_rank": "0"}
    w = _Writer(created_unix=None)
    w.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", [(lab, st.prompt_tokens)])
    w.counter(
        "sglang:generation_tokens", "Number of generation tokens processed.", [(lab, st.generation_tokens)]
    )
    w.counter("sglang:num_requests", "Number of requests processed.", [(lab, st.requests_received)])
    w.counter("sglang:num_aborted_requests", "Number of requests aborted.", [(lab, st.requests_aborted)])
    w.counter("sglang:num_retracted_requests", "Total number of retracted requests.", [(lab, st.preemptions)])
    w.histogram(
        "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab, st.ttft
    )
    w.histogram(
        "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab, st.itl
    )
    w.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        lab,
        st.e2e,
    )
    w.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", lab, st.queue)
    w.gauge("sglang:num_running_reqs", "The number of running requests.", [(sched, engine.num_running)])
    w.gauge("sglang:num_used_tokens", "The number of used tokens.", [(sched, engine.kv_used)])
    w.gauge("sglang:token_usage", "The token usage.", [(sched, engine.kv_usage)])
    w.gauge("sglang:gen_throughput", "The generation throughput (token/s).", [(sched, gen_throughput)])
    w.gauge(
        "sglang:num_queue_reqs", "The number of requests in the waiting queue.", [(sched, engine.num_waiting)]
    )
    cache = engine.prefix_cache
    hit_rate = 0.0 if cache is None else cache.last_batch_hit_rate
    w.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", [(sched, hit_rate)])
    w.gauge(
        "sglang:max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.",
        [(sched, engine.config.kv_capacity_tokens)],
    )
    return w.text()
