"""The engines' routes besides generation, passed to an endpoint that serves the request's model:
`/tokenize`, `/detokenize`, `/pooling`, `/classify`, `/score` and `/v1/score`, `/rerank`, `/v1/rerank`
and `/v2/rerank` (POST, JSON with a `model`), `/v1/audio/transcriptions` and `/v1/audio/translations`
(POST, a multipart form with a `model`), and `GET /version` (any ready endpoint).

They are cheap next to a generation, so they do not queue: the ready endpoint serving the model with
the fewest requests in flight answers, and its answer (status and body, a 404 when the engine lacks the
route) is the client's. berth's auth applies as on the OpenAI routes (vLLM leaves several of these
unauthenticated); aliases resolve to the served name; the engine's own key is sent as on generations.
"""

from __future__ import annotations

from typing import Any, Final

import aiohttp
import orjson
import structlog
from aiohttp import web

from gateway.admission.prompt_tokens import pick_endpoint
from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.types import EndpointHealth
from gateway.front.auth import WWW_AUTHENTICATE, authenticate
from gateway.front.http import error_response, read_body, request_id
from gateway.front.services import SERVICES, Services
from gateway.sched.snapshot import EndpointView

log = structlog.get_logger("berth.passthrough")

#: POST routes that name a model in their JSON body.
MODEL_ROUTES: Final = (
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
)
VERSION_ROUTE: Final = "/version"
#: POST routes whose multipart form names the model (an audio file and its options).
FORM_ROUTES: Final = ("/v1/audio/transcriptions", "/v1/audio/translations")
_ANSWER_LIMIT: Final = 64 * 1024 * 1024  # an engine's answer read at most (a pooling answer can be large)


async def model_route(request: web.Request) -> web.StreamResponse:
    s = request.app[SERVICES]
    rid = request_id(request)
    try:
        authenticate(s.settings, request.headers)
        raw = await read_body(request, s.max_body_bytes)
        body = _object(raw)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise errors.bad_request("'model' is required and must be a non-empty string", param="model")
        served = s.settings.catalog.resolve(model, s.scheduler.known_models())
        ep, _ = pick_endpoint(s.scheduler.snapshot().endpoints, served, {}, s.clock.now())
        if ep is None:
            raise errors.no_ready_endpoint(served, s.scheduler.limits.retry_after_s)
        if served != model:
            raw = orjson.dumps({**body, "model": served})
        return await _forward(s, ep, request, raw, rid)
    except BerthError as e:
        return _refused(e, rid)


async def form_route(request: web.Request) -> web.StreamResponse:
    """A multipart form with a `model` field (at most [server] max_body_bytes), sent on as it came but
    for the model's served name."""
    s = request.app[SERVICES]
    rid = request_id(request)
    try:
        authenticate(s.settings, request.headers)
        if not request.content_type.startswith("multipart/form-data"):
            raise errors.bad_request("this route takes a multipart/form-data body (a file and a 'model')")
        if request.content_length is not None and request.content_length > s.max_body_bytes:
            raise errors.body_too_large(s.max_body_bytes)
        try:
            fields = await request.post()
        except web.HTTPRequestEntityTooLarge:
            raise errors.body_too_large(s.max_body_bytes) from None
        model = fields.get("model")
        if not isinstance(model, str) or not model:
            raise errors.bad_request("'model' is required and must be a non-empty string", param="model")
        served = s.settings.catalog.resolve(model, s.scheduler.known_models())
        ep, _ = pick_endpoint(s.scheduler.snapshot().endpoints, served, {}, s.clock.now())
        if ep is None:
            raise errors.no_ready_endpoint(served, s.scheduler.limits.retry_after_s)
        form = aiohttp.FormData()
        for name, value in fields.items():
            if isinstance(value, web.FileField):
                form.add_field(name, value.file, filename=value.filename, content_type=value.content_type)
            else:
                form.add_field(name, served if name == "model" else str(value))
        return await _forward(s, ep, request, form, rid)
    except BerthError as e:
        return _refused(e, rid)


async def version(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    rid = request_id(request)
    try:
        authenticate(s.settings, request.headers)
        ready = [e for e in s.scheduler.snapshot().endpoints if e.health is EndpointHealth.READY]
        if not ready:
            raise errors.no_ready_endpoint("any", s.scheduler.limits.retry_after_s)
        return await _forward(s, min(ready, key=lambda e: e.inflight), request, None, rid)
    except BerthError as e:
        return _refused(e, rid)


async def _forward(
    s: Services, ep: EndpointView, request: web.Request, raw: bytes | aiohttp.FormData | None, rid: str
) -> web.Response:
    headers = {**s.engine_auth.headers(ep.id), "X-Request-Id": rid}
    if isinstance(raw, bytes):
        headers["Content-Type"] = "application/json"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=s.dispatcher.settings.first_byte_timeout_s)
    try:
        async with s.session().request(
            request.method, ep.url + request.path, data=raw, headers=headers, timeout=timeout
        ) as resp:
            s.engine_auth.result(ep.id, request.path, resp.status)
            data = await resp.content.read(_ANSWER_LIMIT)
            status, content_type = resp.status, resp.headers.get("Content-Type", "application/json")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise errors.upstream_failed(
            f"engine call failed: {e or type(e).__name__}", retryable=False
        ) from None
    log.info("passthrough", request_id=rid, path=request.path, endpoint=ep.id, status=status)
    return web.Response(status=status, body=data, headers={"Content-Type": content_type, "X-Request-Id": rid})


def _object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise errors.bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise errors.bad_request("request body must be a JSON object", code="invalid_json")
    return body


def _refused(e: BerthError, rid: str) -> web.Response:
    resp = error_response(e, rid)
    if e.status == 401:
        resp.headers.update(WWW_AUTHENTICATE)
    return resp
