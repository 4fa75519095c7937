"""Resuming a preempted request: which requests may be resumed, the continuing engine call, and the
relay that stitches the resumed stream onto the client's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.types import ApiKind
from gateway.upstream.dialects import SGLANG, VLLM
from gateway.upstream.resume import resumable, resume_body
from gateway.upstream.sse import SseRelay

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "max_tokens": 20,
}
COMPLETION: dict[str, Any] = {"model": "m", "prompt": "Once upon", "stream": True, "max_tokens": 20}


@pytest.mark.parametrize(
    ("api", "body", "expected"),
    [
        (ApiKind.CHAT, CHAT, True),
        (ApiKind.COMPLETION, COMPLETION, True),
        (ApiKind.EMBEDDING, {"model": "m", "input": "x"}, False),
        (ApiKind.CHAT, {**CHAT, "n": 2}, False),
        (ApiKind.CHAT, {**CHAT, "n": 1}, True),
        (ApiKind.CHAT, {**CHAT, "logprobs": True}, False),
        (ApiKind.CHAT, {**CHAT, "logprobs": False}, True),
        (ApiKind.CHAT, {**CHAT, "top_logprobs": 3}, False),
        (ApiKind.COMPLETION, {**COMPLETION, "logprobs": 0}, False),
        (ApiKind.COMPLETION, {**COMPLETION, "echo": True}, False),
        (ApiKind.COMPLETION, {**COMPLETION, "best_of": 3}, False),
        (ApiKind.COMPLETION, {**COMPLETION, "suffix": "end"}, False),
        (ApiKind.COMPLETION, {**COMPLETION, "prompt": ["a", "b"]}, False),
        (ApiKind.COMPLETION, {**COMPLETION, "prompt": [1, 2, 3]}, False),
        (ApiKind.CHAT, {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, False),
        (ApiKind.CHAT, {**CHAT, "tools": []}, True),
        (ApiKind.CHAT, {**CHAT, "response_format": {"type": "json_object"}}, False),
        (ApiKind.CHAT, {**CHAT, "response_format": {"type": "text"}}, True),
        (ApiKind.CHAT, {**CHAT, "guided_json": {"type": "object"}}, False),
        (ApiKind.CHAT, {**CHAT, "continue_final_message": True}, False),
        (ApiKind.CHAT, {**CHAT, "add_generation_prompt": False}, False),
        (
            ApiKind.CHAT,
            {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "pre"}]},
            False,
        ),
        (ApiKind.CHAT, {**CHAT, "messages": []}, False),
    ],
    ids=lambda v: None,
)
def test_resumable(api: ApiKind, body: dict[str, Any], expected: bool) -> None:
    assert resumable(api, body) is expected


def test_completion_resume_appends_the_produced_text_and_shrinks_the_limits() -> None:
    body = {**COMPLETION, "min_tokens": 5}
    out = resume_body(ApiKind.COMPLETION, body, " a time", 3, continue_fields=dict(VLLM.continue_chat))
    assert out["prompt"] == "Once upon a time"
    assert out["max_tokens"] == 17
    assert out["min_tokens"] == 2
    assert body["prompt"] == "Once upon"
    assert body["max_tokens"] == 20
    assert "continue_final_message" not in out


def test_chat_resume_continues_a_final_assistant_message() -> None:
    body = {**CHAT, "max_completion_tokens": 10}
    vllm = resume_body(ApiKind.CHAT, body, "Hello th", 4, continue_fields=dict(VLLM.continue_chat))
    assert vllm["messages"] == [*CHAT["messages"], {"role": "assistant", "content": "Hello th"}]
    assert vllm["continue_final_message"] is True
    assert vllm["add_generation_prompt"] is False  # vLLM refuses continue_final_message without it
    assert vllm["max_tokens"] == 16
    assert vllm["max_completion_tokens"] == 6
    sglang = resume_body(ApiKind.CHAT, body, "Hello th", 4, continue_fields=dict(SGLANG.continue_chat))
    assert sglang["continue_final_message"] is True
    assert "add_generation_prompt" not in sglang
    assert len(body["messages"]) == 1


def test_resume_before_any_token_sends_the_original_call() -> None:
    assert resume_body(ApiKind.CHAT, CHAT, "", 0, continue_fields=dict(VLLM.continue_chat)) == CHAT


def test_resume_never_asks_for_less_than_one_token() -> None:
    out = resume_body(ApiKind.COMPLETION, COMPLETION, "x" * 30, 30, continue_fields={})
    assert out["max_tokens"] == 1


# ---------------------------------------------------------------- the relay stitches a resumed stream


def _chunk(cid: str, created: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": "served",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(cid: str, prompt: int, completion: int) -> bytes:
    obj = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 9,
        "model": "served",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _events(data: bytes) -> list[Any]:
    out = []
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(orjson.loads(event[6:]))
    return out


def _first_run(relay: SseRelay) -> bytes:
    sent = relay.feed(_chunk("chatcmpl-1", 100, {"role": "assistant", "content": ""}), 1.0)
    sent += relay.feed(_chunk("chatcmpl-1", 100, {"content": "Hel"}), 1.1)
    sent += relay.feed(_chunk("chatcmpl-1", 100, {"content": "lo"}), 1.2)
    return sent


@pytest.mark.parametrize("include_usage", [True, False])
def test_a_resumed_stream_is_one_stream_to_the_client(include_usage: bool) -> None:
    relay = SseRelay(include_usage=include_usage, served_model="served", client_model="alias")
    sent = _first_run(relay)
    assert relay.stream_id == "chatcmpl-1"
    assert relay.created == 100
    relay.resume(prompt_tokens=7)
    # The resumed call's stream: its own id, created and role chunk, and its own usage.
    second = _chunk("chatcmpl-2", 200, {"role": "assistant", "content": ""})
    second += _chunk("chatcmpl-2", 200, {"content": " wor"})
    second += _chunk("chatcmpl-2", 200, {"content": "ld"}, finish="length")
    second += _usage("chatcmpl-2", 9, 2)
    second += b"data: [DONE]\n\n"
    sent += relay.feed(second, 5.0)
    events = _events(sent)
    assert {e["id"] for e in events} == {"chatcmpl-1"}
    assert {e["created"] for e in events} == {100}
    assert {e["model"] for e in events} == {"alias"}
    roles = [e for e in events if e["choices"] and "role" in e["choices"][0]["delta"]]
    assert len(roles) == 1
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == "Hello world"
    assert relay.produced_text == "Hello world"
    assert relay.tokens == 4
    assert relay.done
    usage = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert relay.usage == usage
    usages = [e["usage"] for e in events if e.get("usage")]
    assert usages == ([usage] if include_usage else [])
    assert relay.gaps == pytest.approx([0.1, 0.0])  # the wait for the resumed call is no engine gap


def test_a_resumed_stream_without_a_prompt_count_takes_the_engines_less_the_produced_tokens() -> None:
    relay = SseRelay(include_usage=True, served_model="m", client_model="m")
    _first_run(relay)
    relay.resume(prompt_tokens=None)
    relay.feed(_usage("chatcmpl-2", 9, 2), 5.0)
    assert relay.usage == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


def test_a_resumed_streams_error_event_reaches_the_client() -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    _first_run(relay)
    relay.resume(prompt_tokens=5)
    sent = relay.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\n', 5.0)
    assert relay.error == {"message": "boom", "code": 500}
    assert orjson.loads(sent[6:]) == {"error": {"message": "boom", "code": 500}}


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_an_assembled_answer_is_an_ordinary_response(chat: bool) -> None:
    relay = SseRelay(include_usage=False, served_model="served", client_model="alias")
    _first_run(relay)
    relay.feed(_chunk("chatcmpl-1", 100, {"content": "!"}, finish="stop"), 1.3)
    relay.feed(_usage("chatcmpl-1", 5, 3), 1.3)
    answer = relay.assembled(chat)
    assert answer["id"] == "chatcmpl-1"
    assert answer["created"] == 100
    assert answer["model"] == "alias"
    assert answer["object"] == ("chat.completion" if chat else "text_completion")
    choice = answer["choices"][0]
    assert (choice["message"] if chat else choice)["content" if chat else "text"] == "Hello!"
    assert choice["finish_reason"] == "stop"
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_reasoning_and_tool_calls_cannot_be_continued_from_text() -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    _first_run(relay)
    text_only = relay.continuable
    assert text_only
    relay.feed(_chunk("chatcmpl-1", 100, {"reasoning_content": "hmm"}), 1.3)
    assert not relay.continuable
    assert relay.assembled(True)["choices"][0]["message"]["reasoning_content"] == "hmm"
    tools = SseRelay(include_usage=False, served_model="m", client_model="m")
    tools.feed(_chunk("c", 1, {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}), 1.0)
    assert not tools.continuable
    assert tools.tokens == 1


def test_token_ids_asked_on_berths_behalf_are_kept_and_taken_out() -> None:
    relay = SseRelay(include_usage=False, served_model="m", client_model="m")
    relay.collect_ids()
    first = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    sent = relay.feed(
        b"data: "
        + orjson.dumps(
            {**first, "choices": [{"index": 0, "text": "a", "prompt_token_ids": [1, 2], "token_ids": [7]}]}
        )
        + b"\n\n",
        1.0,
    )
    sent += relay.feed(
        b"data: "
        + orjson.dumps({**first, "choices": [{"index": 0, "text": "b", "token_ids": [8, 9]}]})
        + b"\n\n",
        1.1,
    )
    assert relay.prompt_ids == [1, 2]
    assert relay.generated_ids == [7, 8, 9]
    assert b"token_ids" not in sent
    assert relay.produced_text == "ab"
    relay.resume(prompt_tokens=2)
    relay.feed(
        b"data: "
        + orjson.dumps(
            {
                **first,
                "choices": [{"index": 0, "text": "c", "prompt_token_ids": [1, 2, 7, 8, 9], "token_ids": [5]}],
            }
        )
        + b"\n\n",
        2.0,
    )
    assert relay.prompt_ids == [1, 2]  # the original prompt's, not the resumed call's
    assert relay.generated_ids == [7, 8, 9, 5]
