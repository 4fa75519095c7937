"""The operations routes: liveness, readiness, the model list and Prometheus metrics.

/v1/models asks for a tenant's API key like the OpenAI routes when [auth] requires one. /metrics asks
for the admin token (as /admin/* does, gateway.front.admin.authorize) with [ops]
require_admin_token_for_metrics: it names every engine's host:port.
"""

from __future__ import annotations

from aiohttp import web

from gateway.core.errors import BerthError
from gateway.core.metrics import CONTENT_TYPE
from gateway.front.admin import admin_error, authorize
from gateway.front.auth import WWW_AUTHENTICATE, authenticate
from gateway.front.http import error_response, request_id
from gateway.front.services import SERVICES


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    if s.ready:
        return web.json_response({"status": "ready"})
    reason = "draining" if s.draining else "no ready endpoint"
    return web.json_response({"status": "not ready", "reason": reason}, status=503)


async def metrics(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    if s.metrics_need_token:
        try:
            authorize(request, s.admin_token)
        except BerthError as e:
            return admin_error(e, request)
    return web.Response(body=s.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    try:
        authenticate(s.settings, request.headers)
    except BerthError as e:
        resp = error_response(e, request_id(request))
        resp.headers.update(WWW_AUTHENTICATE)
        return resp
    listing = s.settings.catalog.listing(s.scheduler.models(ready_only=True), s.started_at)
    return web.json_response(listing)
