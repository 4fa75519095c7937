"""Preemption on a real vLLM: a greedy batch request is preempted by an interactive one after some
tokens, aborted in the engine, and resumed with a call that continues its text; the client's joined text
equals the text of the same request run without interruption, token for token.

A second berth runs for this module in front of the session's vLLM, as one mixed endpoint with one seat
(cap=1), under a policy whose interactive class may preempt its batch class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import openai
import pytest

from loadgen.harness import RunningServer, ServerStartError, http_post_json, start_berth
from tests.engine.conftest import IGNORE_EOS, MODEL_NAME
from tests.engine.promtext import total
from tests.preempt_policy import BATCH_HEADERS as BATCH
from tests.preempt_policy import POLICY

BATCH_TOKENS: Final = 400  # ~1.3 s of the tiny model on one core: long enough to be preempted mid-way
CUT_AFTER: Final = 8  # chunks the batch client reads before the interactive request arrives
PROMPT: Final = "def fibonacci(n):"
MESSAGES: Final = [{"role": "user", "content": "Write a long story about a lighthouse."}]


@pytest.fixture(scope="module")
def preempting_berth(
    vllm_server: RunningServer, engine_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    policy = tmp_path_factory.mktemp("preempt") / "policy.toml"
    policy.write_text(POLICY)
    try:
        server = start_berth(
            f"{vllm_server.base_url},engine=vllm,class=mixed,cap=1",
            engine_logs / "berth-preempt.log",
            extra_args=["--policy", str(policy)],
        )
    except ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    yield server
    server.process.stop()


def _reference(vllm: RunningServer, api: str) -> tuple[str, dict[str, Any]]:
    """The batch request's text and usage, run on vLLM alone without interruption."""
    if api == "chat":
        doc: Any = http_post_json(
            f"{vllm.base_url}/v1/chat/completions",
            {
                "model": MODEL_NAME,
                "messages": MESSAGES,
                "max_tokens": BATCH_TOKENS,
                "temperature": 0,
                **IGNORE_EOS,
            },
        )
        return doc["choices"][0]["message"]["content"], doc["usage"]
    doc = http_post_json(
        f"{vllm.base_url}/v1/completions",
        {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": BATCH_TOKENS, "temperature": 0, **IGNORE_EOS},
    )
    return doc["choices"][0]["text"], doc["usage"]


def _preemptions(berth: RunningServer) -> float:
    return total(berth.metrics(), "berth_preemptions_total")


@pytest.mark.parametrize("api", ["chat", "completion"])
async def test_a_preempted_greedy_stream_resumes_token_for_token(
    api: str, preempting_berth: RunningServer, vllm_server: RunningServer
) -> None:
    expected_text, expected_usage = _reference(vllm_server, api)
    before = _preemptions(preempting_berth)
    client = openai.AsyncOpenAI(
        base_url=f"{preempting_berth.base_url}/v1", api_key="test", max_retries=0, timeout=120
    )
    common: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": BATCH_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": IGNORE_EOS,
        "extra_headers": BATCH,
    }
    async with client:
        if api == "chat":
            stream: Any = await client.chat.completions.create(messages=MESSAGES, **common)  # type: ignore[arg-type]
        else:
            stream = await client.completions.create(prompt=PROMPT, **common)
        pieces: list[str] = []
        ids: set[str] = set()
        usage = None
        interactive: asyncio.Task[Any] | None = None
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                pieces.append((c.delta.content or "") if api == "chat" else c.text)
                extra = c.model_extra or {}
                assert not extra.get("token_ids"), "berth asked for token ids on its own behalf"
                assert not extra.get("prompt_token_ids")
            if len(pieces) == CUT_AFTER and interactive is None:
                # The seat is taken by the batch stream: the interactive request preempts it.
                interactive = asyncio.get_running_loop().create_task(
                    client.chat.completions.create(
                        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                    )
                )
        assert interactive is not None
        answer = await interactive
    assert answer.choices[0].message.content
    assert _preemptions(preempting_berth) == before + 1, "the batch stream was not preempted"
    assert len(ids) == 1
    joined = "".join(pieces)
    assert joined == expected_text
    assert usage is not None
    assert usage.prompt_tokens == expected_usage["prompt_tokens"]
    assert usage.completion_tokens == expected_usage["completion_tokens"]
