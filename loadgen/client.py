"""One measured OpenAI call: send it streaming, parse the SSE stream, time every token.

The hot path is one ``readline`` and one ``orjson.loads`` per chunk, and a clock read per content
chunk. TTFT is the first chunk with non-empty content (the chat role chunk does not count); the token
count is the usage ``completion_tokens`` when the server sends it (``stream_options.include_usage``),
else the number of content chunks; ATGT = (last token − first token) / (tokens − 1).

Error kinds: ``http_<status>``, ``timeout`` (total time or no byte for the stall timeout),
``connect`` (could not connect), ``disconnected`` (connection lost mid-stream), ``truncated`` (stream
ended without ``[DONE]``), ``stream_error`` (an error object inside the stream), ``unfinished`` (still
running when the run's drain timeout expired).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.prompt import ApiName, plain_text

_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@dataclass(slots=True)
class RequestResult:
    task_index: int
    call_index: int
    task_id: str | None
    task_type: str
    cls: str
    model: str
    api: ApiName
    prompt_tokens: int
    output_tokens: int  # requested
    slo: Slo
    sent_at_s: float  # offset from the start of the run
    status: int = 0
    ok: bool = False
    error: str | None = None
    detail: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    atgt_s: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    gaps: array[float] = field(default_factory=lambda: array("d"))
    slo_met: bool = False
    endpoint: str | None = None  # berth's x-berth-endpoint (None from an engine)
    queue_ms: float | None = None  # berth's x-berth-queue-ms

    def observed(self) -> dict[str, Any]:
        return {
            "sent_at": round(self.sent_at_s, 6),
            "status": self.status,
            "ok": self.ok,
            "error": self.error,
            "ttft_ms": _ms(self.ttft_s),
            "atgt_ms": _ms(self.atgt_s),
            "e2e_ms": _ms(self.e2e_s),
            "tokens": self.tokens,
            "finish_reason": self.finish_reason,
            "slo_met": self.slo_met,
            "endpoint": self.endpoint,
            "queue_ms": self.queue_ms,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def build_body(call: CallSpec, model: str, salt: int) -> bytes:
    n = call.output_tokens
    body: dict[str, Any] = {"model": model}
    if call.prompt is None:  # text of its own (`plain_prompt`'s one user message), without the objects
        text = plain_text(call.prompt_tokens, call.api, salt)
        if call.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
    elif call.api == "chat":
        body["messages"] = call.prompt.chat_messages()
    else:
        body["prompt"] = call.prompt.completion_text()
    body.update(
        max_tokens=n, min_tokens=n, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    if call.priority is not None:
        body["priority"] = call.priority
    return orjson.dumps(body)


def build_headers(
    task: TaskSpec, call: CallSpec, extra: Mapping[str, str], *, slo_scale: float, slo_headers: bool
) -> dict[str, str]:
    headers = {"Content-Type": "application/json", **extra}
    if call.slo_class is not None:
        headers["x-berth-slo-class"] = call.slo_class
    if task.task_id is not None:
        headers["x-berth-task-id"] = task.task_id
        if task.task_sla_ms is not None:
            headers["x-berth-task-sla-ms"] = f"{task.task_sla_ms * slo_scale:.0f}"
    if slo_headers or call.slo_headers:
        slo = call.slo.scaled(slo_scale)
        for name, value in (("ttft", slo.ttft_ms), ("itl", slo.atgt_ms), ("deadline", slo.e2e_ms)):
            if value is not None:
                headers[f"x-berth-{name}-ms"] = f"{value:.0f}"
    return headers


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    result: RequestResult,
    body: bytes,
    headers: Mapping[str, str],
) -> None:
    """Send one streaming request and fill `result` in place (also when cancelled half-way)."""
    clock = time.perf_counter  # the runner's clock; loop.time() is too coarse under uvloop
    t0 = clock()
    first: float | None = None
    last = 0.0
    chunks = 0
    usage_tokens: int | None = None
    done = False
    gaps = result.gaps
    try:
        async with session.post(base_url + _PATHS[result.api], data=body, headers=headers) as resp:
            result.status = resp.status
            result.endpoint = resp.headers.get("x-berth-endpoint")
            queue_ms = resp.headers.get("x-berth-queue-ms")
            if queue_ms is not None:
                with contextlib.suppress(ValueError):
                    result.queue_ms = float(queue_ms)
            if resp.status != 200:
                raw = await resp.read()
                result.error = f"http_{resp.status}"
                result.detail = raw[:300].decode("utf-8", "replace")
                return
            content = resp.content
            while True:
                line = await content.readline()
                if not line:
                    break
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                obj = orjson.loads(payload)
                choices = obj.get("choices")
                if choices:
                    ch = choices[0]
                    delta = ch.get("delta")
                    text = delta.get("content") if delta is not None else ch.get("text")
                    if text:
                        now = clock()
                        if first is None:
                            first = now
                        else:
                            gaps.append(now - last)
                        last = now
                        chunks += 1
                    reason = ch.get("finish_reason")
                    if reason:
                        result.finish_reason = reason
                usage = obj.get("usage")
                if usage:
                    usage_tokens = usage.get("completion_tokens")
                if "error" in obj:
                    result.error = "stream_error"
                    result.detail = str(obj["error"])[:300]
            end = clock()
            result.e2e_s = end - t0
            if not done and result.error is None:
                result.error = "truncated"
    except asyncio.CancelledError:
        result.error = "unfinished"
        raise
    except TimeoutError:
        result.error = "timeout"
    except aiohttp.ClientConnectorError as e:
        result.error, result.detail = "connect", str(e)[:300]
    except (aiohttp.ClientError, orjson.JSONDecodeError) as e:
        result.error, result.detail = "disconnected", f"{type(e).__name__}: {e}"[:300]
    finally:
        if first is not None:
            result.ttft_s = first - t0
        result.tokens = usage_tokens if usage_tokens else chunks
        result.ok = done and result.error is None and result.status == 200 and result.tokens > 0
        if result.ok and result.e2e_s is None:
            result.e2e_s = clock() - t0
        if result.ok and first is not None and result.tokens > 1:
            result.atgt_s = (last - first) / (result.tokens - 1)
        result.slo_met = result.ok and result.slo.met(
            _ms(result.ttft_s), _ms(result.atgt_s), _ms(result.e2e_s)
        )


async def list_models(session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str]) -> list[str]:
    async with session.get(base_url + "/v1/models", headers=dict(headers)) as resp:
        resp.raise_for_status()
        data = orjson.loads(await resp.read())
    models = [str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and "id" in m]
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no models")
    return models


def normalize_base_url(target: str) -> str:
    url = target.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if "://" not in url:
        url = "http://" + url
    return url
