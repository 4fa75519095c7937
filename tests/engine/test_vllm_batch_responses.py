"""The rest of the drop-in surface against real vLLM, with the official openai SDK: a small Batch API
job of chat lines run through berth (files.create, batches.create, poll, the output checked line by
line), `/tokenize` and `/detokenize` through berth, the Responses API through berth, and vLLM's own
benchmark client, which asks berth's `/tokenize` to align its prompts and must find it.

A berth of its own with its batch store in a temporary directory, in front of the session's vLLM.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import openai
import pytest

from loadgen.bench.reliability.vllm_bench import client_argv
from loadgen.harness import ServerStartError, http_post_json, start_berth
from loadgen.vllm_server import engine_env
from tests.engine.conftest import IGNORE_EOS, MODEL_NAME, RunningServer

LINES: Final = 4
MAX_TOKENS: Final = 8
BATCH_DEADLINE_S: Final = 180.0  # a few seconds of work on the tiny model; generous for a busy CPU
POLL_S: Final = 0.5
TERMINAL: Final = frozenset(("completed", "failed", "expired", "cancelled"))


@pytest.fixture(scope="module")
def batch_berth(
    vllm_server: RunningServer, engine_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    batch_dir = tmp_path_factory.mktemp("batch-store")
    try:
        server = start_berth(
            f"{vllm_server.base_url},engine=vllm",
            engine_logs / "berth-batch.log",
            extra_args=["--batch-dir", str(batch_dir)],
        )
    except ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    yield server
    server.process.stop()


@pytest.fixture
def client(batch_berth: RunningServer) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=f"{batch_berth.base_url}/v1", api_key="test", max_retries=0, timeout=120)
    yield c
    c.close()


def _line(i: int) -> str:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": f"Count to {i + 2}."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        **IGNORE_EOS,
    }
    return json.dumps(
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


def test_batch_of_chat_lines_runs_on_the_real_engine(client: openai.OpenAI) -> None:
    data = ("\n".join(_line(i) for i in range(LINES)) + "\n").encode()
    upload = client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + BATCH_DEADLINE_S
    while batch.status not in TERMINAL:
        assert time.monotonic() < deadline, f"batch still {batch.status} after {BATCH_DEADLINE_S:g} s"
        time.sleep(POLL_S)  # a real engine's pace: polled, with a deadline
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch.errors
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (LINES, LINES)
    assert batch.request_counts.failed == 0
    assert batch.output_file_id is not None
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == [f"line-{i}" for i in range(LINES)]  # each once
    for o in out:
        assert o["error"] is None
        assert o["response"]["status_code"] == 200
        body = o["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["model"] == MODEL_NAME
        assert isinstance(body["choices"][0]["message"]["content"], str)
        assert body["usage"]["completion_tokens"] == MAX_TOKENS  # ignore_eos: exactly max_tokens


def test_tokenize_and_detokenize_through_berth(
    batch_berth: RunningServer, vllm_server: RunningServer
) -> None:
    body = {"model": MODEL_NAME, "prompt": "def add(a, b):", "add_special_tokens": False}
    via_berth = http_post_json(f"{batch_berth.base_url}/tokenize", body)
    direct = http_post_json(f"{vllm_server.base_url}/tokenize", body)
    assert via_berth == direct
    tokens = via_berth["tokens"]
    assert isinstance(tokens, list)
    assert via_berth["count"] == len(tokens) > 0
    back = http_post_json(f"{batch_berth.base_url}/detokenize", {"model": MODEL_NAME, "tokens": tokens})
    assert back["prompt"] == "def add(a, b):"


def test_responses_through_berth(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL_NAME, input="Name a prime.", max_output_tokens=MAX_TOKENS, temperature=0
    )
    assert first.status in ("completed", "incomplete")
    assert first.model == MODEL_NAME
    assert first.usage is not None
    assert 0 < first.usage.output_tokens <= MAX_TOKENS
    # vLLM keeps no response unless started with VLLM_ENABLE_RESPONSES_API_STORE=1 (the session's is
    # not): asking for it again, through berth to the engine that made it, is that engine's 404.
    with pytest.raises(openai.NotFoundError, match=first.id):
        client.responses.retrieve(first.id)
    stream = client.responses.create(
        model=MODEL_NAME, input="Count.", max_output_tokens=MAX_TOKENS, stream=True, temperature=0
    )
    kinds = [e.type for e in stream]
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds


def test_vllm_bench_serve_finds_tokenize_behind_berth(
    batch_berth: RunningServer, engine_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = Namespace(
        backend="openai-chat",
        input_len=32,
        output_len=4,
        num_prompts=4,
        request_rate=100.0,
        max_concurrency=4,
        seed=1,
        extra=[],
    )
    argv = client_argv(engine_python, args, batch_berth.base_url, tiny_model_dir, tmp_path)
    done = subprocess.run(argv, env=engine_env(), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "/tokenize unavailable" not in done.stdout + done.stderr
    assert json.loads((tmp_path / "result.json").read_text())["completed"] == 4
