"""A small scripted OpenAI engine for integration tests (the loadgen simulator covers scale).

Behaviour is set per test through `FakeEngine` attributes; events let tests await what the engine saw
instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.dispatch.event_stream import EventStreamResponse


@dataclass
class FakeEngine:
    model: str = "tiny"
    tokens: int = 5  # tokens per answer
    fail_status: int | None = None  # answer every generation with this status
    fail_times: int = -1  # how many requests fail_status applies to (-1: all)
    fail_body: bytes | None = None  # the body of a fail_status answer (default: vLLM's error JSON)
    die_after_tokens: int | None = None  # abruptly close the connection after this many stream tokens
    stall_after_tokens: int | None = None  # stop sending (connection stays open) after this many tokens
    hold: asyncio.Event | None = None  # when set: generations wait for this event before answering
    hold_if: Callable[[dict[str, Any]], bool] | None = None  # with `hold`: only the generations it picks wait
    # A stream that is not a continuation stops after this many tokens until `unpause` is set (or it is
    # aborted); `paused` is set when one does.
    pause_after_tokens: int | None = None
    paused: asyncio.Event = field(default_factory=asyncio.Event)
    unpause: asyncio.Event = field(default_factory=asyncio.Event)
    role_chunk: bool = False  # chat streams open with an assistant role chunk, as vLLM's do
    # The role chunk's first half leaves with the stream's headers (one write), its rest after `unpause`
    # (`paused` is set in between).
    split_role_chunk: bool = False
    reasoning: bool = False  # chat streams carry reasoning_content deltas instead of content
    token_pad: int = 0  # a streamed token's text is padded with "x" to this many characters
    health_status: int = 200
    metrics_status: int = 200  # anything else: /metrics fails (the gauges go stale)
    running: int = 0
    waiting: int = 0
    # vLLM's prefix-cache counters (tokens) on /metrics; None: not exported.
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw_requests: list[bytes] = field(default_factory=list)  # each generation's body, as it came
    request_headers: list[dict[str, str]] = field(default_factory=list)  # of each generation, names lowered
    started: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    finished: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set as each generation ends
    aborts: int = 0
    # POST /tokenize (vLLM's shape): None answers 404 like an engine without the route.
    tokenize_count: int | None = None
    tokenize_status: int = 200
    tokenize_answer: bytes | None = None  # answer this body instead of {"count": ...}
    tokenize_hold: asyncio.Event | None = None  # when set: tokenize waits for this event
    tokenizes: list[dict[str, Any]] = field(default_factory=list)
    tokenize_started: asyncio.Event = field(default_factory=asyncio.Event)
    tokenize_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    transcriptions: list[dict[str, Any]] = field(
        default_factory=list
    )  # each form's fields (a file: its size)
    version: str | None = None  # GET /version answers {"version": ...}; None: 404 like an engine without it
    # With a key: every route answers 401 without `Authorization: Bearer <api_key>`.
    api_key: str | None = None
    authorization: dict[str, list[str | None]] = field(default_factory=dict)  # path -> what each call sent

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        app.router.add_get("/metrics", self._metrics)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        sent = request.headers.get("Authorization")
        self.authorization.setdefault(request.path, []).append(sent)
        if self.api_key is not None and sent != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def _transcribe(self, request: web.Request) -> web.Response:
        form = await request.post()
        fields: dict[str, Any] = {
            k: len(v.file.read()) if isinstance(v, web.FileField) else str(v) for k, v in form.items()
        }
        self.transcriptions.append(fields)
        return web.json_response({"text": f"{fields.get('file')} bytes heard"})

    async def _version(self, request: web.Request) -> web.Response:
        if self.version is None:
            raise web.HTTPNotFound()
        return web.json_response({"version": self.version})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}],
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_status != 200:
            return web.Response(status=self.metrics_status)
        m = self.model
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{m}"}} {self.running}\n'
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="{m}"}} {self.waiting}\n'
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{m}"}} 0.25\n'
        )
        if self.prefix_hits is not None and self.prefix_queries is not None:
            text += (
                "# TYPE vllm:prefix_cache_queries counter\n"
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="{m}"}} {self.prefix_queries}\n'
                "# TYPE vllm:prefix_cache_hits counter\n"
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="{m}"}} {self.prefix_hits}\n'
            )
        return web.Response(text=text, content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.tokenizes.append(body)
        self.tokenize_started.set()
        if self.tokenize_count is None:
            raise web.HTTPNotFound()
        try:
            if self.tokenize_hold is not None:
                await self.tokenize_hold.wait()
        except asyncio.CancelledError:
            self.tokenize_cancelled.set()
            raise
        if self.tokenize_status != 200:
            return web.json_response({"error": {"message": "tokenize failed"}}, status=self.tokenize_status)
        if self.tokenize_answer is not None:
            return web.Response(body=self.tokenize_answer, content_type="application/json")
        n = self.tokenize_count
        return web.json_response({"count": n, "max_model_len": 2048, "tokens": list(range(n))})

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        return web.json_response(
            {
                "object": "list",
                "model": body["model"],
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                "usage": {"prompt_tokens": 2, "total_tokens": 2},
            }
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.raw_requests.append(await request.read())
        self.request_headers.append({k.lower(): v for k, v in request.headers.items()})
        if body.get("model") != self.model:
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "param": None,
                        "code": 404,
                    }
                },
                status=404,
            )
        if self.fail_status is not None and self.fail_times != 0:
            self.fail_times -= 1
            if self.fail_body is not None:
                return web.Response(body=self.fail_body, status=self.fail_status)
            return web.json_response(
                {
                    "error": {
                        "message": "engine exploded",
                        "type": "InternalServerError",
                        "param": None,
                        "code": self.fail_status,
                    }
                },
                status=self.fail_status,
            )
        self.running += 1
        self.started.set()
        try:
            if self.hold is not None and (self.hold_if is None or self.hold_if(body)):
                await self.hold.wait()
            chat = request.path.endswith("chat/completions")
            start = _continued_from(body, chat)
            n = min(self.tokens - start, int(body.get("max_tokens") or self.tokens))
            if body.get("stream"):
                return await self._stream(request, body, chat, n, start)
            return web.json_response(self._full(body, chat, n))
        except asyncio.CancelledError:
            self.aborts += 1
            self.aborted.set()
            raise
        finally:
            self.running -= 1
            self.finished += 1
            self.ended.set()

    def _full(self, body: dict[str, Any], chat: bool, n: int) -> dict[str, Any]:
        text = "".join(f" t{i}" for i in range(n))
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        if chat:
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                ],
                "usage": usage,
            }
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": usage,
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool, n: int, start: int = 0
    ) -> web.StreamResponse:
        split = chat and self.role_chunk and self.split_role_chunk
        cls = EventStreamResponse if split else web.StreamResponse  # the first holds its headers
        resp = cls(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        model = body["model"]

        def chunk(piece: str | None, finish: str | None) -> bytes:
            if chat:
                field = "reasoning_content" if self.reasoning else "content"
                delta = {field: piece} if piece is not None else {}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
                obj = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                    "choices": [choice],
                }
            else:
                obj = {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": 1,
                    "model": model,
                    "choices": [{"index": 0, "text": piece or "", "finish_reason": finish}],
                }
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        if chat and self.role_chunk:
            role = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                ],
            }
            event = b"data: " + orjson.dumps(role) + b"\n\n"
            if split:
                await resp.write(event[: len(event) // 2])
                self.paused.set()
                await self.unpause.wait()
                event = event[len(event) // 2 :]
            await resp.write(event)
        for i in range(start, start + n):
            if self.pause_after_tokens is not None and start == 0 and i == self.pause_after_tokens:
                self.paused.set()
                await self.unpause.wait()
            if self.die_after_tokens is not None and i == self.die_after_tokens:
                assert request.transport is not None
                request.transport.close()
                return resp
            if self.stall_after_tokens is not None and i == self.stall_after_tokens:
                await asyncio.Event().wait()  # never set: the stream stalls until cancelled
            await resp.write(
                chunk(f" t{i}".ljust(self.token_pad, "x"), "length" if i == start + n - 1 else None)
            )
        so = body.get("stream_options") or {}
        if so.get("include_usage"):
            prompt = 3 + start  # a continuation's prompt holds the tokens it continues
            usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
            obj = {
                "id": "x",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 1,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp


def _continued_from(body: dict[str, Any], chat: bool) -> int:
    """The tokens (" t<i>" pieces) a continuation already holds: in the final assistant message it
    continues (chat), or at the end of its prompt (completions); 0 for a new request."""
    if chat:
        messages = body.get("messages") or []
        if not body.get("continue_final_message") or not messages:
            return 0
        text = str(messages[-1].get("content") or "")
    else:
        text = str(body.get("prompt") or "")
    return len(re.findall(r" t\d+", text))
