"""What an engine stream produced, read event by event: the text (for a resume elsewhere and for an
assembled answer), the reasoning and whether a tool was called, the number of generated tokens and their
times (the first token, the first content, every gap between tokens), the engine's usage, the finish
reason, an error, and the stream's id.

`StreamTally` reads the two kinds of stream the engines send: chat and completion chunks' `choices`
(`_choices`), and the Responses API's events (`_response_event`: each delta event of generated text,
reasoning or a tool call's arguments is one token, `response.created` names the response, and the final
event's usage, `input_tokens` and `output_tokens`, is kept as `prompt_tokens` and `completion_tokens`).
It is the base of `gateway.upstream.sse.SseRelay`, which takes the engine's bytes apart into events and
forwards them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

#: Delta fields other than `content` that carry generated tokens (vLLM writes `reasoning_content`, newer
#: releases `reasoning`; SGLang `reasoning_content`).
_GENERATED_FIELDS = frozenset(("reasoning_content", "reasoning", "tool_calls"))
#: The Responses API's delta events that carry generated tokens, with what they are: answer text,
#: reasoning, or a tool call.
_RESPONSE_DELTAS: Final = {
    "response.output_text.delta": "text",
    "response.refusal.delta": "text",
    "response.reasoning_text.delta": "reasoning",
    "response.reasoning_summary_text.delta": "reasoning",
    "response.function_call_arguments.delta": "tool",
    "response.custom_tool_call_input.delta": "tool",
    "response.mcp_call_arguments.delta": "tool",
}
#: The events that end a Responses stream (each carries the whole response, with its usage).
_RESPONSE_ENDS: Final = frozenset(("response.completed", "response.incomplete", "response.failed"))


class StreamTally:
    __slots__ = (
        "_client_model",
        "created",
        "done",
        "error",
        "finish_reason",
        "first_content_at",
        "first_token_at",
        "gaps",
        "last_token_at",
        "on_response",
        "reasoning",
        "stream_id",
        "text",
        "tokens",
        "tool_calls",
        "usage",
    )

    def __init__(self, client_model: str) -> None:
        self._client_model = client_model  # the name an assembled answer gives
        self.stream_id: str | None = None  # the first stream's `id` and `created`, which a resume keeps
        self.created: int | None = None
        self.text: list[str] = []  # content produced so far, for resuming elsewhere
        # Other generated deltas seen: reasoning text (kept, for an assembled answer) and tool calls.
        self.reasoning: list[str] = []
        self.tool_calls = False
        self.tokens = 0  # generated events seen (one per token on vLLM/SGLang), of any kind
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.first_token_at: float | None = None  # the first generated token of any kind (TTFT)
        self.first_content_at: float | None = None  # the first content (text) a client can show
        self.last_token_at: float | None = None
        self.gaps: list[float] = []  # every inter-token gap of the stream (seconds); telemetry needs all
        self.done = False
        self.error: dict[str, Any] | None = None
        self.on_response: Callable[[str], None] | None = None  # told a Responses stream's id, once

    def _response_event(self, obj: dict[str, Any], now: float | None) -> None:
        kind = obj.get("type")
        what = _RESPONSE_DELTAS.get(kind) if type(kind) is str else None
        if what is not None:
            delta = obj.get("delta")
            if type(delta) is not str or not delta:
                return
            if what == "text":
                self.text.append(delta)
            elif what == "reasoning":
                self.reasoning.append(delta)
            else:
                self.tool_calls = True
            self._token(now, content=what == "text")
            return
        response = obj.get("response")
        if type(response) is not dict:
            if kind == "error":
                self.error = {"message": str(obj.get("message")), "code": obj.get("code")}
            return
        if kind == "response.created" and self.stream_id is None:
            rid, created = response.get("id"), response.get("created_at")
            self.stream_id = rid if isinstance(rid, str) else None
            self.created = int(created) if isinstance(created, int | float) else None
            if self.stream_id is not None and self.on_response is not None:
                self.on_response(self.stream_id)
        elif kind in _RESPONSE_ENDS:
            self.done = True
            usage = response.get("usage")
            if type(usage) is dict:
                self.usage = response_usage(usage)
            status = response.get("status")
            self.finish_reason = status if isinstance(status, str) else None
            if kind == "response.failed":
                err = response.get("error")
                self.error = err if type(err) is dict else {"message": "the engine failed the response"}

    def _token(self, now: float | None, *, content: bool) -> None:
        """One generated token seen at `now` (`content`: text a client can show)."""
        self.tokens += 1
        if now is None:
            return
        if content and self.first_content_at is None:
            self.first_content_at = now
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.gaps.append(now - self.last_token_at)
        self.last_token_at = now

    def _choices(self, choices: list[Any], now: float | None) -> None:
        got_token = got_content = False
        for c in choices:
            if type(c) is not dict:
                continue
            delta = c.get("delta")
            if type(delta) is dict:
                piece = delta.get("content")
                # A reasoning model's thinking and a tool call's name and arguments are generated
                # tokens too, though they carry no content.
                if piece:
                    got_token = True
                elif _GENERATED_FIELDS.intersection(k for k, v in delta.items() if v):
                    got_token = True
                    self._other(delta)
            else:
                piece = c.get("text")
            if piece and type(piece) is str:
                self.text.append(piece)
                got_token = got_content = True
            fr = c.get("finish_reason")
            if fr and type(fr) is str:
                self.finish_reason = fr
        if got_token:
            self.tokens += 1
            if now is not None and got_content and self.first_content_at is None:
                self.first_content_at = now
            if now is not None:
                last = self.last_token_at
                if self.first_token_at is None:
                    self.first_token_at = now
                elif last is not None:
                    self.gaps.append(now - last)
                self.last_token_at = now

    def _other(self, delta: dict[str, Any]) -> None:
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thought, str):
            self.reasoning.append(thought)
        if delta.get("tool_calls"):
            self.tool_calls = True

    @property
    def continuable(self) -> bool:
        """Whether a resumed call can continue this stream faithfully: only text was produced (a
        continuation from text alone would lose a reasoning model's thinking or a tool call)."""
        return not self.reasoning and not self.tool_calls

    @property
    def produced_text(self) -> str:
        return "".join(self.text)

    def assembled(self, chat: bool) -> dict[str, Any]:
        """The ordinary (non-streamed) answer made of the stream berth read on a client's behalf: a
        non-streamed request that may be preempted is streamed from the engine (so that what it
        produced is known if it is), and answered with this."""
        text = self.produced_text
        choice: dict[str, Any] = {"index": 0}
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
            choice["message"] = message
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = self.finish_reason
        return {
            "id": self.stream_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": self._client_model,
            "choices": [choice],
            "usage": self.usage,
        }


def response_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """A Responses API usage (`input_tokens`, `output_tokens`) in the completions' words, which the
    metrics and the tenants' accounting read."""
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    out = {**usage, "prompt_tokens": prompt, "completion_tokens": completion}
    if isinstance(prompt, int) and isinstance(completion, int):
        out["total_tokens"] = prompt + completion
    return out
