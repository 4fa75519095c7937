"""The OpenAI routes: each request goes through named phases in order, and `finish` always runs.

auth (the tenant of the API key; 401 when [auth] requires one) -> read -> parse -> admit (model, SLO,
prompt tokens: the scheduler's request; then the tenant's limits: 429 rate_limited, or a seat) ->
dispatch (queue, engine call, relay) -> finish (the seat given back, one canonical log line and the
metrics, in `finally`)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Set

import structlog
from aiohttp import web

from gateway.admission.classify import task_class, to_sched_request
from gateway.admission.limits import Seat
from gateway.admission.models import ModelCatalog
from gateway.admission.slo import Resolved, Tenant
from gateway.admission.state import SloAdmission
from gateway.admission.tenancy import ANONYMOUS, Ask
from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.logging import LEVEL
from gateway.core.slo import SloKind, SloPolicy
from gateway.core.types import ApiKind, ModelName, ParsedRequest
from gateway.dispatch.context import RequestContext
from gateway.dispatch.slo_headers import error_headers
from gateway.front import responses_api
from gateway.front.auth import WWW_AUTHENTICATE, authenticate
from gateway.front.http import Handler, error_response, read_body, request_id
from gateway.front.schemas import parse_body
from gateway.front.services import Services
from gateway.sched.request import SchedRequest
from gateway.telemetry.live import LiveTelemetry
from gateway.telemetry.records import FinishedRequest

log = structlog.get_logger("berth.request")


def make_api_handler(services: Services, api: ApiKind) -> Handler:
    # A partial rather than a wrapping coroutine: one coroutine frame less per request (py-spy: 2 us).
    return functools.partial(handle, services, api)


async def handle(s: Services, api: ApiKind, request: web.Request) -> web.StreamResponse:
    rid = request_id(request)
    ctx = RequestContext(rid, api, s.clock.now())
    tenant: Tenant | None = None
    seat: Seat | None = None
    try:
        if s.draining:
            raise errors.shutting_down()
        tenant = authenticate(s.settings, request.headers)
        ctx.tenant = ANONYMOUS if tenant is None else tenant.name
        raw = await read_body(request, s.max_body_bytes)
        parsed = parse_body(api, raw)
        ctx.client_model = parsed.model
        ctx.stream = parsed.stream
        sreq = await admit(s, ctx, parsed, request.headers.items(), tenant)
        if api is ApiKind.RESPONSES:
            sreq = responses_api.pin(s, ctx, sreq, parsed.body, ctx.tenant)
        got = s.tenancy.admit_now(tenant, sreq, s.clock.now())  # no coroutine when decided here
        seat = await s.tenancy.admit_shared(tenant, sreq, s.clock.now()) if got is Ask.SHARED else got
        # One turn of the loop between the request's front half (read, parse, admit) and its placement
        # and engine call: at saturation a turn runs one step of every request in flight, and this
        # step was the longest of a request's (berth's engine-call client adds no steps of its own, as
        # aiohttp's client did), so a timer, a stream's next chunk or a new connection waited behind all
        # of them whole. Measured with the peer harness at 8 connections: event-loop lag p99
        # 1.40/1.33 -> 0.87/1.03 ms (two A/B pairs), CPU per request unchanged within the noise.
        await asyncio.sleep(0)
        return await s.dispatcher.run(ctx, sreq, parsed.body, parsed.include_usage, request, raw=raw)
    except BerthError as e:
        ctx.fail(e)
        resp = error_response(e, rid)
        resp.headers.update(error_headers(ctx))
        if e.status == 401:
            resp.headers.update(WWW_AUTHENTICATE)
        return resp
    except asyncio.CancelledError:
        ctx.outcome = "shutdown" if s.draining else "client_disconnect"
        ctx.status = ctx.status or 499
        raise
    except Exception:
        log.exception("request_failed", request_id=rid)
        err = errors.internal()
        ctx.fail(err)
        return error_response(err, rid)
    finally:
        finish(s, ctx, tenant, seat)


async def take_seat(s: Services, tenant: Tenant | None, sreq: SchedRequest) -> Seat | None:
    """The tenant's limits for `sreq`: its buckets and a seat, or the tenant's 429 (cluster mode: on this
    replica's slice of the shared limits, or in one Redis round trip). `handle` takes the same two steps
    inline, so that a request whose seat is decided here makes no coroutine on the request path."""
    seat = s.tenancy.admit_now(tenant, sreq, s.clock.now())
    if seat is Ask.SHARED:
        return await s.tenancy.admit_shared(tenant, sreq, s.clock.now())
    return seat


async def admit(
    s: Services,
    ctx: RequestContext,
    parsed: ParsedRequest,
    headers: Iterable[tuple[str, str]],
    tenant: Tenant | None,
) -> SchedRequest:
    """Resolve the model (aliases), the SLO (`headers`, tenant, rules, task clock) and the prompt tokens:
    the scheduler's request."""
    settings = s.settings
    resolved = resolve_slo(
        ctx,
        parsed,
        headers,
        tenant,
        catalog=settings.catalog,
        known=s.scheduler.known_models(),
        state=s.slo,
        policy=settings.slo,
        reject_disallowed=settings.reject_disallowed,
    )
    if resolved.task is not None and s.slo.shared is not None:  # cluster mode: the task's shared clock
        resolved = await s.slo.share(
            resolved,
            headers,
            tenant,
            parsed,
            served=ctx.served_model,
            now=ctx.arrival,
            policy=settings.slo,
            reject_disallowed=settings.reject_disallowed,
        )
        ctx.slo_class = resolved.slo.slo_class
        ctx.task = resolved.task
    key = s.next_key()  # berth's own id for the request: the client's X-Request-Id is only echoed
    counter = s.prompt_counter
    measured = None if counter is None else await counter.measure(key, parsed, ModelName(ctx.served_model))
    exact = None if measured is None else measured.count
    ctx.prompt_token_ids = None if measured is None else measured.ids
    # A non-streamed batch request is streamed from the engine under a policy that preempts, so that it
    # can be resumed if it is preempted (it is a likely victim; the rest keep the cheaper path).
    policy = s.scheduler.policy
    preemptive = policy.preemptor is not None
    stream_unstreamed = preemptive and policy.slo.class_of(ctx.slo_class).kind is SloKind.BATCH
    return scheduler_request(
        ctx,
        parsed,
        resolved,
        key,
        s.telemetry,
        prompt_tokens=exact,
        preemptive=preemptive,
        stream_unstreamed=stream_unstreamed,
    )


def resolve_slo(
    ctx: RequestContext,
    parsed: ParsedRequest,
    headers: Iterable[tuple[str, str]],
    tenant: Tenant | None,
    *,
    catalog: ModelCatalog,
    known: Set[ModelName],
    state: SloAdmission,
    policy: SloPolicy,
    reject_disallowed: bool = False,
) -> Resolved:
    """The served model (aliases resolved against the `known` models) and the request's SLO."""
    served = catalog.resolve(parsed.model, known)
    ctx.served_model = served
    ctx.prompt_chars = parsed.prompt_chars
    resolved = state.resolve(
        headers,
        tenant,
        parsed,
        served=served,
        now=ctx.arrival,
        policy=policy,
        reject_disallowed=reject_disallowed,
    )
    ctx.slo_class = resolved.slo.slo_class
    ctx.task = resolved.task
    return resolved


def scheduler_request(
    ctx: RequestContext,
    parsed: ParsedRequest,
    resolved: Resolved,
    key: str,
    telemetry: LiveTelemetry,
    *,
    prompt_tokens: int | None = None,
    preemptive: bool = False,
    stream_unstreamed: bool = False,
) -> SchedRequest:
    """The scheduler's request, keyed `key`, with the live token estimate (or the engine's count) and
    output-length prediction."""
    prefix = telemetry.prefix
    keys = ctx.prefix_keys = prefix.keys(ctx.served_model, parsed.api, parsed.body)
    if keys is not None and keys.token_ids is None and ctx.prompt_token_ids is not None:
        keys.with_token_ids(ctx.prompt_token_ids)  # counted through the engine: the precise source matches
    sreq = to_sched_request(
        key,
        parsed,
        ModelName(ctx.served_model),
        ctx.arrival,
        tokens=telemetry.tokens,
        lengths=telemetry.lengths,
        slo=resolved.slo,
        task_id=resolved.task_id,
        allotment=None if resolved.task is None else resolved.task.allotment,
        prompt_tokens=prompt_tokens,
        preemptive=preemptive,
        stream_unstreamed=stream_unstreamed,
        cached=(lambda tokens: prefix.lookup(keys, tokens)) if keys is not None else None,
    )
    ctx.sched = sreq
    ctx.slo_class = sreq.slo.slo_class
    return sreq


def finish(s: Services, ctx: RequestContext, tenant: Tenant | None = None, seat: Seat | None = None) -> None:
    """The tenant's seat given back, the canonical log line and the metrics of one request."""
    finished = ctx.finished_at = s.clock.now()
    tenant_name = ANONYMOUS if tenant is None else tenant.name
    s.tenancy.finish(
        tenant_name,
        seat,
        ctx.outcome,
        dispatched=ctx.dispatched_at is not None,
        prompt_tokens=ctx.prompt_tokens,
        completion_tokens=ctx.output_tokens,
        now=finished,
    )
    m = s.metrics
    # Only names that resolved to a served model become label values: a 404 for a made-up name must not
    # grow the metric series without bound.
    model = ctx.client_model if ctx.served_model else "-"
    arrival, dispatched, first = ctx.arrival, ctx.dispatched_at, ctx.first_token_at
    e2e = finished - arrival
    ttft = None if first is None else first - arrival
    m.of_model(model).finished(
        ctx.outcome,
        None if dispatched is None else dispatched - arrival,  # queue wait
        None if dispatched is None else e2e,  # end to end, of a request that reached an engine
        ttft,
        ctx.itl_gaps,
        ctx.output_tokens,
        ctx.prompt_tokens,
    )
    if ctx.outcome == "client_disconnect":
        m.client_disconnects_of(model).inc()
    if ctx.preemptions:
        m.resumes_of(model, ctx.outcome).inc()
    learn(ctx, s.telemetry, s.slo, s.lifecycle_finished)
    if not LEVEL.info:
        return
    log.info(
        "request",
        request_id=ctx.id,
        api=ctx.api.value,
        model=ctx.client_model or "-",
        endpoint=ctx.endpoint,
        status=ctx.status,
        outcome=ctx.outcome,
        slo_class=ctx.slo_class,
        tenant=tenant_name,
        stream=ctx.stream,
        attempts=ctx.attempts,
        preempted=ctx.preemptions,
        queue_ms=_ms(ctx.queue_s),
        ttft_ms=_ms(ttft),
        e2e_ms=_ms(e2e),
        prompt_tokens=ctx.prompt_tokens,
        output_tokens=ctx.output_tokens,
        error=ctx.error.message if ctx.error is not None else None,
    )


def learn(
    ctx: RequestContext,
    telemetry: LiveTelemetry,
    slo: SloAdmission,
    lifecycle: Callable[[FinishedRequest], None] | None = None,
) -> None:
    """What berth learns from a finished request (any outcome): telemetry's record of it (and the
    lifecycle's autoscaler, when there is one), and its task step's duration on the task clock (or the
    step given back when it never ran)."""
    if ctx.endpoint is not None and ctx.prefix_keys is not None and ctx.outcome == "ok":
        telemetry.prefix.finished(ctx.endpoint, ctx.prefix_keys, ctx.answer_text)
    record = finished_record(ctx)
    if record is not None:
        telemetry.on_finish(record)
        if lifecycle is not None:
            lifecycle(record)
    if ctx.task is None and ctx.error is None:
        return  # the task clock and the rejection counts learn nothing from it
    slo.on_finish(
        ctx.task,
        ctx.slo_class,
        ctx.error,
        ok=ctx.outcome == "ok",
        arrival=ctx.arrival,
        dispatched_at=ctx.dispatched_at,
        first_token_at=ctx.first_token_at,
        finished_at=ctx.finished_at,
    )


def finished_record(ctx: RequestContext) -> FinishedRequest | None:
    """What telemetry learns from a finished request; None when it was answered before admission."""
    sreq = ctx.sched
    finished = ctx.finished_at
    if sreq is None or finished is None:
        return None
    return FinishedRequest(
        sreq.model,
        task_class(sreq.slo),
        sreq.slo,
        ctx.outcome == "ok",
        ctx.stream,
        ctx.endpoint,
        ctx.attempts,
        ctx.arrival,
        ctx.dispatched_at,
        ctx.first_token_at,
        finished,
        ctx.prompt_chars,
        ctx.prompt_tokens,
        sreq.prompt_tokens,
        ctx.output_tokens,
        ctx.itl_gaps,
        sreq.predicted_output_tokens,
        sreq.id,
        sreq.allotment,
        ctx.cached_tokens,
    )


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000.0, 2)
