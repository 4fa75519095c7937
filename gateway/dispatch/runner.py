"""The dispatch phases of one request: acquire a slot -> open the engine call (retrying on another
endpoint before the first byte) -> relay -> release. The caller's finish phase logs and counts.

A streamed request the scheduler preempts (its task is cancelled by the driver, see
`gateway.dispatch.driver`) closes its engine call, keeps its client's stream open, waits in the queue
for its next seat and goes on there with a call that continues the produced text
(`gateway.upstream.resume`); the relay stitches the new engine stream onto the client's.

Relaying an engine call's answer to the client (a body, or a stream with its progress reports) is the
base class's, `gateway.dispatch.relay.Relaying`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.errors import BerthError
from gateway.core.metrics import GatewayMetrics
from gateway.core.types import ApiKind, EndpointId
from gateway.dispatch.context import RequestContext
from gateway.dispatch.driver import SchedulerDriver
from gateway.dispatch.engine_body import engine_body
from gateway.dispatch.relay import ClientStream, Relaying, error_from, record_stream
from gateway.dispatch.response_ids import ResponseIds
from gateway.dispatch.slo_headers import answer_headers
from gateway.sched.decisions import Preempt
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView
from gateway.telemetry.prefix_index import PrefixIndex
from gateway.upstream.client import UpstreamSettings, open_request
from gateway.upstream.credentials import AUTH_REFUSED, EngineAuth
from gateway.upstream.deadlines import Deadlines
from gateway.upstream.dialects import dialect_for
from gateway.upstream.h1 import H1Response
from gateway.upstream.pool import Pool
from gateway.upstream.resume import resume_body
from gateway.upstream.tokenize import tokenize

RESUME_TOKENIZE_TIMEOUT_S = 2.0  # counting the original prompt of a resumed stream (its final usage)


class Dispatcher(Relaying):
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        pool: Pool,
        driver: SchedulerDriver,
        metrics: GatewayMetrics,
        clock: Clock,
        settings: UpstreamSettings,
        auth: EngineAuth | None = None,
        prefix: PrefixIndex | None = None,
    ) -> None:
        self.session = session  # tokenize calls
        self.pool = pool  # generation calls
        self.driver = driver
        self.metrics = metrics
        self.clock = clock
        self.settings = settings
        self.auth = auth if auth is not None else EngineAuth()
        self.prefix = prefix  # told what was sent where (the approximate source of the prefix index)
        # Every engine call's deadlines (headers, then the body's silences), swept by one timer.
        self.deadlines = Deadlines(clock)
        self.response_ids = ResponseIds()  # where each Responses API answer was made

    async def run(
        self,
        ctx: RequestContext,
        sreq: SchedRequest,
        body: dict[str, Any],
        include_usage: bool,
        request: web.Request | None,
        *,
        raw: bytes | None = None,
    ) -> web.StreamResponse:
        """Run the engine call for `body`, parsed from `raw` (if given: sent as is when nothing changed,
        see `engine_body`). `request` is the client's, which a streamed answer is written to (None: no
        client connection, a batch line, whose answer is never streamed)."""
        # A non-streamed request that may be preempted is streamed from the engine, so that what it
        # produced is known when it is preempted; berth answers it with one assembled response.
        assemble = not ctx.stream and sreq.resumable
        first_payload = engine_body(
            body,
            raw,
            served_model=ctx.served_model,
            stream=ctx.stream,
            include_usage=include_usage,
            assemble=assemble,
        )
        path = ctx.api.path
        stream = None
        if ctx.stream or assemble:
            stream = ClientStream(ctx, include_usage, client=ctx.stream)
            if ctx.api is ApiKind.RESPONSES:
                # The response is the engine's from its first event on (a background one can be polled
                # or cancelled while it streams): recorded as soon as the stream names it.
                stream.relay.on_response = functools.partial(self._record_response, ctx)
        exclude: frozenset[EndpointId] = frozenset()
        placed = self.driver.acquire(sreq, exclude)
        while True:
            seat = await placed
            sreq = seat.req
            endpoint = seat.endpoint
            ctx.attempts += 1
            ctx.endpoint = endpoint.id
            if ctx.dispatched_at is None:
                ctx.dispatched_at = self.clock.now()
            if self.prefix is not None:
                ctx.cached_tokens = self.prefix.dispatched(endpoint.id, ctx.prefix_keys, sreq.prompt_tokens)
            resp: H1Response | None = None
            sent_body, sent = body, first_payload
            if stream is not None and sreq.resumable:
                sent_body = _resumable_call(ctx, endpoint, body, stream)
                if sent_body is not body:
                    sent = orjson.dumps(sent_body)
            if endpoint.priority_scheduling:  # only such engines accept a priority (vLLM: else 400)
                urgency = self.driver.scheduler.engine_priority(sreq.id)
                if urgency is not None:
                    sent = orjson.dumps(
                        {**sent_body, "priority": dialect_for(endpoint.engine).priority(urgency)}
                    )
            seated = True
            try:
                try:
                    resp = await open_request(
                        self.pool,
                        endpoint.url + path,
                        sent,
                        sreq.id,
                        self.settings,
                        deadlines=self.deadlines,
                        auth=self.auth.headers(endpoint.id),
                    )
                    self.auth.result(endpoint.id, "generation", resp.status)
                    if resp.status in AUTH_REFUSED:
                        # berth's credentials, not the engine, are at fault: no retry elsewhere
                        raise errors.engine_auth_failed(resp.status)
                    if resp.status != 200:
                        raise await error_from(resp, self.deadlines, self.settings.first_byte_timeout_s)
                except BerthError as e:
                    # A pinned request needs what its endpoint holds: no other endpoint can answer it.
                    if e.retryable and ctx.attempts <= self.settings.max_retries and sreq.pinned is None:
                        self.metrics.upstream_retries_of(endpoint.id).inc()
                        exclude = exclude | {endpoint.id}
                        placed = self.driver.acquire(sreq, exclude)
                        continue
                    if stream is not None and stream.resumed:
                        return await stream.fail(e, request)  # the client has part of the stream already
                    raise
                if stream is not None:
                    return await self._relay_stream(ctx, resp, stream, request)
                return await self._relay_body(ctx, resp)
            except asyncio.CancelledError:
                preempt = self.driver.take_preempted(sreq.id)
                if preempt is None:
                    raise
                if resp is not None:
                    resp.close()  # abort the engine call now, before anything else is awaited
                seated = False  # the scheduler freed this seat when it preempted the request
                task = asyncio.current_task()
                if task is not None and task.uncancel() > 0:
                    self.driver.abandon(sreq.id)  # cancelled for another reason too: the client left
                    raise
                if stream is not None and stream.relay.done:
                    self.driver.abandon(sreq.id)  # it had just finished: nothing to resume
                    record_stream(ctx, stream.relay)
                    return self._assembled(ctx, stream.relay) if stream.out is None else await stream.close()
                try:
                    await self._preempted(ctx, preempt, endpoint, body, stream)
                except BaseException:
                    self.driver.abandon(sreq.id)  # e.g. the client left while it was being set up
                    raise
                placed = self.driver.resume(sreq.id)
            finally:
                if resp is not None:
                    # close (not release): a cut-short engine call must see its connection drop so the
                    # engine aborts the request; a fully read response has already returned its connection.
                    resp.close()
                if seated:
                    self.driver.release(sreq.id)

    async def relay_events(
        self, ctx: RequestContext, endpoint: EndpointView, request: web.Request
    ) -> web.StreamResponse:
        """A stored response's event stream (`GET /v1/responses/{id}?stream=true`: a background response's
        events, replayed and then followed as the engine makes them), GET from `endpoint` with the
        client's path and query and relayed as a generation's stream is (`Relaying._relay_stream`): no
        seat (its generation holds or held its own), so nothing is reported to the scheduler. An
        answer other than 200 (the engine's 404) is the client's as it came."""
        ctx.endpoint = endpoint.id
        ctx.dispatched_at = self.clock.now()
        resp = await open_request(
            self.pool,
            endpoint.url + request.path_qs,
            b"",
            ctx.id,
            self.settings,
            deadlines=self.deadlines,
            auth=self.auth.headers(endpoint.id),
            method="GET",
        )
        try:
            self.auth.result(endpoint.id, request.path, resp.status)
            if resp.status != 200:
                ctx.status = resp.status
                raw = await self._read_whole(resp)
                headers = answer_headers(ctx, "application/json")
                return web.Response(body=raw, status=resp.status, headers=headers)
            return await self._relay_stream(ctx, resp, ClientStream(ctx, True, client=True), request)
        finally:
            resp.close()

    def _record_response(self, ctx: RequestContext, response_id: str) -> None:
        if ctx.endpoint is not None:
            self.response_ids.record(response_id, ctx.endpoint, ctx.tenant)

    async def _preempted(
        self,
        ctx: RequestContext,
        preempt: Preempt,
        endpoint: EndpointView,
        body: dict[str, Any],
        stream: ClientStream | None,
    ) -> None:
        """Count a preemption and set the stream up to go on when the request is placed again."""
        ctx.preemptions += 1
        model = ctx.client_model or "-"
        self.metrics.preemptions_of(model, preempt.reason).inc()
        if stream is None:
            return  # nothing reached the client: the same call is made again
        relay = stream.relay
        if not relay.continuable and not stream.client:
            # Reasoning or a tool call cannot be continued from text, but the client saw nothing of
            # this answer yet: it starts again.
            self.metrics.recomputed_tokens_of(model).inc(relay.tokens)
            stream.relay = stream.fresh_relay(relay.include_usage)
            stream.resumed = False
            return
        self.metrics.recomputed_tokens_of(model).inc(relay.tokens)
        if relay.prompt_ids is not None and relay.generated_ids is not None:
            # The engine reported the exact tokens: the next prompt is the prompt's and the produced ones.
            stream.prompt_tokens = len(relay.prompt_ids)
            stream.resume_ids = (*relay.prompt_ids, *relay.generated_ids)
        elif relay.tokens:
            await self._count_prompt(ctx, endpoint, body, stream)
        relay.resume(stream.prompt_tokens)
        stream.resumed = True

    async def _count_prompt(
        self, ctx: RequestContext, endpoint: EndpointView, body: dict[str, Any], stream: ClientStream
    ) -> None:
        """What a resume needs the engine to count: the original prompt's tokens (the usage a resumed
        stream ends with; None: the resumed call's count less the tokens produced) and, for a
        completion, the prompt and the produced text as token ids (`resume_body`'s `prompt_ids`)."""
        dialect = dialect_for(endpoint.engine)
        path = dialect.tokenize_path
        completion = ctx.api is ApiKind.COMPLETION
        if path is None:
            return
        url = endpoint.url + path
        auth = self.auth.headers(endpoint.id)
        if stream.prompt_tokens is None:
            tb = dialect.tokenize_body(ctx.api, body, ctx.served_model)
            if tb is None:
                return
            answer = await tokenize(
                self.session, url, tb, ctx.id, RESUME_TOKENIZE_TIMEOUT_S, auth=auth, ids=completion
            )
            stream.prompt_tokens = answer.count
            stream.prompt_ids = answer.tokens
        stream.resume_ids = None
        if completion and stream.prompt_ids is not None:
            produced = {"prompt": stream.relay.produced_text, "add_special_tokens": False}
            tb = dialect.tokenize_body(ctx.api, produced, ctx.served_model)
            if tb is None:
                return
            answer = await tokenize(
                self.session, url, tb, ctx.id, RESUME_TOKENIZE_TIMEOUT_S, auth=auth, ids=True
            )
            if answer.tokens is not None:
                stream.resume_ids = stream.prompt_ids + answer.tokens


def _resumable_call(
    ctx: RequestContext, endpoint: EndpointView, body: dict[str, Any], stream: ClientStream
) -> dict[str, Any]:
    """The engine call of a request that may be preempted: a resumed one continues its produced text
    (in the dialect of the engine it now goes to); a completion asks an engine that can for its token
    ids, so that a resume continues from the exact tokens (the relay keeps them from the client)."""
    dialect = dialect_for(endpoint.engine)
    relay = stream.relay
    ids = ctx.api is ApiKind.COMPLETION and dialect.returns_token_ids and not body.get("return_token_ids")
    if ids and relay.generated_ids is None and not stream.resumed:
        relay.collect_ids()
    elif not ids:
        relay.generated_ids = None  # an engine that does not report them: a later resume tokenizes
    out = body
    if stream.resumed:
        out = resume_body(
            ctx.api,
            body,
            relay.produced_text,
            relay.tokens,
            continue_fields=dict(dialect.continue_chat),
            prompt_ids=stream.resume_ids,
        )
    if relay.generated_ids is not None:
        out = {**out, "return_token_ids": True}
    return out
