"""Chat completions through berth to real vLLM, with the official openai SDK as the client."""

from __future__ import annotations

import asyncio
import string

import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from tests.engine.conftest import IGNORE_EOS, MODEL_NAME

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Write a haiku about queues."},
]
PRINTABLE = set(string.printable)


def test_chat_non_streaming(openai_client: openai.OpenAI) -> None:
    resp = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0, extra_body=IGNORE_EOS
    )

    assert resp.object == "chat.completion"
    assert resp.model == MODEL_NAME
    assert resp.id
    [choice] = resp.choices
    assert choice.index == 0
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert set(choice.message.content) <= PRINTABLE
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 16
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 16


def _stream_chat(client: openai.OpenAI, max_tokens: int, **kwargs: object) -> list[ChatCompletionChunk]:
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body=IGNORE_EOS,
        **kwargs,  # type: ignore[call-overload]
    )
    with stream:
        return list(stream)


def test_chat_streaming_deltas_and_final_chunk(openai_client: openai.OpenAI) -> None:
    chunks = _stream_chat(openai_client, max_tokens=12)

    assert chunks
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert all(c.usage is None for c in chunks), "no usage chunk unless stream_options asks for one"
    assert all(len(c.choices) == 1 for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text
    assert set(text) <= PRINTABLE
    assert sum(1 for c in chunks if c.choices[0].delta.content) >= 2, "content arrives as several deltas"


def test_chat_streaming_usage_chunk(openai_client: openai.OpenAI) -> None:
    chunks = _stream_chat(openai_client, max_tokens=12, stream_options={"include_usage": True})

    *content_chunks, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 12
    assert usage_chunk.usage.prompt_tokens > 0
    assert content_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in content_chunks)


def test_chat_non_streaming_matches_streaming(openai_client: openai.OpenAI) -> None:
    # Greedy decoding of a fixed model is deterministic: the relayed stream must carry the same text,
    # nothing lost, duplicated or reordered.
    resp = openai_client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=24, temperature=0, extra_body=IGNORE_EOS
    )
    chunks = _stream_chat(openai_client, max_tokens=24)

    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == resp.choices[0].message.content


@pytest.mark.parametrize("concurrency", [6], ids=["more-than-max-num-seqs"])
async def test_concurrent_streams_all_complete(
    async_openai_client: openai.AsyncOpenAI, concurrency: int
) -> None:
    # vLLM runs at most 4 sequences (--max-num-seqs 4); the rest queue and must still finish.
    async def one(i: int) -> tuple[str, int]:
        stream = await async_openai_client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": f"Request number {i}."}],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IGNORE_EOS,
        )
        text, completion_tokens = "", -1
        async with stream:
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                if chunk.usage is not None:
                    completion_tokens = chunk.usage.completion_tokens
        return text, completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(concurrency)))

    assert all(text for text, _ in results)
    assert [tokens for _, tokens in results] == [20] * concurrency
