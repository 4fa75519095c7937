"""The OpenAI API surface of a simulated endpoint: request parsing, the prompt-token rule, and the
exact response / SSE chunk shapes vLLM and SGLang produce.

**Prompt tokens** are counted deterministically, without a tokenizer:

- completions: a string prompt counts ``ceil(len(prompt) / 4)`` tokens (at least 1); a list of token
  ids counts its length; a one-element list of either counts as that element;
- chat: the messages are rendered as ``"<|{role}|>\\n{content}\\n"`` each (content parts of type
  ``text`` joined with no separator), followed by the generation prompt ``"<|assistant|>\\n"``; the
  prompt counts ``ceil(len(rendered) / 4)`` tokens.

**Output tokens** are the ASCII word ``" tok"``, one token per SSE chunk.

Errors use the OpenAI error shape that vLLM returns: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

ApiName = Literal["chat", "completion"]

TOKEN_TEXT = " tok"
_GENERATION_PROMPT = "<|assistant|>\n"


class ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": err_type, "param": param, "code": status}})


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    api: ApiName
    model: str
    prompt_tokens: int
    max_tokens: int  # after defaulting to max_model_len - prompt_tokens
    max_tokens_given: bool
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    priority: int
    rid: str | None = None  # SGLang: the caller's request id (what POST /abort_request names)


def chat_prompt_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    parts: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict):
            raise bad_request("each message must be an object", "messages")
        role = msg.get("role")
        if not isinstance(role, str):
            raise bad_request("each message needs a string 'role'", "messages")
        content = msg.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = "".join(
                p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and "text" in p
            )
        else:
            raise bad_request("message 'content' must be a string or a list of parts", "messages")
        parts.append(f"<|{role}|>\n{text}\n")
    parts.append(_GENERATION_PROMPT)
    return max(1, math.ceil(sum(len(p) for p in parts) / 4))


def completion_prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return max(1, math.ceil(len(prompt) / 4))
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("the simulator serves one prompt per request", "prompt")
    raise bad_request("'prompt' must be a string or a list of token ids", "prompt")


def _int_field(data: dict[str, Any], key: str, default: int | None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{key}' must be an integer", key)
    return value


def parse_request(
    api: ApiName,
    data: Any,
    *,
    models: Sequence[str],
    max_model_len: int,
    priority_enabled: bool,
    reject_priority_without_policy: bool,
) -> ParsedRequest:
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    model = data.get("model", models[0])
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model not in models:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    if api == "chat":
        prompt_tokens = chat_prompt_tokens(data.get("messages"))
        max_tokens = _int_field(data, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = _int_field(data, "max_tokens", None)
    else:
        if "prompt" not in data:
            raise bad_request("'prompt' is required", "prompt")
        prompt_tokens = completion_prompt_tokens(data["prompt"])
        max_tokens = _int_field(data, "max_tokens", 16)  # the OpenAI completions default
    n = _int_field(data, "n", 1)
    if n != 1:
        raise bad_request("the simulator serves n=1 only", "n")
    given = max_tokens is not None
    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens
    if max_tokens < 1:
        raise bad_request("max_tokens must be at least 1", "max_tokens")
    if prompt_tokens + max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            "max_tokens",
        )
    min_tokens = _int_field(data, "min_tokens", 0) or 0
    if min_tokens < 0 or min_tokens > max_tokens:
        raise bad_request("min_tokens must be within [0, max_tokens]", "min_tokens")
    stream = bool(data.get("stream", False))
    opts = data.get("stream_options")
    include_usage = bool(stream and isinstance(opts, dict) and opts.get("include_usage"))
    priority = _int_field(data, "priority", 0) or 0
    if priority != 0 and not priority_enabled:
        if reject_priority_without_policy:
            raise bad_request(f"Got priority {priority} but Priority scheduling is not enabled.", "priority")
        priority = 0
    rid = data.get("rid")
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise bad_request("'rid' must be a non-empty string", "rid")
    return ParsedRequest(
        rid=rid,
        api=api,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        max_tokens_given=given,
        min_tokens=min_tokens,
        ignore_eos=bool(data.get("ignore_eos", False)),
        stream=stream,
        include_usage=include_usage,
        priority=priority,
    )


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class ResponseWriter:
    """Builds the bytes of one response. Token chunks are pre-rendered once per request, so streaming
    a token costs a bytes concatenation."""

    __slots__ = ("_api", "_created", "_id", "_model", "token_chunk")

    def __init__(self, api: ApiName, request_id: str, model: str) -> None:
        self._api = api
        self._id = request_id
        self._model = model
        self._created = int(time.time())
        self.token_chunk = self._chunk(TOKEN_TEXT, None)

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self._id, "object": obj, "created": self._created, "model": self._model}

    def _chunk(self, text: str, finish_reason: str | None) -> bytes:
        if self._api == "chat":
            body = self._base("chat.completion.chunk")
            body["choices"] = [
                {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
            ]
        else:
            body = self._base("text_completion")
            body["choices"] = [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ]
        return _sse(body)

    def role_chunk(self) -> bytes:
        """Chat streams open with the assistant role and empty content (sent with the first token)."""
        if self._api != "chat":
            return b""
        body = self._base("chat.completion.chunk")
        body["choices"] = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        return _sse(body)

    def last_token_chunk(self, finish_reason: str) -> bytes:
        return self._chunk(TOKEN_TEXT, finish_reason)

    def finish_chunk(self, finish_reason: str) -> bytes:
        """A chunk with no content that only ends the choice (an aborted request)."""
        return self._chunk("", finish_reason)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        body = self._base("chat.completion.chunk" if self._api == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = _usage(prompt_tokens, completion_tokens)
        return _sse(body)

    def full_response(self, prompt_tokens: int, completion_tokens: int, finish_reason: str) -> bytes:
        text = TOKEN_TEXT * completion_tokens
        if self._api == "chat":
            body = self._base("chat.completion")
            body["choices"] = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ]
        else:
            body = self._base("text_completion")
            body["choices"] = [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ]
        body["usage"] = _usage(prompt_tokens, completion_tokens)
        return orjson.dumps(body)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
