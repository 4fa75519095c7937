"""The Responses API's calls about a response the engine keeps: `GET /v1/responses/{id}` and
`POST /v1/responses/{id}/cancel` go to the endpoint that made it (a `GET ...?stream=true`, the response's
events, relayed as they come, as a generation's stream is: `Dispatcher.relay_events`), and so does a new
`POST /v1/responses` that continues it (`previous_response_id`, pinned there: `SchedRequest.pinned`).
`POST /v1/responses` itself is a generation, run as chat is (gateway.front.api).

Each answer's id is recorded with its endpoint and its tenant as soon as the engine names it (the
dispatcher's `response_ids`: a whole answer's `id`, a stream's `response.created`): another
tenant's id is berth's 404, as is any id when no endpoint is ready; an id berth does not know (never
seen, forgotten, or made on an endpoint that has left the fleet) is asked of the ready endpoint with the
fewest requests in flight, whose answer (usually its 404) is the client's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from gateway.admission.tenancy import ANONYMOUS
from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.types import ApiKind, EndpointHealth
from gateway.dispatch.context import RequestContext
from gateway.dispatch.response_ids import ResponseOwner
from gateway.front.auth import authenticate
from gateway.front.http import request_id
from gateway.front.passthrough import forward, refused
from gateway.front.services import SERVICES, Services
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView

RETRIEVE_ROUTE = "/v1/responses/{response_id}"
_TRUE = frozenset(("true", "1", "yes", "on"))  # a `stream` query parameter that asks for the events
CANCEL_ROUTE = "/v1/responses/{response_id}/cancel"


def response_not_found(response_id: str) -> BerthError:
    return errors.object_not_found(f"Response with id '{response_id}' not found.", "response_id")


def pin(
    s: Services, ctx: RequestContext, sreq: SchedRequest, body: dict[str, Any], tenant: str
) -> SchedRequest:
    """`sreq` pinned to the endpoint that made its `previous_response_id` (when berth knows it)."""
    prev = body.get("previous_response_id")
    if not isinstance(prev, str):
        return sreq
    owner = _owner(s, prev, tenant)
    if owner is None or not any(
        e.id == owner.endpoint and sreq.model in e.models for e in s.scheduler.snapshot().endpoints
    ):
        return sreq  # unknown to berth (or made for another model): any endpoint, whose 404 the client gets
    sreq = ctx.sched = replace(sreq, pinned=owner.endpoint)
    return sreq


async def retrieve_or_cancel(request: web.Request) -> web.StreamResponse:
    s = request.app[SERVICES]
    rid = request_id(request)
    response_id = request.match_info["response_id"]
    try:
        tenant = authenticate(s.settings, request.headers)
        owner = _owner(s, response_id, ANONYMOUS if tenant is None else tenant.name)
        ep = _endpoint(s, owner)
        if ep is None:
            raise response_not_found(response_id)
        if request.method == "GET" and request.query.get("stream", "").lower() in _TRUE:
            ctx = RequestContext(rid, ApiKind.RESPONSES, s.clock.now())
            ctx.stream = True
            ctx.tenant = ANONYMOUS if tenant is None else tenant.name
            return await s.dispatcher.relay_events(ctx, ep, request)
        raw = await request.read() if request.method == "POST" and request.can_read_body else None
        return await forward(s, ep, request, raw or None, rid)
    except BerthError as e:
        return refused(e, rid)


def _owner(s: Services, response_id: str, tenant: str) -> ResponseOwner | None:
    """The recorded owner of `response_id`; None when berth does not know it, or its endpoint left the
    fleet. Raises berth's 404 when it belongs to another tenant."""
    ids = s.dispatcher.response_ids
    owner = ids.get(response_id)
    if owner is None:
        return None
    if owner.tenant != tenant:
        raise response_not_found(response_id)
    if not any(e.id == owner.endpoint for e in s.scheduler.snapshot().endpoints):
        ids.forget(response_id)
        return None
    return owner


def _endpoint(s: Services, owner: ResponseOwner | None) -> EndpointView | None:
    """The owner's endpoint when it is ready; for an unknown id, the ready endpoint with the fewest
    requests in flight; None when there is none to ask."""
    ready = [e for e in s.scheduler.snapshot().endpoints if e.health is EndpointHealth.READY]
    if owner is not None:
        return next((e for e in ready if e.id == owner.endpoint), None)
    return min(ready, key=lambda e: e.inflight) if ready else None
