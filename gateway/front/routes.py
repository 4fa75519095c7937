"""The route tables: every path berth answers, with a 405 for other methods and an OpenAI-shaped 404 for
anything else.

The public listener serves the OpenAI routes, /v1/models, /healthz and /readyz, and, unless an ops
listener is configured ([ops] listen), /metrics and /admin/*. The ops listener serves /metrics,
/healthz, /readyz and /admin/*. /healthz and /readyz stay on the public listener in both cases: load
balancers probe the port they send traffic to, and neither says more than "alive" / "ready".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from gateway.core.types import ApiKind
from gateway.front import ops
from gateway.front.admin import CLUSTER_PATH, FLEET_PATH, LOOP_LAG_PATH, cluster, fleet, loop_lag
from gateway.front.api import make_api_handler
from gateway.front.http import method_not_allowed, not_found
from gateway.front.services import SERVICES, Services

GetHandler = Callable[[web.Request], Awaitable[web.Response]]


_PROBES: Final[tuple[tuple[str, GetHandler], ...]] = (("/healthz", ops.healthz), ("/readyz", ops.readyz))
_OPS: Final[tuple[tuple[str, GetHandler], ...]] = (
    ("/metrics", ops.metrics),
    (FLEET_PATH, fleet),
    (LOOP_LAG_PATH, loop_lag),
    (CLUSTER_PATH, cluster),
)


def add_routes(app: web.Application, services: Services, *, with_ops: bool = True) -> None:
    """The public listener's routes; `with_ops` False leaves /metrics and /admin/* to the ops listener."""
    app[SERVICES] = services
    r = app.router
    for api in ApiKind:
        r.add_post(api.path, make_api_handler(services, api))
        r.add_route("*", api.path, method_not_allowed("POST"))
    _add_get(app, (("/v1/models", ops.models), *_PROBES, *(_OPS if with_ops else ())))
    r.add_route("*", "/{tail:.*}", not_found)


def add_ops_routes(app: web.Application, services: Services) -> None:
    """The ops listener's routes."""
    app[SERVICES] = services
    _add_get(app, (*_PROBES, *_OPS))
    app.router.add_route("*", "/{tail:.*}", not_found)


def _add_get(app: web.Application, routes: tuple[tuple[str, GetHandler], ...]) -> None:
    for path, handler in routes:
        app.router.add_get(path, handler)
        app.router.add_route("*", path, method_not_allowed("GET"))
