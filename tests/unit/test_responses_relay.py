"""The Responses API in the front and the relay: its bodies read (input, max_output_tokens), its named
events relayed byte for byte and timed like chat's, and the bounded map of response ids."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.errors import BerthError
from gateway.core.types import ApiKind, EndpointId
from gateway.dispatch.response_ids import ResponseIds
from gateway.front.schemas import parse_body
from gateway.upstream.sse import SseRelay


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


_RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 17,
    "model": "served",
    "status": "in_progress",
}
_USAGE = {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}
STREAM = (
    _event("response.created", response=_RESPONSE)
    + _event("response.in_progress", response=_RESPONSE)
    + _event("response.reasoning_text.delta", delta="hmm")
    + _event("response.output_text.delta", delta="a")
    + _event("response.output_text.delta", delta="b")
    + _event("response.output_text.done", text="ab")
    + _event("response.completed", response={**_RESPONSE, "status": "completed", "usage": _USAGE})
)


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM)), min_size=1, max_size=20))
def test_any_split_of_a_responses_stream_relays_it_unchanged(cuts: list[int]) -> None:
    relay = SseRelay(include_usage=True, served_model="served", client_model="served")
    out = b""
    prev = 0
    for i, p in enumerate([*sorted(set(cuts)), len(STREAM)]):
        out += relay.feed(STREAM[prev:p], float(i))
        prev = p
    out += relay.flush()
    assert out == STREAM
    assert (relay.produced_text, relay.reasoning, relay.tokens) == ("ab", ["hmm"], 3)
    assert relay.done
    assert relay.error is None
    assert relay.finish_reason == "completed"
    assert relay.stream_id == "resp_1"
    assert relay.created == 17
    assert relay.usage is not None
    assert (relay.usage["prompt_tokens"], relay.usage["completion_tokens"]) == (5, 3)


def test_responses_tokens_timed_and_model_renamed() -> None:
    relay = SseRelay(include_usage=True, served_model="served", client_model="alias")
    clock = itertools.count(10.0, 0.5)
    out = b"".join(relay.feed(e + b"\n\n", next(clock)) for e in STREAM.split(b"\n\n") if e)
    assert b'"model":"served"' not in out
    assert out.count(b'"model":"alias"') == 3
    assert relay.first_token_at == 11.0  # the reasoning delta, the third event
    assert relay.first_content_at == 11.5
    assert relay.gaps == [0.5, 0.5]


@pytest.mark.parametrize(
    ("last", "error"),
    [
        pytest.param(
            _event("response.failed", response={**_RESPONSE, "status": "failed", "error": {"message": "x"}}),
            {"message": "x"},
            id="failed",
        ),
        pytest.param(
            _event("error", message="boom", code="server_error"),
            {"message": "boom", "code": "server_error"},
            id="error-event",
        ),
    ],
)
def test_responses_failures_are_the_relays_error(last: bytes, error: dict[str, Any]) -> None:
    relay = SseRelay(include_usage=True, served_model="served", client_model="served")
    relay.feed(_event("response.created", response=_RESPONSE) + last, 0.0)
    assert relay.error == error


def test_responses_body_read() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "abcd"},
            {"role": "user", "content": [{"type": "input_text", "text": "ef"}]},
        ],
        "instructions": "ghi",
        "max_output_tokens": 7,
        "stream": True,
        "stream_options": {"include_obfuscation": False},  # the Responses API's own: passed on as it is
    }
    p = parse_body(ApiKind.RESPONSES, orjson.dumps(body))
    assert (p.prompt_chars, p.max_tokens, p.stream, p.include_usage) == (9, 7, True, True)
    assert p.body == body


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({"model": "m"}, "input", id="no-input"),
        pytest.param({"model": "m", "input": [1]}, "input[0]", id="item-not-object"),
        pytest.param(
            {"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens", id="max-output"
        ),
        pytest.param(
            {"model": "m", "input": "x", "previous_response_id": 3}, "previous_response_id", id="prev"
        ),
    ],
)
def test_responses_body_errors_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BerthError) as e:
        parse_body(ApiKind.RESPONSES, orjson.dumps(body))
    assert e.value.param == param


@given(st.lists(st.integers(min_value=0, max_value=20), max_size=200), st.integers(min_value=1, max_value=8))
def test_response_ids_keep_the_most_recently_used(ops: list[int], size: int) -> None:
    ids = ResponseIds(size)
    recent: list[str] = []  # the model: most recently used last
    for n in ops:
        rid = f"resp_{n}"
        if n % 3 == 0:
            ids.record(rid, EndpointId("e"), "t")
        elif ids.get(rid) is None:
            assert rid not in recent
            continue
        if rid in recent:
            recent.remove(rid)
        recent.append(rid)
        del recent[:-size]
        assert len(ids) == len(recent) <= size
    assert all(ids.get(rid) is not None for rid in recent)
