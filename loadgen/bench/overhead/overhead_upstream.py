"""The overhead benchmark's upstream: a minimal OpenAI engine that answers as fast as it can.

`POST /v1/chat/completions` and `/v1/completions` return a static JSON body, or with `"stream": true`
`max_tokens` SSE chunks (one token each, the last with `finish_reason: "length"`), a usage chunk when
`stream_options.include_usage` is set (as vLLM does), then `data: [DONE]`. Chunks are pre-encoded and
paced `--chunk-interval-ms` apart so that each one reaches the proxy on its own, as tokens from a real
engine do. `GET /v1/models` lists model "bench"; `/health` is 200; `/metrics` has vLLM-style gauges.
One process may listen on several ports (`--port` repeated): two endpoints for the proxies to balance
over, as in the peer harness.

    python -m loadgen.bench.overhead.overhead_upstream --port 9001 [--port 9002]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import signal
from typing import Any, Final

import orjson
import uvloop
from aiohttp import web

MODEL: Final = "bench"
CREATED: Final = 1_700_000_000
DONE: Final = b"data: [DONE]\n\n"
MAX_CHUNKS: Final = 100_000

_USAGE_PROMPT_TOKENS: Final = 8


def _static_body(chat: bool) -> bytes:
    usage = {"prompt_tokens": _USAGE_PROMPT_TOKENS, "completion_tokens": 16, "total_tokens": 24}
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! This is a static benchmark reply."},
            "logprobs": None,
            "finish_reason": "length",
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": " Hello! This is a static benchmark reply.",
            "logprobs": None,
            "finish_reason": "length",
        }
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": "cmpl-bench",
            "object": obj,
            "created": CREATED,
            "model": MODEL,
            "choices": [choice],
            "usage": usage,
        }
    )


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


@functools.lru_cache(maxsize=64)
def stream_events(chat: bool, n: int, include_usage: bool) -> tuple[bytes, ...]:
    """The SSE events for one streamed answer of `n` tokens, without the final [DONE]."""
    events: list[bytes] = []
    for i in range(n):
        finish = "length" if i == n - 1 else None
        choice: dict[str, Any]
        if chat:
            delta: dict[str, Any] = {"content": " tok"}
            if i == 0:
                delta = {"role": "assistant", "content": " tok"}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": " tok", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        events.append(
            _event(
                {"id": "cmpl-bench", "object": obj, "created": CREATED, "model": MODEL, "choices": [choice]}
            )
        )
    if include_usage:
        usage = {
            "prompt_tokens": _USAGE_PROMPT_TOKENS,
            "completion_tokens": n,
            "total_tokens": _USAGE_PROMPT_TOKENS + n,
        }
        obj = "chat.completion.chunk" if chat else "text_completion"
        events.append(
            _event(
                {
                    "id": "cmpl-bench",
                    "object": obj,
                    "created": CREATED,
                    "model": MODEL,
                    "choices": [],
                    "usage": usage,
                }
            )
        )
    return tuple(events)


class Engine:
    def __init__(self, chunk_interval_s: float) -> None:
        self.chunk_interval_s = chunk_interval_s
        self.running = 0
        self.bodies = {True: _static_body(chat=True), False: _static_body(chat=False)}

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "body is not an object"}}, status=400)
        self.running += 1
        try:
            if not body.get("stream"):
                return web.Response(body=self.bodies[chat], content_type="application/json")
            n = max(1, min(int(body.get("max_tokens") or 16), MAX_CHUNKS))
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await resp.prepare(request)
            interval = self.chunk_interval_s
            for event in stream_events(chat, n, include_usage):
                await resp.write(event)
                await asyncio.sleep(interval)
            await resp.write(DONE)
            await resp.write_eof()
            return resp
        finally:
            self.running -= 1

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": MODEL,
                        "object": "model",
                        "created": CREATED,
                        "owned_by": "bench",
                        "max_model_len": 4096,
                    }
                ],
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def metrics(self, request: web.Request) -> web.Response:
        label = f'{{model_name="{MODEL}"}}'
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {self.running}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} 0\n"
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{label} 0.0\n"
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")


def build_app(chunk_interval_s: float) -> web.Application:
    engine = Engine(chunk_interval_s)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.chat)
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_get("/v1/models", engine.models)
    app.router.add_get("/health", engine.health)
    app.router.add_get("/metrics", engine.metrics)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, action="append", required=True, help="repeat to listen on more")
    p.add_argument(
        "--chunk-interval-ms",
        type=float,
        default=1.0,
        help="pause after each streamed chunk (default 1; 0 still yields to the loop)",
    )
    args = p.parse_args(argv)
    uvloop.run(_serve(build_app(args.chunk_interval_ms / 1000), args.host, args.port))


async def _serve(app: web.Application, host: str, ports: list[int]) -> None:
    """Serve `app` on every port until SIGTERM or SIGINT."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for port in ports:
            await web.TCPSite(runner, host, port, backlog=4096).start()
        await stop.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    main()
