"""Text completions through berth to real vLLM, with the official openai SDK as the client."""

from __future__ import annotations

import string

import openai
import pytest
from openai.types import Completion

from tests.engine.conftest import IGNORE_EOS, MODEL_NAME

PROMPT = "def add(a, b):\n    return"
PRINTABLE = set(string.printable)


def test_completion_non_streaming(openai_client: openai.OpenAI) -> None:
    resp = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=10, temperature=0, extra_body=IGNORE_EOS
    )

    assert resp.object == "text_completion"
    assert resp.model == MODEL_NAME
    [choice] = resp.choices
    assert choice.finish_reason == "length"
    assert choice.text
    assert set(choice.text) <= PRINTABLE
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 10
    assert resp.usage.prompt_tokens > 0


def _stream_completion(client: openai.OpenAI, max_tokens: int, include_usage: bool) -> list[Completion]:
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": include_usage},
        extra_body=IGNORE_EOS,
    )
    with stream:
        return list(stream)


@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "include-usage"])
def test_completion_streaming(openai_client: openai.OpenAI, include_usage: bool) -> None:
    chunks = _stream_completion(openai_client, max_tokens=10, include_usage=include_usage)

    usage_chunks = [c for c in chunks if c.usage is not None]
    text_chunks = [c for c in chunks if c.choices]
    if include_usage:
        assert usage_chunks == [chunks[-1]]
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 10
    else:
        assert usage_chunks == []
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in text_chunks]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    assert len(text_chunks) >= 2, "text arrives as several chunks"
    assert set("".join(c.choices[0].text for c in text_chunks)) <= PRINTABLE


def test_completion_non_streaming_matches_streaming(openai_client: openai.OpenAI) -> None:
    resp = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=IGNORE_EOS
    )
    chunks = _stream_completion(openai_client, max_tokens=24, include_usage=False)

    assert "".join(c.choices[0].text for c in chunks if c.choices) == resp.choices[0].text
