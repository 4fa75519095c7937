"""berth's own view of the real engine: request counting, the endpoint scraper, client disconnects.

These need berth in the path and are skipped with BERTH_ENGINE_TARGET=vllm. Metric names are
berth's (gateway/core/metrics.py). berth updates its counters in the request's finish phase, which may
run just after the client has its last byte, and its engine gauges on the next scrape, so the tests
wait for a metric to reach a value (a bounded poll of berth's /metrics) rather than read it once.
"""

from __future__ import annotations

import itertools

import openai
import pytest

from tests.engine.conftest import IGNORE_EOS, LONG_MAX_TOKENS, MODEL_NAME, RunningServer
from tests.engine.promtext import samples, total

SCRAPE_WAIT_S = 30.0


def _endpoint_id(berth: RunningServer) -> str:
    ups = samples(berth.metrics(), "berth_endpoint_up")
    assert len(ups) == 1, f"one endpoint configured, berth_endpoint_up has {ups}"
    return ups[0].labels["endpoint"]


def _wait_metric(berth: RunningServer, name: str, want: float, **labels: str) -> None:
    berth.process.poll_until(
        f"{name}{labels} == {want}",
        lambda: total(berth.metrics(), name, **labels) == want,
        timeout_s=SCRAPE_WAIT_S,
    )


def test_endpoint_is_up(berth: RunningServer) -> None:
    [up] = samples(berth.metrics(), "berth_endpoint_up")

    assert up.labels["endpoint"]
    assert up.value == 1


def test_scraper_reads_the_real_vllm_metrics(berth: RunningServer) -> None:
    endpoint = _endpoint_id(berth)

    text = berth.metrics()
    assert total(text, "berth_scrape_total", endpoint=endpoint, result="ok") >= 1
    # Gauges berth can only know from vLLM's /metrics (vllm:num_requests_waiting, vllm:kv_cache_usage_perc).
    assert samples(text, "berth_endpoint_engine_waiting_requests", endpoint=endpoint)
    [kv] = samples(text, "berth_endpoint_kv_usage_ratio", endpoint=endpoint)
    assert 0.0 <= kv.value <= 1.0


@pytest.mark.parametrize(
    ("api", "stream"),
    [("chat", False), ("chat", True), ("completions", False), ("completions", True)],
    ids=["chat", "chat-stream", "completions", "completions-stream"],
)
def test_berth_counts_the_request(
    openai_client: openai.OpenAI, berth: RunningServer, api: str, stream: bool
) -> None:
    before = total(berth.metrics(), "berth_requests_total", model=MODEL_NAME)

    if api == "chat":
        chat = openai_client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=stream
        )
        if isinstance(chat, openai.Stream):
            with chat:
                list(chat)
    else:
        completion = openai_client.completions.create(
            model=MODEL_NAME, prompt="hi", max_tokens=4, stream=stream
        )
        if isinstance(completion, openai.Stream):
            with completion:
                list(completion)

    _wait_metric(berth, "berth_requests_total", before + 1, model=MODEL_NAME)


def test_engine_running_gauge_follows_a_live_stream(
    openai_client: openai.OpenAI, berth: RunningServer
) -> None:
    # berth_endpoint_engine_running_requests is vllm:num_requests_running as berth's scraper last read it.
    endpoint = _endpoint_id(berth)
    stream = openai_client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=LONG_MAX_TOKENS,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    with stream:
        next(stream)
        _wait_metric(berth, "berth_endpoint_engine_running_requests", 1, endpoint=endpoint)
    _wait_metric(berth, "berth_endpoint_engine_running_requests", 0, endpoint=endpoint)


def test_aborted_stream_releases_berth_and_the_engine(
    openai_client: openai.OpenAI, berth: RunningServer, vllm_server: RunningServer
) -> None:
    endpoint = _endpoint_id(berth)
    disconnects_before = total(berth.metrics(), "berth_client_disconnects_total", model=MODEL_NAME)

    stream = openai_client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=LONG_MAX_TOKENS,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    with stream:
        assert len(list(itertools.islice(stream, 3))) == 3
        assert total(berth.metrics(), "berth_endpoint_inflight_requests", endpoint=endpoint) == 1

    _wait_metric(berth, "berth_endpoint_inflight_requests", 0, endpoint=endpoint)
    _wait_metric(berth, "berth_client_disconnects_total", disconnects_before + 1, model=MODEL_NAME)
    vllm_server.process.poll_until(
        "vllm:num_requests_running returns to 0",
        lambda: total(vllm_server.metrics(), "vllm:num_requests_running", model_name=MODEL_NAME) == 0,
        timeout_s=SCRAPE_WAIT_S,
    )
