"""A sans-IO relay for OpenAI-style server-sent events.

`SseRelay.feed(chunk, now)` takes raw bytes as they arrive from the engine and returns the bytes to send
to the client. Along the way it records what a later resume needs and what the metrics need: the text
produced so far, the number of generated events (tokens: content, reasoning and tool-call deltas alike),
the engine's usage report, the finish reason, the time of the first generated token and of the first
content, and every gap between tokens.

Per event it does one `orjson.loads`; the event's bytes are forwarded as they came (with the model name
rewritten when the client used an alias), so the hot path never re-serialises JSON.
"""

from __future__ import annotations

from typing import Any

import orjson

_DONE = b"[DONE]"
#: Delta fields other than `content` that carry generated tokens (vLLM writes `reasoning_content`, newer
#: releases `reasoning`; SGLang `reasoning_content`).
_GENERATED_FIELDS = frozenset(("reasoning_content", "reasoning", "tool_calls"))


class SseRelay:
    __slots__ = (
        "_buf",
        "_model_from",
        "_model_to",
        "done",
        "error",
        "finish_reason",
        "first_content_at",
        "first_token_at",
        "gaps",
        "include_usage",
        "last_token_at",
        "text",
        "tokens",
        "usage",
    )

    def __init__(self, *, include_usage: bool, served_model: str, client_model: str) -> None:
        self._buf = b""
        self.include_usage = include_usage
        if served_model != client_model:
            self._model_from: tuple[bytes, ...] = (
                b'"model":' + orjson.dumps(served_model),
                b'"model": ' + orjson.dumps(served_model),
            )
            self._model_to = b'"model":' + orjson.dumps(client_model)
        else:
            self._model_from = ()
            self._model_to = b""
        self.text: list[str] = []  # content produced so far, for resuming elsewhere
        self.tokens = 0  # generated events seen (one per token on vLLM/SGLang), of any kind
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.first_token_at: float | None = None  # the first generated token of any kind (TTFT)
        self.first_content_at: float | None = None  # the first content (text) a client can show
        self.last_token_at: float | None = None
        self.gaps: list[float] = []  # every inter-token gap of the stream (seconds); telemetry needs all
        self.done = False
        self.error: dict[str, Any] | None = None

    def feed(self, chunk: bytes, now: float) -> bytes:
        """Consume engine bytes; return the bytes to forward to the client now (possibly empty)."""
        if (
            not self._buf
            and chunk.startswith(b"data: {")
            and chunk.endswith(b"}\n\n")
            and chunk.find(b"\n") == len(chunk) - 2
        ):
            # One whole `data: {...}` event and nothing else: how a token stream arrives, chunk by chunk.
            return self._data(chunk, chunk[6:-2], now) or b""
        buf = self._buf + chunk if self._buf else chunk
        if b"\r\n" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        self._buf = buf[end + 2 :] if end + 2 < len(buf) else b""
        if buf.find(b"\n\n") == end:  # one event: how a token stream arrives, chunk by chunk
            return self._event(buf[:end], now) or b""
        out: list[bytes] = []
        for event in buf[:end].split(b"\n\n"):
            forwarded = self._event(event, now)
            if forwarded is not None:
                out.append(forwarded)
        return b"".join(out)

    def flush(self) -> bytes:
        """What is left in the buffer when the engine closed the stream (an unterminated event)."""
        rest, self._buf = self._buf, b""
        if rest.strip():
            fwd = self._event(rest, None)
            return fwd if fwd is not None else b""
        return b""

    def _event(self, event: bytes, now: float | None) -> bytes | None:
        if not event.startswith(b"data:"):
            # comments (": ping") and other fields pass through untouched
            return event + b"\n\n" if event.strip() else None
        payload = event[5:].strip()
        if payload == _DONE:
            self.done = True
            return b"data: [DONE]\n\n"
        if len(event) == len(payload) + 6 and event[5] == 32:  # "data: <payload>" exactly
            return self._data(event + b"\n\n", payload, now)
        return self._data(None, payload, now, event)

    def _data(
        self, whole: bytes | None, payload: bytes, now: float | None, event: bytes = b""
    ) -> bytes | None:
        """A data event's forwarded bytes; `whole` is the event as `data: <payload>\\n\\n` if it was so."""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return whole if whole is not None else event + b"\n\n"
        if type(obj) is not dict:  # orjson makes plain dicts, never subclasses
            return whole if whole is not None else event + b"\n\n"
        if "error" in obj and "choices" not in obj:
            err = obj["error"]
            self.error = err if isinstance(err, dict) else {"message": str(err)}
        # An engine's garbage (a `choices` that is no array, a `usage` that is no object) is relayed
        # as it came, and read as nothing.
        choices = obj.get("choices")
        if type(choices) is not list:
            choices = None
        usage = obj.get("usage")
        if type(usage) is not dict:
            usage = None
        if usage:
            self.usage = usage
        if choices:
            self._choices(choices, now)
        elif usage and not self.include_usage:
            return None  # the usage-only chunk berth asked for on its own behalf
        if usage and not self.include_usage:
            # usage attached to a content chunk the client did not ask about: drop the field
            obj["usage"] = None
            return b"data: " + self._rename(orjson.dumps(obj)) + b"\n\n"
        if self._model_from:
            return b"data: " + self._rename(payload) + b"\n\n"
        return whole if whole is not None else b"data: " + payload + b"\n\n"

    def _rename(self, payload: bytes) -> bytes:
        for pat in self._model_from:
            if pat in payload:
                return payload.replace(pat, self._model_to, 1)
        return payload

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
                if piece or _GENERATED_FIELDS.intersection(k for k, v in delta.items() if v):
                    got_token = True
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

    @property
    def produced_text(self) -> str:
        return "".join(self.text)


def error_event(body: dict[str, Any]) -> bytes:
    """An OpenAI-style error event that ends a stream (the openai SDK raises APIError on it)."""
    return b"data: " + orjson.dumps(body) + b"\n\n"
