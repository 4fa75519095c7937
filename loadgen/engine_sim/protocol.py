"""The OpenAI API surface of a simulated endpoint: request parsing, the prompt-token rule, and the
exact response / SSE chunk shapes vLLM and SGLang produce.

**Prompt tokens** come from the simulator's deterministic tokenizer (`tokens`):

- completions: a string prompt counts ``ceil(len(prompt) / 4)`` tokens (at least 1); a list of token
  ids counts its length; a one-element list of either counts as that element;
- chat: the messages are rendered with the simulator's chat template (`tokens.render_chat`: markers
  ``"<|{role}|>\\n"``, the generation prompt ``"<|assistant|>\\n"`` unless ``add_generation_prompt`` is
  false or ``continue_final_message`` is true); the prompt counts ``ceil(len(rendered) / 4)`` tokens.

With ``with_ids`` (an engine with a prefix cache) `parse_request` also returns the prompt's token ids.

**Output tokens** are the ASCII word ``" tok"``, one token per SSE chunk.

Errors use the OpenAI error shape that vLLM returns: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from loadgen.engine_sim import tokens
from loadgen.engine_sim.tokens import TOKEN_TEXT, TokenIds

ApiName = Literal["chat", "completion"]


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
    prompt_ids: TokenIds | None = None  # with `with_ids`: the prompt's token ids (len == prompt_tokens)


def chat_prompt_text(
    messages: Any, *, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """The rendered prompt of chat `messages` (validated here)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    for msg in messages:
        if not isinstance(msg, dict):
            raise bad_request("each message must be an object", "messages")
        if not isinstance(msg.get("role"), str):
            raise bad_request("each message needs a string 'role'", "messages")
        content = msg.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request("message 'content' must be a string or a list of parts", "messages")
    return tokens.render_chat(
        messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
    )


def chat_prompt_tokens(messages: Any) -> int:
    return tokens.count_text(chat_prompt_text(messages))


def _single_prompt(prompt: Any) -> Any:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return prompt[0]
    return prompt


def completion_prompt_tokens(prompt: Any) -> int:
    prompt = _single_prompt(prompt)
    if isinstance(prompt, str):
        return tokens.count_text(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("the simulator serves one prompt per request", "prompt")
    raise bad_request("'prompt' must be a string or a list of token ids", "prompt")


def completion_prompt_ids(prompt: Any) -> TokenIds | None:
    """The token ids of a (validated) completion prompt; None for an empty string prompt."""
    prompt = _single_prompt(prompt)
    if isinstance(prompt, str):
        return tokens.encode(prompt) if prompt else None
    ids = tokens.as_token_ids(prompt)
    if ids is None:
        raise bad_request("token ids must be non-negative integers", "prompt")
    return ids


def chat_flags(data: dict[str, Any]) -> tuple[bool, bool]:
    add_gen = data.get("add_generation_prompt", True)
    cont = data.get("continue_final_message", False)
    if not isinstance(add_gen, bool) or not isinstance(cont, bool):
        raise bad_request("add_generation_prompt and continue_final_message must be booleans")
    return add_gen, cont


def prompt_token_ids(api: ApiName, data: dict[str, Any]) -> TokenIds | None:
    """The prompt's token ids of a request body, as the engine tokenizes it (None: no ids, as for an
    empty string prompt). The body is validated as `parse_request` does."""
    if api == "chat":
        add_gen, cont = chat_flags(data)
        text = chat_prompt_text(
            data.get("messages"), add_generation_prompt=add_gen, continue_final_message=cont
        )
        return tokens.encode(text) if text else None
    if "prompt" not in data:
        raise bad_request("'prompt' is required", "prompt")
    completion_prompt_tokens(data["prompt"])
    return completion_prompt_ids(data["prompt"])


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
    with_ids: bool = False,
) -> ParsedRequest:
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    model = data.get("model", models[0])
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model not in models:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    if api == "chat":
        add_gen, cont = chat_flags(data)
        text = chat_prompt_text(
            data.get("messages"), add_generation_prompt=add_gen, continue_final_message=cont
        )
        prompt_tokens = tokens.count_text(text)
        max_tokens = _int_field(data, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = _int_field(data, "max_tokens", None)
    else:
        if "prompt" not in data:
            raise bad_request("'prompt' is required", "prompt")
        prompt_tokens = completion_prompt_tokens(data["prompt"])
        max_tokens = _int_field(data, "max_tokens", 16)  # the OpenAI completions default
    prompt_ids = prompt_token_ids(api, data) if with_ids else None
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
        prompt_ids=prompt_ids,
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
