"""The route table: every path berth answers, with a 405 for other methods and an OpenAI-shaped 404 for
anything else."""

from __future__ import annotations

from aiohttp import web

from gateway.core.types import ApiKind
from gateway.front import ops
from gateway.front.admin import FLEET_PATH, fleet
from gateway.front.api import make_api_handler
from gateway.front.http import method_not_allowed, not_found
from gateway.front.services import SERVICES, Services


def add_routes(app: web.Application, services: Services) -> None:
    app[SERVICES] = services
    r = app.router
    for api in ApiKind:
        r.add_post(api.path, make_api_handler(services, api))
        r.add_route("*", api.path, method_not_allowed("POST"))
    for path, handler in (
        ("/v1/models", ops.models),
        ("/healthz", ops.healthz),
        ("/readyz", ops.readyz),
        ("/metrics", ops.metrics),
        (FLEET_PATH, fleet),
    ):
        r.add_get(path, handler)
        r.add_route("*", path, method_not_allowed("GET"))
    r.add_route("*", "/{tail:.*}", not_found)
