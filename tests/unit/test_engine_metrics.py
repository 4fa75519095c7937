"""The metric half of the engine dialects: gauges, histograms and engine detection from real-shaped pages,
model lists."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from gateway.core.types import EngineGauges, EngineKind
from gateway.telemetry.engine_metrics import (
    SGLANG_METRICS,
    VLLM_METRICS,
    EngineMetrics,
    detect_engine,
    metrics_for,
    served_models,
)
from gateway.telemetry.promtext import parse

DATA = Path(__file__).parent / "data"
VLLM_PAGE = (DATA / "vllm_v1_dp2.prom").read_text()
SGLANG_PAGE = (DATA / "sglang.prom").read_text()
# The same SGLang series as the sgl-router's /engine_metrics (and Prometheus) spell them.
SGLANG_UNDERSCORE_PAGE = SGLANG_PAGE.replace("sglang:", "sglang_")

# vLLM before 0.9 (V0 engine names, no `engine` label): only the old KV and per-token names.
VLLM_OLD_PAGE = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="m"} 10.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 12.0
vllm:time_per_output_token_seconds_count{model_name="m"} 12.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.6
"""


@pytest.mark.parametrize(
    ("page", "dialect", "gauges"),
    [
        pytest.param(
            VLLM_PAGE, VLLM_METRICS, EngineGauges(running=5.0, waiting=1.0, kv_usage=0.30), id="vllm-dp2"
        ),
        pytest.param(
            VLLM_OLD_PAGE, VLLM_METRICS, EngineGauges(running=7.0, waiting=2.0, kv_usage=0.9), id="vllm-old"
        ),
        pytest.param(
            SGLANG_PAGE, SGLANG_METRICS, EngineGauges(running=12.0, waiting=4.0, kv_usage=0.625), id="sglang"
        ),
        pytest.param(
            SGLANG_UNDERSCORE_PAGE,
            SGLANG_METRICS,
            EngineGauges(running=12.0, waiting=4.0, kv_usage=0.625),
            id="sglang-underscore",
        ),
        pytest.param("", VLLM_METRICS, EngineGauges(), id="empty-page"),
        pytest.param(VLLM_PAGE, SGLANG_METRICS, EngineGauges(), id="wrong-dialect-reads-nothing"),
    ],
)
def test_gauges(page: str, dialect: EngineMetrics, gauges: EngineGauges) -> None:
    got = dialect.gauges(parse(page))
    assert got.running == gauges.running
    assert got.waiting == gauges.waiting
    if gauges.kv_usage is None:
        assert got.kv_usage is None
    else:
        assert got.kv_usage == pytest.approx(gauges.kv_usage)


@pytest.mark.parametrize(
    ("page", "gauges"),
    [
        pytest.param(
            "vllm:kv_cache_usage_perc 1.7\nvllm:num_requests_running -1\n",
            EngineGauges(running=0.0, kv_usage=1.0),
            id="clamped",
        ),
        pytest.param(
            "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running NaN\n", EngineGauges(), id="nan-is-none"
        ),
        pytest.param(
            'vllm:num_requests_running{engine="0"} NaN\nvllm:num_requests_running{engine="1"} 4\n',
            EngineGauges(running=4.0),
            id="nan-label-set-skipped",
        ),
        pytest.param(
            "vllm:kv_cache_usage_perc 0.2\nvllm:gpu_cache_usage_perc 0.2\n",
            EngineGauges(kv_usage=0.2),
            id="deprecated-twin-not-added",
        ),
        pytest.param("vllm_num_requests_waiting 3\n", EngineGauges(waiting=3.0), id="underscore-spelling"),
    ],
)
def test_gauge_edge_cases(page: str, gauges: EngineGauges) -> None:
    assert VLLM_METRICS.gauges(parse(page)) == gauges


@pytest.mark.parametrize(
    ("page", "dialect", "ttft_count", "itl_count"),
    [
        pytest.param(VLLM_PAGE, VLLM_METRICS, 2215.0, None, id="vllm"),
        pytest.param(VLLM_OLD_PAGE, VLLM_METRICS, None, 12.0, id="vllm-old-itl-name"),
        pytest.param(SGLANG_PAGE, SGLANG_METRICS, 640.0, 2560.0, id="sglang"),
        pytest.param(SGLANG_UNDERSCORE_PAGE, SGLANG_METRICS, 640.0, 2560.0, id="sglang-underscore"),
    ],
)
def test_latency_histograms(
    page: str, dialect: EngineMetrics, ttft_count: float | None, itl_count: float | None
) -> None:
    expo = parse(page)
    ttft = dialect.ttft_histogram(expo)
    itl = dialect.itl_histogram(expo)
    if ttft_count is None:
        assert ttft is None
    else:
        assert ttft is not None
        assert ttft.count == ttft_count
    assert itl is not None
    if itl_count is not None:
        assert itl.count == itl_count


def test_vllm_prefers_new_itl_name_over_its_deprecated_twin() -> None:
    page = (
        "vllm:inter_token_latency_seconds_count 5\nvllm:inter_token_latency_seconds_sum 1\n"
        "vllm:time_per_output_token_seconds_count 5\nvllm:time_per_output_token_seconds_sum 1\n"
    )
    itl = VLLM_METRICS.itl_histogram(parse(page))
    assert itl is not None
    assert itl.count == 5.0  # one series, not both added


def test_vllm_page_counters_and_e2e() -> None:
    expo = parse(VLLM_PAGE)
    prompt = VLLM_METRICS.prompt_tokens_total(expo)
    generated = VLLM_METRICS.generation_tokens_total(expo)
    assert prompt is not None
    assert generated is not None
    assert prompt > generated > 0
    e2e = VLLM_METRICS.e2e_histogram(expo)
    assert e2e is not None
    assert e2e.count == 2215.0
    assert e2e.buckets[-1] == (math.inf, 2215.0)


def test_sglang_counters() -> None:
    expo = parse(SGLANG_PAGE)
    assert SGLANG_METRICS.prompt_tokens_total(expo) == 1337335.0
    assert SGLANG_METRICS.generation_tokens_total(expo) == 255735.0


@pytest.mark.parametrize(
    ("page", "kind"),
    [
        pytest.param(VLLM_PAGE, EngineKind.VLLM, id="vllm"),
        pytest.param(VLLM_OLD_PAGE, EngineKind.VLLM, id="vllm-old"),
        pytest.param(SGLANG_PAGE, EngineKind.SGLANG, id="sglang"),
        pytest.param(SGLANG_UNDERSCORE_PAGE, EngineKind.SGLANG, id="sglang-underscore"),
        pytest.param("vllm:prompt_tokens_total 3\n", EngineKind.VLLM, id="vllm-prefix-only"),
        pytest.param("sglang:cache_hit_rate 0.1\n", EngineKind.SGLANG, id="sglang-prefix-only"),
        pytest.param("python_gc_collections_total 1\nprocess_open_fds 7\n", None, id="not-an-engine"),
        pytest.param("", None, id="empty"),
        pytest.param("vllm:num_requests_running 1\nsglang:num_running_reqs 1\n", None, id="both-gauges"),
        pytest.param("vllm:x 1\nsglang:y 1\n", None, id="both-prefixes"),
    ],
)
def test_detect_engine(page: str, kind: EngineKind | None) -> None:
    assert detect_engine(parse(page)) is kind


def test_metrics_for_every_kind() -> None:
    for kind in EngineKind:
        assert metrics_for(kind).kind is kind


@pytest.mark.parametrize("dialect", [VLLM_METRICS, SGLANG_METRICS], ids=["vllm", "sglang"])
def test_paths(dialect: EngineMetrics) -> None:
    assert (dialect.health_path, dialect.models_path, dialect.metrics_path) == (
        "/health",
        "/v1/models",
        "/metrics",
    )


VLLM_MODELS = orjson.dumps(
    {
        "object": "list",
        "data": [
            {
                "id": "Qwen/Qwen2.5-Coder-7B-Instruct",
                "object": "model",
                "created": 1732000000,
                "owned_by": "vllm",
                "root": "/models/qwen-coder",
                "parent": None,
                "max_model_len": 8192,
                "permission": [],
            },
            {
                "id": "sql-lora",
                "object": "model",
                "created": 1732000000,
                "owned_by": "vllm",
                "root": "/adapters/sql",
                "parent": "Qwen/Qwen2.5-Coder-7B-Instruct",
            },
        ],
    }
)


@pytest.mark.parametrize(
    ("body", "models"),
    [
        pytest.param(VLLM_MODELS, ["Qwen/Qwen2.5-Coder-7B-Instruct", "sql-lora"], id="vllm-with-lora"),
        pytest.param(
            b'{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model",'
            b'"created":1,"owned_by":"sglang","root":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":131072}]}',
            ["meta-llama/Llama-3.1-8B-Instruct"],
            id="sglang",
        ),
        pytest.param(b'{"object":"list","data":[]}', [], id="empty"),
        pytest.param(b'{"data":[{"id":"a"},{"id":"a"},{"id":"b"}]}', ["a", "b"], id="repeats-dropped"),
    ],
)
def test_served_models(body: bytes, models: list[str]) -> None:
    assert served_models(body) == models
    assert VLLM_METRICS.served_models(body) == models


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"not json", id="not-json"),
        pytest.param(b"[]", id="not-an-object"),
        pytest.param(b'{"object":"list"}', id="no-data"),
        pytest.param(b'{"data":{"id":"a"}}', id="data-not-a-list"),
        pytest.param(b'{"data":[{"name":"a"}]}', id="no-id"),
        pytest.param(b'{"data":[{"id":7}]}', id="id-not-a-string"),
        pytest.param(b'{"data":["a"]}', id="entry-not-an-object"),
    ],
)
def test_served_models_rejects_other_shapes(body: bytes) -> None:
    with pytest.raises(ValueError, match="models list"):
        served_models(body)
