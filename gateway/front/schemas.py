"""Validation of OpenAI request bodies: only the fields berth acts on are checked, the rest pass through.

Errors name the field (`messages[2].role`), so a client sees exactly what to fix. Engines accept many
extra fields (vLLM's `min_tokens`, `ignore_eos`, ...); those are forwarded untouched.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core import errors
from gateway.core.types import ApiKind, ParsedRequest


def parse_body(api: ApiKind, raw: bytes) -> ParsedRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise errors.bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise errors.bad_request("request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _field("model", "is required and must be a non-empty string")
    # The optional fields are checked only when present (`_opt_*` with the value in hand): most requests
    # leave most of them out, and this runs for every request.
    get = body.get
    stream = get("stream")
    if stream is not None and stream is not True and stream is not False:
        raise _field("stream", "must be a boolean")
    if api is ApiKind.RESPONSES:
        return _responses(body, model, bool(stream))
    include_usage = False
    so = get("stream_options")
    if so is not None:
        if not stream:
            raise _field("stream_options", "is only allowed when stream is true")
        if not isinstance(so, dict):
            raise _field("stream_options", "must be an object")
        include_usage = bool(_opt_bool(so, "include_usage", path="stream_options.include_usage"))
    max_tokens = get("max_tokens")
    if max_tokens is not None:
        max_tokens = _pos_int("max_tokens", max_tokens)
    mct = get("max_completion_tokens")
    if mct is not None:
        mct = _pos_int("max_completion_tokens", mct)
        max_tokens = mct if max_tokens is None else min(max_tokens, mct)
    n = get("n")
    if n is not None:
        _pos_int("n", n)
    if api is ApiKind.CHAT:
        chars = _check_messages(body)
    elif api is ApiKind.COMPLETION:
        chars = _check_prompt(body, "prompt")
    else:
        chars = _check_prompt(body, "input")
        if stream:
            raise _field("stream", "is not supported for embeddings")
    return ParsedRequest(api, body, model, bool(stream), include_usage, max_tokens, chars)


def _responses(body: dict[str, Any], model: str, stream: bool) -> ParsedRequest:
    """A Responses API request (`input`: a string or a list of items; `max_output_tokens`). Its stream
    always ends with the usage (`response.completed`), so berth asks for nothing more: include_usage
    True leaves the body as the client sent it."""
    mot = body.get("max_output_tokens")
    max_tokens = None if mot is None else _pos_int("max_output_tokens", mot)
    prev = body.get("previous_response_id")
    if prev is not None and (not isinstance(prev, str) or not prev):
        raise _field("previous_response_id", "must be a non-empty string")
    chars = _input_chars(body.get("input"))
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        chars += len(instructions)
    return ParsedRequest(ApiKind.RESPONSES, body, model, stream, True, max_tokens, chars)


def _input_chars(items: object) -> int:
    """The text characters of a Responses `input`: a string, or items whose `content` is a string or a
    list of parts with `text` (other items, such as a tool call's output, count their `output`)."""
    if isinstance(items, str):
        return len(items)
    if not isinstance(items, list) or not items:
        raise _field("input", "is required and must be a string or a non-empty array of items")
    chars = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _field(f"input[{i}]", "must be an object")
        content = item.get("content", item.get("output"))
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    chars += len(text)
    return chars


def _field(path: str, problem: str) -> errors.BerthError:
    return errors.bad_request(f"'{path}' {problem}", param=path)


def _opt_bool(obj: dict[str, Any], key: str, *, path: str | None = None) -> bool | None:
    v = obj.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise _field(path or key, "must be a boolean")


def _pos_int(key: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _field(key, "must be a positive integer")
    return v


def _check_messages(body: dict[str, Any]) -> int:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _field("messages", "is required and must be a non-empty array")
    chars = 0
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _field(f"messages[{i}]", "must be an object")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise _field(f"messages[{i}].role", "is required and must be a string")
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    raise _field(f"messages[{i}].content[{j}]", "must be an object")
                text = part.get("text")
                if isinstance(text, str):
                    chars += len(text)
        elif content is not None:
            raise _field(f"messages[{i}].content", "must be a string, an array of parts, or null")
    return chars


def _check_prompt(body: dict[str, Any], key: str) -> int:
    p = body.get(key)
    if isinstance(p, str):
        return len(p)
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return sum(len(x) for x in p)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return 4 * len(p)  # token ids: count as tokens
        if all(isinstance(x, list) for x in p):
            return 4 * sum(len(x) for x in p)
    raise _field(key, "is required and must be a string, an array of strings, or an array of token ids")
