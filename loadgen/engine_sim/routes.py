"""The HTTP side of a simulated endpoint (`server.SimEndpoint`): its aiohttp application and handlers.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``
(503 while loading or under the ``health_503`` fault), ``GET /metrics``, ``GET /version`` (vLLM),
``GET /get_model_info``, ``/health_generate`` and ``POST /abort_request`` with ``{"rid"}`` (SGLang; its
requests may name their id in a ``rid`` field), ``POST /tokenize`` and ``/detokenize`` (`tokenize_routes`),
``POST /v1/responses`` and ``GET /v1/responses/{id}`` (vLLM; `responses_routes`), and the simulator's own
admin routes ``POST /sim/faults`` and ``GET /sim/state``.

Each request handler registers a `_Stream`, wakes when the engine emits tokens for it and writes the
pre-rendered chunks. A client that disconnects cancels its handler (``handler_cancellation``) and the
``finally`` aborts the request in the engine, freeing its batch slot and KV.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.core.tasks import TaskSupervisor
from loadgen.engine_sim import metrics
from loadgen.engine_sim.engine import RequestState, SimEngine, SimRequest
from loadgen.engine_sim.faults import Faults
from loadgen.engine_sim.flavors import Flavor
from loadgen.engine_sim.protocol import (
    SSE_DONE,
    ApiError,
    ApiName,
    ParsedRequest,
    ResponseWriter,
    bad_request,
    error_body,
    parse_request,
)
from loadgen.engine_sim.responses_routes import ResponsesRoutes
from loadgen.engine_sim.spec import EndpointSpec, ResolvedSpec
from loadgen.engine_sim.tokenize_routes import TokenizeRoutes

_JSON = "application/json"
# The engine's clock. Not loop.time(): uvloop's is cached per loop iteration at millisecond resolution,
# too coarse for iterations of a few ms (--speed 10).
_now = time.monotonic


class _Stream:
    """The link between the engine and one request handler."""

    __slots__ = ("cancelled", "req", "waiter")

    def __init__(self, req: SimRequest) -> None:
        self.req = req
        self.waiter: asyncio.Future[None] | None = None
        self.cancelled = False  # aborted through the API (SGLang /abort_request), not by a crash

    def notify(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


def _json(status: int, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, content_type=_JSON)


def _error(err: ApiError) -> web.Response:
    return _json(err.status, err.body())


def _require_key(key: str) -> Middleware:
    """401 (vLLM's body) for an engine route without `Authorization: Bearer <key>`; /sim/* is open."""
    expected = f"Bearer {key}"

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/sim/") and request.headers.get("Authorization") != expected:
            return _json(401, b'{"error":"Unauthorized"}')
        return await handler(request)

    return check


class EndpointRoutes:
    """The routes of `SimEndpoint`, which sets the attributes and defines the methods declared here."""

    spec: EndpointSpec
    resolved: ResolvedSpec
    flavor: Flavor
    engine: SimEngine
    _faults: Faults
    _fault_rng: random.Random
    _len_rng: random.Random
    _loop: asyncio.AbstractEventLoop | None
    _ids: int
    _id_base: str
    _streams: dict[str, _Stream]
    _tasks: TaskSupervisor
    _started_unix: float
    _scrape_mark: tuple[float, int]

    @property
    def loaded(self) -> bool:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def set_faults(self, **changes: Any) -> Faults:
        raise NotImplementedError

    def _kick(self) -> None:
        raise NotImplementedError

    def _request_done(self, rid: str) -> None:
        raise NotImplementedError

    def _build_app(self) -> web.Application:
        middlewares = [] if self.spec.api_key is None else [_require_key(self.spec.api_key)]
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/sim/faults", self._post_faults)
        app.router.add_get("/sim/state", self._get_state)
        TokenizeRoutes(
            self.spec.models, self.resolved.max_model_len, token_strs=self.flavor.name == "vllm"
        ).add_to(app)
        if self.flavor.name == "vllm":
            app.router.add_get("/version", self._version)
            ResponsesRoutes(
                self,
                self.spec.models,
                self._id_base,
                lambda name, run: self._tasks.spawn(name, run, restart=False),
            ).add_to(app)
        else:
            app.router.add_get("/health_generate", self._health)
            app.router.add_get("/get_model_info", self._model_info)
            app.router.add_post("/abort_request", self._abort_request)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        if self._faults.health_503 or not self.loaded:
            return web.Response(status=503)
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        return _json(200, orjson.dumps({"version": "0.10.1+sim"}))

    async def _model_info(self, request: web.Request) -> web.Response:
        body = {
            "model_path": self.spec.models[0],
            "tokenizer_path": self.spec.models[0],
            "is_generation": True,
        }
        return _json(200, orjson.dumps(body))

    async def _models(self, request: web.Request) -> web.Response:
        created = int(self._started_unix)
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": self.flavor.owned_by,
                "root": self.spec.models[0],
                "parent": None,
                "max_model_len": self.resolved.max_model_len,
            }
            for name in self.spec.models
        ]
        return _json(200, orjson.dumps({"object": "list", "data": data}))

    async def _metrics(self, request: web.Request) -> web.Response:
        faults = self._faults
        if faults.metrics_delay_s > 0:
            await asyncio.sleep(faults.metrics_delay_s)
        if faults.metrics_garbage:
            return web.Response(status=200, body=metrics.GARBAGE.encode("utf-8", "surrogateescape"))
        assert self._loop is not None
        now, tokens = _now(), self.engine.stats.generation_tokens
        last_t, last_tokens = self._scrape_mark
        throughput = (tokens - last_tokens) / (now - last_t) if now > last_t else 0.0
        self._scrape_mark = (now, tokens)
        text = metrics.render(
            self.flavor,
            self.engine,
            self.spec.models[0],
            started_unix=self._started_unix,
            gen_throughput=throughput,
        )
        return web.Response(status=200, body=text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            patch = orjson.loads(await request.read())
            if not isinstance(patch, dict):
                raise ValueError("the body must be a JSON object of fault fields")
            faults = self.set_faults(**patch)
        except (ValueError, TypeError) as e:
            return _error(bad_request(str(e)))
        return _json(200, orjson.dumps(faults.to_dict()))

    async def _abort_request(self, request: web.Request) -> web.Response:
        """SGLang's explicit abort: ``{"rid": ...}`` ends that request (unknown ids are ignored)."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return _error(bad_request(f"Invalid JSON body: {e}"))
        rid = body.get("rid") if isinstance(body, dict) else None
        stream = self._streams.get(rid) if isinstance(rid, str) else None
        if stream is not None and self.engine.abort(stream.req):
            stream.cancelled = True
            stream.notify()
            self._kick()
        return web.Response(status=200)

    async def _get_state(self, request: web.Request) -> web.Response:
        return _json(200, orjson.dumps(self.state()))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    def _output_tokens(self, p: ParsedRequest) -> int:
        if p.ignore_eos or p.min_tokens >= p.max_tokens:
            return p.max_tokens
        drawn = self.resolved.output_len.sample(self._len_rng)
        return min(max(drawn, p.min_tokens, 1), p.max_tokens)

    async def _generate(self, request: web.Request, api: ApiName) -> web.StreamResponse:
        if not self.loaded:
            return _json(503, error_body(503, "The model is still loading.", "ServiceUnavailableError"))
        try:
            data = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return _error(bad_request(f"Invalid JSON body: {e}"))
        try:
            parsed = parse_request(
                api,
                data,
                models=self.spec.models,
                max_model_len=self.resolved.max_model_len,
                priority_enabled=self.resolved.engine.policy == "priority",
                reject_priority_without_policy=self.flavor.name == "vllm",
                with_ids=self.engine.prefix_cache is not None,
            )
        except ApiError as e:
            return _error(e)
        faults = self._faults
        if faults.fail_fraction > 0 and self._fault_rng.random() < faults.fail_fraction:
            return _json(500, error_body(500, "simulated engine failure", "InternalServerError"))
        stall_at: int | None = None
        if faults.stall_after_tokens is not None and self._fault_rng.random() < faults.stall_fraction:
            stall_at = faults.stall_after_tokens
        assert self._loop is not None
        self._ids += 1
        prefix = self.flavor.chat_id_prefix if api == "chat" else self.flavor.completion_id_prefix
        rid = f"{prefix}{self._id_base}{self._ids:08x}"
        if parsed.rid is not None and self.flavor.name == "sglang":
            if parsed.rid in self._streams:
                return _error(bad_request(f"Duplicate request id {parsed.rid}", "rid"))
            rid = parsed.rid
        req = self.engine.submit(
            rid,
            prompt_tokens=parsed.prompt_tokens,
            output_tokens=self._output_tokens(parsed),
            max_tokens=parsed.max_tokens,
            priority=parsed.priority,
            now=_now(),
            token_ids=parsed.prompt_ids,
        )
        stream = _Stream(req)
        self._streams[rid] = stream
        self._kick()
        writer = ResponseWriter(api, rid, parsed.model)
        try:
            if parsed.stream:
                return await self._stream_response(request, parsed, stream, writer, stall_at)
            return await self._full_response(parsed, stream, writer, stall_at)
        finally:
            if not req.done and self.engine.abort(req):
                self._kick()
            self._request_done(rid)

    async def generation(self, rid: str, prompt_tokens: int, max_tokens: int) -> AsyncIterator[int]:
        """A generation of `max_tokens` tokens the engine runs as it runs a chat request's, outside the
        OpenAI handlers (`responses_routes`): the number generated so far, each time it grows, to the
        last; closing the iterator early aborts it in the engine."""
        req = self.engine.submit(rid, prompt_tokens=prompt_tokens, output_tokens=max_tokens, now=_now())
        stream = _Stream(req)
        self._streams[rid] = stream
        self._kick()
        try:
            sent = 0
            while True:
                if req.generated > sent:
                    sent = req.generated
                    yield sent
                if req.state is RequestState.FINISHED and sent == req.generated:
                    return
                if req.state is RequestState.ABORTED:
                    raise ConnectionResetError("the engine aborted the generation")
                await stream.wait()
        finally:
            if not req.done and self.engine.abort(req):
                self._kick()
            self._request_done(rid)

    async def _full_response(
        self, parsed: ParsedRequest, stream: _Stream, writer: ResponseWriter, stall_at: int | None
    ) -> web.Response:
        req = stream.req
        while not req.done:
            await stream.wait()
        if stall_at is not None or (req.state is RequestState.ABORTED and not stream.cancelled):
            await _forever()
        reason = "abort" if stream.cancelled else req.finish_reason or "stop"
        body = writer.full_response(parsed.prompt_tokens, req.generated, reason)
        return _json(200, body)

    async def _stream_response(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        stream: _Stream,
        writer: ResponseWriter,
        stall_at: int | None,
    ) -> web.StreamResponse:
        req = stream.req
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"},
        )
        await resp.prepare(request)
        sent = 0
        limit = stall_at
        while True:
            generated = req.generated
            if limit is not None and generated > limit:
                generated = limit
            if generated > sent:
                parts: list[bytes] = []
                if sent == 0:
                    parts.append(writer.role_chunk())
                finished_here = req.state is RequestState.FINISHED and generated == req.generated
                plain = generated - sent - (1 if finished_here else 0)
                if plain > 0:
                    parts.append(writer.token_chunk * plain)
                if finished_here:
                    parts.append(writer.last_token_chunk(req.finish_reason or "stop"))
                await resp.write(b"".join(parts))
                sent = generated
            if limit is not None and sent >= limit:
                await _forever()  # stalled: keep the connection open, send nothing more
            if req.state is RequestState.FINISHED and sent == req.generated:
                break
            if req.state is RequestState.ABORTED:
                if stream.cancelled:  # aborted through the API: end the stream properly
                    await resp.write(writer.finish_chunk("abort") + SSE_DONE)
                    await resp.write_eof()
                    return resp
                await _forever()  # the endpoint died; its connections are being reset
            await stream.wait()
        tail = writer.usage_chunk(parsed.prompt_tokens, req.generated) if parsed.include_usage else b""
        await resp.write(tail + SSE_DONE)
        await resp.write_eof()
        return resp


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()
