"""The route tables: every path berth answers, with a 405 for other methods and an OpenAI-shaped 404 for
anything else.

The public listener serves the OpenAI routes (and the Files and Batches API, and the Responses API's
retrieve and cancel: gateway.front.responses_api), the engines' other routes
(gateway.front.passthrough), /v1/models, /healthz and /readyz, and, unless an ops listener is configured
([ops] listen), /metrics and /admin/*. The ops listener serves /metrics, /healthz, /readyz and /admin/*.
/healthz and /readyz stay on the public listener in both cases: load balancers probe the port they send
traffic to, and neither says more than "alive" / "ready".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from gateway.core.types import ApiKind
from gateway.front import batches_api, files_api, ops, passthrough, responses_api
from gateway.front.admin import (
    CLUSTER_PATH,
    FLEET_PATH,
    LOOP_LAG_PATH,
    SCHED_DECISIONS_PATH,
    cluster,
    fleet,
    loop_lag,
    sched_decisions,
)
from gateway.front.api import make_api_handler
from gateway.front.files_api import BatchHandler, batch_route
from gateway.front.http import method_not_allowed, not_found
from gateway.front.services import SERVICES, Services

GetHandler = Callable[[web.Request], Awaitable[web.Response]]


_PROBES: Final[tuple[tuple[str, GetHandler], ...]] = (("/healthz", ops.healthz), ("/readyz", ops.readyz))
_OPS: Final[tuple[tuple[str, GetHandler], ...]] = (
    ("/metrics", ops.metrics),
    (FLEET_PATH, fleet),
    (LOOP_LAG_PATH, loop_lag),
    (SCHED_DECISIONS_PATH, sched_decisions),
    (CLUSTER_PATH, cluster),
)

#: The Files and Batches API (gateway.front.files_api, batches_api): path -> method -> handler.
_BATCH: Final[dict[str, dict[str, BatchHandler]]] = {
    "/v1/files": {"POST": files_api.create_file, "GET": files_api.list_files},
    "/v1/files/{file_id}": {"GET": files_api.get_file, "DELETE": files_api.delete_file},
    "/v1/files/{file_id}/content": {"GET": files_api.file_content},
    "/v1/batches": {"POST": batches_api.create_batch, "GET": batches_api.list_batches},
    "/v1/batches/{batch_id}": {"GET": batches_api.get_batch},
    "/v1/batches/{batch_id}/cancel": {"POST": batches_api.cancel_batch},
}


def add_routes(app: web.Application, services: Services, *, with_ops: bool = True) -> None:
    """The public listener's routes; `with_ops` False leaves /metrics and /admin/* to the ops listener."""
    app[SERVICES] = services
    r = app.router
    for api in ApiKind:
        r.add_post(api.path, make_api_handler(services, api))
        r.add_route("*", api.path, method_not_allowed("POST"))
    for path in passthrough.MODEL_ROUTES:
        r.add_post(path, passthrough.model_route)
        r.add_route("*", path, method_not_allowed("POST"))
    for path in passthrough.FORM_ROUTES:
        r.add_post(path, passthrough.form_route)
        r.add_route("*", path, method_not_allowed("POST"))
    _add_get(app, ((passthrough.VERSION_ROUTE, passthrough.version),))
    r.add_get(responses_api.RETRIEVE_ROUTE, responses_api.retrieve_or_cancel)
    r.add_route("*", responses_api.RETRIEVE_ROUTE, method_not_allowed("GET"))
    r.add_post(responses_api.CANCEL_ROUTE, responses_api.retrieve_or_cancel)
    r.add_route("*", responses_api.CANCEL_ROUTE, method_not_allowed("POST"))
    for path, methods in _BATCH.items():
        for method, handler in methods.items():
            r.add_route(method, path, batch_route(handler))
        r.add_route("*", path, method_not_allowed(", ".join(methods)))
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
