"""A client that goes away mid-stream frees its slot on the real engine."""

from __future__ import annotations

import itertools

import openai

from tests.engine.conftest import IGNORE_EOS, LONG_MAX_TOKENS, MODEL_NAME, RunningServer
from tests.engine.promtext import total


def _running(vllm: RunningServer) -> float:
    return total(vllm.metrics(), "vllm:num_requests_running", model_name=MODEL_NAME)


def _finished_by_length(vllm: RunningServer) -> float:
    return total(
        vllm.metrics(), "vllm:request_success_total", model_name=MODEL_NAME, finished_reason="length"
    )


def test_aborted_stream_frees_the_engine(openai_client: openai.OpenAI, vllm_server: RunningServer) -> None:
    assert _running(vllm_server) == 0
    length_before = _finished_by_length(vllm_server)

    stream = openai_client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=LONG_MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    with stream:
        first_chunks = list(itertools.islice(stream, 3))
        assert len(first_chunks) == 3
        assert _running(vllm_server) == 1
    # Leaving the block closed the HTTP response mid-stream: the client went away.

    vllm_server.process.poll_until(
        "vllm:num_requests_running returns to 0 after the client left",
        lambda: _running(vllm_server) == 0,
        timeout_s=30,
    )
    assert _finished_by_length(vllm_server) == length_before, "the request ran to max_tokens: not aborted"
