"""The operations routes: liveness, readiness, the model list and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web

from gateway.core.metrics import CONTENT_TYPE
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
    return web.Response(body=s.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    listing = s.settings.catalog.listing(
        s.scheduler.models(ready_only=True) | s.scheduler.loadable, s.started_at
    )
    return web.json_response(listing)
