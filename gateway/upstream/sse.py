"""A sans-IO relay for OpenAI-style server-sent events.

`SseRelay.feed(chunk, now)` takes raw bytes as they arrive from the engine and returns the bytes to send
to the client. Along the way its base, `StreamTally` (`gateway.upstream.stream_tally`), records what a
later resume needs and what the metrics need: the text produced so far, the number of generated events
(tokens: content, reasoning and tool-call deltas alike), the engine's usage report, the finish reason,
the time of the first generated token and of the first content, and every gap between tokens.

Per event it does one `orjson.loads`; the event's bytes are forwarded as they came (with the model name
rewritten when the client used an alias), so the hot path never re-serialises JSON.

The Responses API's stream (`event: response.output_text.delta` then `data: {...}`, no `[DONE]`: it ends
with `response.completed`, `response.incomplete` or `response.failed`) is relayed byte for byte as well
and read the same way (vLLM sends one delta event per engine step, as for chat; `StreamTally` reads
them).

A preempted stream goes on with the engine stream of its resumed call (`resume()`): the relay then
stitches that stream onto what the client already has, so that the client sees one stream: the first
stream's `id` and `created` in every chunk, no second role chunk, and one usage report whose prompt
tokens are the original prompt's and whose completion tokens count every token the client got. Only
resumed streams are re-serialised.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.upstream.stream_tally import StreamTally

_DONE = b"[DONE]"


class SseRelay(StreamTally):
    __slots__ = (
        "_buf",
        "_model_from",
        "_model_to",
        "_stitch",
        "generated_ids",
        "include_usage",
        "prompt_ids",
    )

    def __init__(self, *, include_usage: bool, served_model: str, client_model: str) -> None:
        super().__init__(client_model)  # what the stream produced (`StreamTally`)
        self._buf = b""
        self._stitch: _Stitch | None = None
        self.include_usage = include_usage
        # With `collect_ids()`: the token ids the engine reports (vLLM's return_token_ids), taken out of
        # what the client sees: the prompt's (from the first stream) and every generated one.
        self.prompt_ids: list[int] | None = None
        self.generated_ids: list[int] | None = None
        if served_model != client_model:
            self._model_from: tuple[bytes, ...] = (
                b'"model":' + orjson.dumps(served_model),
                b'"model": ' + orjson.dumps(served_model),
            )
            self._model_to = b'"model":' + orjson.dumps(client_model)
        else:
            self._model_from = ()
            self._model_to = b""

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
        if event.startswith(b"event:"):
            return self._named(event, now)
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
        if self._stitch is not None:
            return self._stitched(obj, self._stitch, now)
        if self.stream_id is None:
            sid = obj.get("id")
            if isinstance(sid, str):
                self.stream_id = sid
                created = obj.get("created")
                self.created = created if isinstance(created, int) else None
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
        if self.generated_ids is not None and choices and self._take_ids(choices):
            whole, payload = None, orjson.dumps(obj)
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

    def _named(self, event: bytes, now: float | None) -> bytes:
        """A named event (the Responses API's `event: <type>` line, then its `data:`): read, and
        forwarded as it came (with the model renamed)."""
        nl = event.find(b"\n")
        data = event[nl + 1 :] if nl >= 0 else b""
        if data.startswith(b"data:"):
            try:
                obj = orjson.loads(data[5:])
            except orjson.JSONDecodeError:
                obj = None
            if type(obj) is dict:
                self._response_event(obj, now)
        if self._model_from:
            event = self._rename(event)
        return event + b"\n\n"

    def collect_ids(self) -> None:
        """The engine was asked for token ids (a completion that may be resumed): keep them for the
        resume, and take them out of the events the client gets."""
        self.generated_ids = []

    def _take_ids(self, choices: Any) -> bool:
        """Take the token-id fields out of `choices` (in place); whether there were any."""
        found = False
        if not isinstance(choices, list):
            return False
        for c in choices:
            if type(c) is not dict:
                continue
            prompt = c.pop("prompt_token_ids", None)
            if isinstance(prompt, list) and self.prompt_ids is None:
                self.prompt_ids = prompt
            ids = c.pop("token_ids", None)
            if isinstance(ids, list) and self.generated_ids is not None:
                self.generated_ids.extend(ids)
            found = found or prompt is not None or ids is not None
        return found

    def _rename(self, payload: bytes) -> bytes:
        for pat in self._model_from:
            if pat in payload:
                return payload.replace(pat, self._model_to, 1)
        return payload

    def resume(self, prompt_tokens: int | None) -> None:
        """The next bytes fed come from the resumed call's engine stream: stitch them onto this one.
        `prompt_tokens`: the original prompt's tokens, reported in the final usage (None: the resumed
        call's count less the tokens produced before)."""
        self._stitch = _Stitch(self.tokens, prompt_tokens)
        self._buf = b""
        self.done = False
        self.error = None
        self.finish_reason = None
        self.usage = None
        self.last_token_at = None  # the wait for the resumed call is no inter-token gap of an engine

    def _stitched(self, obj: dict[str, Any], stitch: _Stitch, now: float | None) -> bytes | None:
        if "error" in obj and "choices" not in obj:
            err = obj["error"]
            self.error = err if isinstance(err, dict) else {"message": str(err)}
            return b"data: " + orjson.dumps(obj) + b"\n\n"
        choices = obj.get("choices")
        if self.generated_ids is not None:
            self._take_ids(choices)
        if isinstance(choices, list):
            kept = []
            for c in choices:
                if type(c) is dict and type(c.get("delta")) is dict and "role" in c["delta"]:
                    delta = {k: v for k, v in c["delta"].items() if k != "role"}
                    if not any(delta.values()) and not c.get("finish_reason"):
                        continue  # the resumed call's role chunk: the client has had one
                    kept.append({**c, "delta": delta})
                    continue
                kept.append(c)
            obj["choices"] = choices = kept
            if choices:
                self._choices(choices, now)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            usage = self.usage = stitch.usage(usage)
            obj["usage"] = usage if self.include_usage else None
        if not choices and not (usage and self.include_usage):
            return None
        if self.stream_id is not None:
            obj["id"] = self.stream_id
        if self.created is not None:
            obj["created"] = self.created
        if "model" in obj:
            obj["model"] = self._client_model
        return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Stitch:
    """What a resumed stream's usage adds to: the tokens streamed before, the original prompt's count."""

    __slots__ = ("before", "prompt_tokens")

    def __init__(self, before: int, prompt_tokens: int | None) -> None:
        self.before = before
        self.prompt_tokens = prompt_tokens

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        resumed = usage.get("completion_tokens")
        completion = self.before + (resumed if isinstance(resumed, int) else 0)
        prompt = self.prompt_tokens
        if prompt is None:
            engine_prompt = usage.get("prompt_tokens")
            prompt = max(0, engine_prompt - self.before) if isinstance(engine_prompt, int) else 0
        out = {**usage, "prompt_tokens": prompt, "completion_tokens": completion}
        out["total_tokens"] = prompt + completion
        return out


def error_event(body: dict[str, Any]) -> bytes:
    """An OpenAI-style error event that ends a stream (the openai SDK raises APIError on it)."""
    return b"data: " + orjson.dumps(body) + b"\n\n"
