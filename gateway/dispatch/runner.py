"""The dispatch phases of one request: acquire a slot -> open the engine call (retrying on another
endpoint before the first byte) -> relay -> release. The caller's finish phase logs and counts.

A streamed request the scheduler preempts (its task is cancelled by the driver, see
`gateway.dispatch.driver`) closes its engine call, keeps its client's stream open, waits in the queue
for its next seat and goes on there with a call that continues the produced text
(`gateway.upstream.resume`); the relay stitches the new engine stream onto the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.errors import BerthError
from gateway.core.metrics import GatewayMetrics
from gateway.core.types import ApiKind, EndpointId, RequestId
from gateway.dispatch.context import RequestContext
from gateway.dispatch.driver import SchedulerDriver
from gateway.dispatch.engine_body import engine_body
from gateway.dispatch.event_stream import ChunkWriter, EventStreamResponse, open_event_stream
from gateway.dispatch.slo_headers import answer_headers, slo_met_now
from gateway.sched.decisions import Preempt
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView
from gateway.telemetry.prefix_index import PrefixIndex
from gateway.telemetry.prefix_keys import answer_of
from gateway.upstream.client import UpstreamSettings, open_request
from gateway.upstream.credentials import AUTH_REFUSED, EngineAuth
from gateway.upstream.deadlines import Deadlines, StallWatch
from gateway.upstream.dialects import dialect_for
from gateway.upstream.h1 import H1Response, ResponseError
from gateway.upstream.pool import Pool
from gateway.upstream.resume import resume_body
from gateway.upstream.sse import SseRelay, error_event
from gateway.upstream.tokenize import tokenize

_ERROR_BODY_LIMIT = 64 * 1024
PROGRESS_EVERY = 16  # tokens between a stream's progress reports to the scheduler
RESUME_TOKENIZE_TIMEOUT_S = 2.0  # counting the original prompt of a resumed stream (its final usage)


class Dispatcher:
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
        stream = _Stream(ctx, include_usage, client=ctx.stream) if ctx.stream or assemble else None
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
                        raise await _error_from(resp, self.deadlines, self.settings.first_byte_timeout_s)
                except BerthError as e:
                    if e.retryable and ctx.attempts <= self.settings.max_retries:
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
                    _record_stream(ctx, stream.relay)
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

    async def _preempted(
        self,
        ctx: RequestContext,
        preempt: Preempt,
        endpoint: EndpointView,
        body: dict[str, Any],
        stream: _Stream | None,
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
        self, ctx: RequestContext, endpoint: EndpointView, body: dict[str, Any], stream: _Stream
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

    async def _relay_body(self, ctx: RequestContext, resp: H1Response) -> web.Response:
        # Usually the whole body came with the headers: nothing to watch.
        watch = None
        if not resp.is_eof():
            watch = self.deadlines.stall(resp, self.settings.first_byte_timeout_s)
        try:
            data = await resp.read()
        except ResponseError as e:
            raise errors.upstream_failed(
                f"engine dropped the connection mid-response: {e}", retryable=False
            ) from None
        except TimeoutError:
            raise errors.upstream_timeout("engine stopped sending the response") from None
        finally:
            if watch is not None:
                self.deadlines.forget(watch)
        now = self.clock.now()
        ctx.first_token_at = now
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise errors.upstream_failed("engine answered with invalid JSON", retryable=False) from None
        rewrite = ctx.client_model != ctx.served_model
        if isinstance(obj, dict):
            usage = obj.get("usage")
            if isinstance(usage, dict):
                ctx.prompt_tokens = usage.get("prompt_tokens")
                ctx.output_tokens = int(usage.get("completion_tokens") or 0)
            if ctx.prefix_keys is not None:
                ctx.answer_text = answer_of(obj)
            if rewrite and "model" in obj:
                obj["model"] = ctx.client_model
                data = orjson.dumps(obj)
        ctx.status = 200
        headers = answer_headers(ctx, "application/json")
        headers["X-Berth-Slo-Met"] = "true" if slo_met_now(ctx, now) else "false"
        return web.Response(body=data, status=200, headers=headers)

    async def _relay_stream(
        self, ctx: RequestContext, resp: H1Response, stream: _Stream, request: web.Request | None
    ) -> web.StreamResponse:
        relay = stream.relay
        out = stream.out
        if out is None and stream.client:
            headers = answer_headers(ctx, "text/event-stream")
            headers["Cache-Control"] = "no-cache"
            out = stream.out = EventStreamResponse(status=200, headers=headers)
            out.enable_chunked_encoding()
            ctx.status = 200
        deadlines = self.deadlines
        stall = deadlines.stall(resp, self.settings.read_timeout_s)
        step = _ChunkStep(self, ctx, stream, relay, stall)
        held: AbstractStreamWriter | None = None  # the client's headers, held for the first event
        try:
            if out is not None and not out.prepared:
                assert request is not None  # a client stream has its client's request
                # Held for the first event if the engine's first bytes came with its headers.
                held = await open_event_stream(out, request, resp.total_bytes > 0)
            direct = out.direct if out is not None else None
            step.direct = direct
            chunks = aiter(resp)
            try:
                while True:
                    if held is None and (out is None or direct is not None):
                        # Every chunk relayed in the engine connection's callback, no wake-up of this
                        # task per chunk; back here when the stream ended or the client is slow.
                        if await resp.deliver(step.sink):
                            break
                        if direct is not None:
                            await direct.drain()
                        continue
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    data = step.take(chunk)
                    if data and out is not None:
                        await out.write(data)  # the client's headers go with it
                    elif held is not None:
                        held.send_headers()  # what came forwarded nothing yet: no more waiting for it
                    if held is not None and out is not None:
                        held = None
                        direct = step.direct = out.headers_sent()
                tail = relay.flush()
                if tail and out is not None:
                    await out.write(tail)
                if not relay.done and relay.error is None:
                    raise errors.upstream_failed(
                        "engine closed the stream before it finished", retryable=False
                    )
                if relay.error is not None:
                    if out is None:
                        raise errors.upstream_failed(
                            f"engine failed mid-answer: {relay.error.get('message')}", retryable=False
                        )
                    ctx.outcome = "engine_error"
            except ResponseError as e:
                raise errors.upstream_failed(f"engine dropped the stream: {e}", retryable=False) from None
            except TimeoutError:
                raise errors.upstream_timeout(
                    f"engine stream stalled for {self.settings.read_timeout_s:g}s"
                ) from None
        except BerthError as e:
            return await stream.fail(e, request)
        except ConnectionResetError:
            ctx.outcome = "client_disconnect"  # the client went away while we wrote to it
            if out is None:
                raise
            return out
        finally:
            deadlines.forget(stall)
            _record_stream(ctx, relay)
        if out is None:
            return self._assembled(ctx, relay)
        return await stream.close()

    def _assembled(self, ctx: RequestContext, relay: SseRelay) -> web.Response:
        """A non-streamed request's answer, made of the engine stream berth read for it."""
        ctx.status = 200
        headers = answer_headers(ctx, "application/json")
        headers["X-Berth-Slo-Met"] = "true" if slo_met_now(ctx, self.clock.now()) else "false"
        body = orjson.dumps(relay.assembled(ctx.api is ApiKind.CHAT))
        return web.Response(body=body, status=200, headers=headers)


class _ChunkStep:
    """What the relay does with each chunk of one engine call's stream: the stall watch's `seen`, the
    relay's `feed`, the scheduler's pin and progress reports (every `PROGRESS_EVERY` tokens); `sink`
    also writes the result to the client (`H1Response.deliver`'s sink)."""

    __slots__ = (
        "base",
        "clock",
        "direct",
        "pin",
        "pinnable",
        "progress",
        "relay",
        "report_at",
        "run_first",
        "sreq_id",
        "stall",
    )

    def __init__(
        self, dispatcher: Dispatcher, ctx: RequestContext, stream: _Stream, relay: SseRelay, stall: StallWatch
    ) -> None:
        scheduler = dispatcher.driver.scheduler
        self.clock = dispatcher.clock
        self.stall = stall
        self.relay = relay
        self.progress = scheduler.progress  # tokens so far, for the placement predictions
        self.pin = scheduler.pin
        self.direct: ChunkWriter | None = None
        sched = ctx.sched
        # Progress counts this engine call's tokens (a resumed call starts from 0 at its own first token).
        self.base = base = relay.tokens
        self.run_first: float | None = relay.first_token_at if base == 0 else None
        self.report_at = base + 1 if sched is not None else 1 << 62
        self.sreq_id = RequestId("") if sched is None else sched.id
        self.pinnable = stream.client and sched is not None and sched.resumable and relay.continuable

    def take(self, chunk: bytes) -> bytes:
        """Relay one chunk; the bytes for the client."""
        self.stall.seen = now = self.clock.now()
        relay = self.relay
        data = relay.feed(chunk, now)
        if self.pinnable and not relay.continuable:
            # Reasoning or a tool call reached the client: a continuation from text would lose it, so
            # the request may no longer be preempted.
            self.pin(self.sreq_id)
            self.pinnable = False
        if relay.tokens >= self.report_at:
            if self.run_first is None:
                self.run_first = relay.first_token_at if self.base == 0 else now
            self.progress(self.sreq_id, relay.tokens - self.base, self.run_first)
            self.report_at = relay.tokens + PROGRESS_EVERY
        return data

    def sink(self, chunk: bytes) -> bool:
        """`take` and write to the client at once; whether the client takes more now."""
        data = self.take(chunk)
        direct = self.direct
        if data and direct is not None:
            return direct.write(data)
        return True


def _resumable_call(
    ctx: RequestContext, endpoint: EndpointView, body: dict[str, Any], stream: _Stream
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


class _Stream:
    """The client's side of a streamed request, across engine calls: one response, prepared once, fed
    through one relay (which stitches a resumed call's stream onto the first)."""

    __slots__ = ("client", "ctx", "out", "prompt_ids", "prompt_tokens", "relay", "resume_ids", "resumed")

    def __init__(self, ctx: RequestContext, include_usage: bool, *, client: bool) -> None:
        self.ctx = ctx
        self.client = client  # False: the client asked for one answer, which berth assembles
        self.relay = self.fresh_relay(include_usage)
        self.out: EventStreamResponse | None = None
        self.resumed = False  # the client has part of the stream from an earlier engine call
        self.prompt_tokens: int | None = None  # the original prompt's, for a resumed stream's usage
        self.prompt_ids: tuple[int, ...] | None = None  # a completion's original prompt, as token ids
        self.resume_ids: tuple[int, ...] | None = None  # ... with the produced text's: the next prompt

    def fresh_relay(self, include_usage: bool) -> SseRelay:
        ctx = self.ctx
        return SseRelay(
            include_usage=include_usage, served_model=ctx.served_model, client_model=ctx.client_model
        )

    async def fail(self, err: BerthError, request: web.Request | None) -> web.StreamResponse:
        """End the stream with an error event (the client already has a 200); an assembled answer's
        error is the client's answer."""
        out = self.out
        if out is None:
            raise err
        ctx = self.ctx
        ctx.fail(err)
        ctx.status = 200
        with contextlib.suppress(ConnectionError, RuntimeError):
            if not out.prepared and request is not None:
                await out.prepare(request)
            await out.write(error_event(err.body()))
        return await self.close()

    async def close(self) -> web.StreamResponse:
        out = self.out
        assert out is not None
        with contextlib.suppress(ConnectionError, RuntimeError):
            await out.write_eof()
        return out


def _record_stream(ctx: RequestContext, relay: SseRelay) -> None:
    ctx.first_token_at = relay.first_token_at
    ctx.itl_gaps = relay.gaps
    if ctx.prefix_keys is not None and relay.continuable:
        ctx.answer_text = relay.produced_text
    usage = relay.usage
    if usage:
        ctx.prompt_tokens = usage.get("prompt_tokens")
        ctx.output_tokens = int(usage.get("completion_tokens") or relay.tokens)
    else:
        ctx.output_tokens = relay.tokens


async def _error_from(resp: H1Response, deadlines: Deadlines, timeout_s: float) -> BerthError:
    """Map an engine's non-200 answer; 5xx is retryable on another endpoint, 4xx goes to the client with
    the detail of the engine's error (`errors.engine_error`): its body's first 64 KiB, read while the
    engine sends it (an error body that stops for `timeout_s` is taken as empty)."""
    watch = None if resp.is_eof() else deadlines.stall(resp, timeout_s)
    try:
        raw = await resp.read(_ERROR_BODY_LIMIT)
    except (ResponseError, TimeoutError):
        raw = b""
    finally:
        if watch is not None:
            deadlines.forget(watch)
    return errors.engine_error(resp.status, raw, resp.reason or "")
