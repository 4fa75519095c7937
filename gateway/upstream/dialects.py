"""The request half of the engine dialects: what an engine call to vLLM or SGLang may carry and how it
is aborted or counted (the metric half is `gateway.telemetry.engine_metrics`).

Priority: both engines take an integer `priority` in the request body when they run priority
scheduling (vLLM `--scheduling-policy priority`: lower runs first; an FCFS vLLM answers 400 "Priority
scheduling is not enabled" to a request that carries one. SGLang `--enable-priority-scheduling`: higher
runs first by default). `Dialect.priority` turns berth's urgency (0 most urgent) into the engine's value.

Abort: both engines abort a request when its HTTP connection closes. vLLM's OpenAI routes are wrapped
in `with_cancellation` (`vllm/entrypoints/utils.py`: a task waits for `http.disconnect` and cancels the
handler, and the cancelled generator aborts the request in the engine); streams stop with the
`StreamingResponse`. SGLang's `TokenizerManager` checks `request.is_disconnected()` while it waits and
calls `abort_request(rid)` (and aborts streams on disconnect too). So closing the upstream connection
is the abort. SGLang also has `POST /abort_request` with `{"rid": ...}` (its OpenAI requests accept a
`rid` field), which `abort_path`/`abort_body` describe for callers that want to abort without closing.

Resume (gateway.upstream.resume): both engines continue a chat's final assistant message with
`continue_final_message: true`; vLLM also needs `add_generation_prompt: false` (it rejects both set),
SGLang renders the prefill from `continue_final_message` alone.

Tokenize (exact prompt-token counts, `[telemetry] prompt_tokens = "tokenize"`): both engines answer
`POST /tokenize` with `{"count": N, "max_model_len": M, "tokens": [...]}`.
- vLLM (`vllm/entrypoints/serve/tokenize/`): `{"model", "prompt", "add_special_tokens"}` counts a
  completion prompt; `{"model", "messages", "add_generation_prompt", "continue_final_message",
  "add_special_tokens", "chat_template", "chat_template_kwargs", "tools", ...}` renders the chat
  template as `/v1/chat/completions` does (same defaults) and counts that. A model the server does
  not serve is a 404.
- SGLang (`sglang/srt/entrypoints/http_server.py`, also at `/v1/tokenize`): `{"model", "prompt",
  "add_special_tokens"}`; current releases also take `messages` (with `tools`, `tool_choice`,
  `reasoning_effort`, `continue_final_message`, `chat_template_kwargs`) and render them as a chat
  request, older ones answer 400 to that, and the gateway falls back to its estimate.
Only a prompt that is one string, or chat messages of text only, is counted (a batch of prompts,
token ids or a message with an image part is not: `tokenize_body` returns None), and the request's
other fields never reach the tokenize call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec
import orjson

from gateway.core.types import ApiKind, EngineKind


@dataclass(frozen=True, slots=True)
class Dialect:
    """How to send requests to one kind of engine."""

    kind: EngineKind
    # Closing the HTTP connection aborts the request inside the engine.
    aborts_on_disconnect: bool = True
    # An explicit abort endpoint (POST, JSON body from `abort_body`), when the engine has one.
    abort_path: str | None = None
    # The request-body field that sets the engine's own request id (what `abort_body` refers to).
    request_id_field: str | None = None
    # Priority scheduling: vLLM runs the lowest `priority` first, SGLang the highest (its default).
    priority_higher_first: bool = False
    # The tokenize route (POST, JSON body from `tokenize_body`); None: the engine has none.
    tokenize_path: str | None = "/tokenize"
    # Fields of a chat request that shape its rendered prompt and that the tokenize route takes too;
    # empty: the route counts no chat messages.
    tokenize_chat_fields: tuple[str, ...] = ()
    # The chat fields that make the engine continue the final assistant message instead of answering
    # it (a resumed request, gateway.upstream.resume).
    continue_chat: tuple[tuple[str, Any], ...] = (("continue_final_message", True),)
    # The completions route reports token ids when asked (vLLM's `return_token_ids`: the prompt's in
    # the first chunk, each chunk's generated ones): a completion then resumes from exact ids.
    returns_token_ids: bool = False

    def priority(self, urgency: int) -> int:
        """The engine's `priority` value for berth's urgency (0 most urgent, larger less urgent)."""
        return -urgency if self.priority_higher_first else urgency

    def abort_body(self, request_id: str) -> bytes | None:
        """The JSON body for `POST abort_path` that aborts `request_id`; None without `abort_path`."""
        if self.abort_path is None:
            return None
        return orjson.dumps({"rid": request_id})

    def tokenize_body(self, api: ApiKind, body: Mapping[str, Any], model: str) -> bytes | None:
        """The JSON body for `POST tokenize_path` that counts the prompt of `body` (an OpenAI request
        of kind `api`, as validated by the front) under `model`, the engine's served name; None when
        the engine cannot count it (no tokenize route, chat without `tokenize_chat_fields`, or a
        completion / embedding input that is not one string) or should not: a chat message with an
        image, audio or other non-text part (the engine would fetch and process the media once more
        just to count)."""
        if self.tokenize_path is None:
            return None
        out: dict[str, Any] = {"model": model}
        if api is ApiKind.CHAT:
            if not self.tokenize_chat_fields or not _text_only(body.get("messages")):
                return None
            for key in self.tokenize_chat_fields:
                value = body.get(key)
                if value is not None:
                    out[key] = value
        else:
            prompt = body.get("prompt" if api is ApiKind.COMPLETION else "input")
            if not isinstance(prompt, str):
                return None
            out["prompt"] = prompt
            special = body.get("add_special_tokens")
            if isinstance(special, bool):
                out["add_special_tokens"] = special
        return orjson.dumps(out)


VLLM: Final = Dialect(
    kind=EngineKind.VLLM,
    # vLLM refuses continue_final_message together with add_generation_prompt (its default: true).
    continue_chat=(("continue_final_message", True), ("add_generation_prompt", False)),
    returns_token_ids=True,
    tokenize_chat_fields=(
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "chat_template",
        "chat_template_kwargs",
        "tools",
    ),
)

SGLANG: Final = Dialect(
    kind=EngineKind.SGLANG,
    abort_path="/abort_request",
    request_id_field="rid",
    priority_higher_first=True,
    tokenize_chat_fields=(
        "messages",
        "tools",
        "tool_choice",
        "reasoning_effort",
        "continue_final_message",
        "chat_template_kwargs",
    ),
)

DIALECTS: Final[tuple[Dialect, ...]] = (VLLM, SGLANG)
_BY_KIND: Final[dict[EngineKind, Dialect]] = {d.kind: d for d in DIALECTS}


def dialect_for(kind: EngineKind) -> Dialect:
    return _BY_KIND[kind]


def _text_only(messages: object) -> bool:
    """Whether every message's content is a string, null, or a list of "text" parts."""
    if not isinstance(messages, list):
        return False
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
            not isinstance(part, dict) or part.get("type") != "text" for part in content
        ):
            return False
    return True


class _CountAnswer(msgspec.Struct):
    count: Annotated[int, msgspec.Meta(ge=0)]


class _IdsAnswer(msgspec.Struct):
    tokens: tuple[Annotated[int, msgspec.Meta(ge=0)], ...]


# msgspec reads only the field asked for and skips the rest without building it: the count of an
# 8,000-token answer costs ~20 µs instead of the ~160 µs of a whole parse, the ids ~100 µs instead of ~870.
_COUNT: Final = msgspec.json.Decoder(_CountAnswer)
_IDS: Final = msgspec.json.Decoder(_IdsAnswer)


def tokenize_count(body: bytes) -> int:
    """The prompt-token count from a tokenize answer (`{"count": N, ...}`, both engines). Raises
    ValueError when the body is not that shape or `count` is not a non-negative integer."""
    try:
        return _COUNT.decode(body).count
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"tokenize answer has no non-negative integer 'count': {e}") from None


def tokenize_ids(body: bytes) -> tuple[int, ...]:
    """The token ids from a tokenize answer (`{"tokens": [...], ...}`, both engines). Raises ValueError
    when there is no list of non-negative integers."""
    try:
        return _IDS.decode(body).tokens
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"tokenize answer has no list of token ids ('tokens'): {e}") from None
