"""`[telemetry] prompt_tokens = "tokenize"` against real vLLM: berth counts each prompt with vLLM's own
`POST /tokenize` before admission, and the count it runs the request with is exactly the
`usage.prompt_tokens` vLLM reports for that prompt (chat template included for chat).

A berth of its own (the session's runs with the default estimate), in front of the session's vLLM.
Berth's count is read from `/admin/fleet` (the endpoint's running prompt tokens) while a long stream is
in flight; the usage comes from the same request sent again without streaming.
"""

from __future__ import annotations

import itertools
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.config import ADMIN_TOKEN_ENV
from loadgen.harness import ServerStartError, start_berth
from tests.engine.conftest import IGNORE_EOS, LONG_MAX_TOKENS, MODEL_NAME, RunningServer
from tests.engine.promtext import total

CHAT_MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a careful assistant who answers in one sentence."},
    {"role": "user", "content": "Explain what a gateway in front of LLM inference engines does, and why."},
]
COMPLETION_PROMPT = 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'


@pytest.fixture(scope="module")
def tokenizing_berth(
    vllm_server: RunningServer, engine_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    conf = tmp_path_factory.mktemp("tokenize") / "gateway.toml"
    # A generous bound: on 2 CPU cores a tokenize call can wait behind the engine's busy event loop.
    conf.write_text('[telemetry]\nprompt_tokens = "tokenize"\ntokenize_timeout_s = 5.0\n')
    try:
        server = start_berth(
            f"{vllm_server.base_url},engine=vllm",
            engine_logs / "berth-tokenize.log",
            extra_args=["-c", str(conf)],
        )
    except ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    yield server
    server.process.stop()


@pytest.fixture
def client(tokenizing_berth: RunningServer) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=f"{tokenizing_berth.base_url}/v1", api_key="test", max_retries=0, timeout=120)
    yield c
    c.close()


def _running_prompt_tokens(berth: RunningServer) -> int:
    """The prompt tokens berth runs its in-flight requests with (one endpoint)."""
    req = urllib.request.Request(berth.base_url + "/admin/fleet")
    token = os.environ.get(ADMIN_TOKEN_ENV)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc = json.loads(resp.read())
    [endpoint] = doc["endpoints"]
    n = endpoint["running_context"]["prompt_tokens"]
    assert isinstance(n, int)
    return n


def _tokenized_ok(berth: RunningServer) -> float:
    return total(berth.metrics(), "berth_tokenize_requests_total", result="ok")


def _chat(client: openai.OpenAI, berth: RunningServer) -> tuple[int, int]:
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT_MESSAGES,
        max_tokens=LONG_MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    with stream:
        assert len(list(itertools.islice(stream, 2))) == 2  # running: berth has admitted it
        counted = _running_prompt_tokens(berth)
    # Leaving the block closed the stream (berth aborts it in vLLM); the same prompt once more for usage.
    answer = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT_MESSAGES, max_tokens=1, temperature=0
    )
    assert answer.usage is not None
    return counted, answer.usage.prompt_tokens


def _completion(client: openai.OpenAI, berth: RunningServer) -> tuple[int, int]:
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=COMPLETION_PROMPT,
        max_tokens=LONG_MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    with stream:
        assert len(list(itertools.islice(stream, 2))) == 2
        counted = _running_prompt_tokens(berth)
    answer = client.completions.create(
        model=MODEL_NAME, prompt=COMPLETION_PROMPT, max_tokens=1, temperature=0
    )
    assert answer.usage is not None
    return counted, answer.usage.prompt_tokens


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_berth_runs_the_request_with_vllms_exact_count(
    client: openai.OpenAI, tokenizing_berth: RunningServer, api: str
) -> None:
    ok_before = _tokenized_ok(tokenizing_berth)

    counted, usage = (_chat if api == "chat" else _completion)(client, tokenizing_berth)

    assert counted == usage, f"berth ran the request with {counted} prompt tokens, vLLM's usage says {usage}"
    assert _tokenized_ok(tokenizing_berth) == ok_before + 2  # both requests were counted by vLLM
