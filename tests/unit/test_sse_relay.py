"""The sans-IO SSE relay: framing across chunk boundaries, usage filtering, alias rewrite, timing."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.sse import SseRelay


def _chunk(
    content: str | None, *, model: str = "served", usage: dict[str, int] | None = None, choices: bool = True
) -> bytes:
    obj: dict[str, object] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}] if choices else [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


STREAM = (
    _chunk("a")
    + _chunk("b")
    + _chunk("c")
    + _chunk(None, usage={"prompt_tokens": 2, "completion_tokens": 3}, choices=False)
    + b"data: [DONE]\n\n"
)


def _events(data: bytes) -> list[bytes]:
    return [e for e in data.split(b"\n\n") if e]


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM)), min_size=1, max_size=20))
def test_any_split_of_the_stream_relays_the_same(cuts: list[int]) -> None:
    relay = SseRelay(include_usage=True, served_model="served", client_model="served")
    points = sorted(set(cuts))
    out = b""
    prev = 0
    for i, p in enumerate([*points, len(STREAM)]):
        out += relay.feed(STREAM[prev:p], float(i))
        prev = p
    out += relay.flush()
    assert out == STREAM
    assert relay.produced_text == "abc"
    assert relay.tokens == 3
    assert relay.done
    assert relay.usage == {"prompt_tokens": 2, "completion_tokens": 3}


@pytest.mark.parametrize("include_usage", [True, False], ids=["asked", "not-asked"])
def test_usage_chunk_forwarded_only_when_asked(include_usage: bool) -> None:
    relay = SseRelay(include_usage=include_usage, served_model="served", client_model="served")
    out = relay.feed(STREAM, 0.0)
    assert (b'"usage":{' in out) == include_usage
    assert relay.usage is not None  # recorded either way
    assert out.endswith(b"data: [DONE]\n\n")


def test_alias_rewrites_model_name_in_every_event() -> None:
    relay = SseRelay(include_usage=True, served_model="served", client_model="alias")
    out = relay.feed(STREAM, 0.0)
    assert b'"served"' not in out
    assert out.count(b'"model":"alias"') == 4


def test_crlf_framing_and_comments_pass_through() -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    data = b": ping\r\n\r\n" + _chunk("x", model="m").replace(b"\n\n", b"\r\n\r\n")
    out = relay.feed(data, 1.0)
    assert _events(out)[0] == b": ping"
    assert relay.produced_text == "x"


def test_timing_first_token_and_gaps() -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    relay.feed(_chunk("a", model="m"), 10.0)
    relay.feed(_chunk("b", model="m"), 10.5)
    relay.feed(_chunk("c", model="m"), 10.75)
    assert relay.first_token_at == 10.0
    assert relay.gaps == [0.5, 0.25]


def test_error_event_recorded() -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    out = relay.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\n', 0.0)
    assert relay.error == {"message": "boom", "code": 500}
    assert b"boom" in out


def test_usage_on_a_content_chunk_is_dropped_when_not_asked() -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    out = relay.feed(_chunk("a", model="m", usage={"prompt_tokens": 1, "completion_tokens": 1}), 0.0)
    obj = orjson.loads(out[len(b"data: ") :].strip())
    assert obj["usage"] is None
    assert relay.usage == {"prompt_tokens": 1, "completion_tokens": 1}


def _delta_chunk(delta: dict[str, object]) -> bytes:
    obj = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta}],
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


TOOL_CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}


@pytest.mark.parametrize(
    "deltas",
    [
        pytest.param(
            [{"role": "assistant", "content": ""}, {"reasoning_content": "hm"}, {"reasoning_content": "m"}],
            id="reasoning_content",
        ),
        pytest.param([{"role": "assistant"}, {"reasoning": "hm"}, {"reasoning": "m"}], id="reasoning"),
        pytest.param(
            [
                {"role": "assistant", "content": None},
                {"tool_calls": [TOOL_CALL]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '{"x"'}}]},
            ],
            id="tool_calls",
        ),
    ],
)
def test_reasoning_and_tool_call_deltas_are_generated_tokens(deltas: list[dict[str, object]]) -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    for i, delta in enumerate(deltas):
        relay.feed(_delta_chunk(delta), 10.0 + i)
    assert relay.tokens == 2  # the role chunk generates nothing
    assert relay.first_token_at == 11.0
    assert relay.gaps == [1.0]
    assert (relay.first_content_at, relay.produced_text) == (None, "")
    relay.feed(_delta_chunk({"content": "answer"}), 13.0)
    after = (relay.first_token_at, relay.first_content_at, relay.tokens, relay.produced_text)
    assert after == (11.0, 13.0, 3, "answer")
