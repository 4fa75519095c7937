"""Relaying one engine call's answer to the client: a whole body (the model renamed, the usage and a
Responses API id read), or a stream through `SseRelay` to the client's event stream (`ClientStream`, one
response across the engine calls of a preempted and resumed request), each chunk reported to the
scheduler as progress (`_ChunkStep`); an engine's error answer mapped (`error_from`). `Relaying` is the
dispatcher's base (`gateway.dispatch.runner`), which places the request, opens the engine call and
handles its preemption.
"""

from __future__ import annotations

import contextlib

import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.errors import BerthError
from gateway.core.types import ApiKind, RequestId
from gateway.dispatch.context import RequestContext
from gateway.dispatch.driver import SchedulerDriver
from gateway.dispatch.event_stream import ChunkWriter, EventStreamResponse, open_event_stream
from gateway.dispatch.response_ids import ResponseIds
from gateway.dispatch.slo_headers import answer_headers, slo_met_now
from gateway.telemetry.prefix_keys import answer_of
from gateway.upstream.client import UpstreamSettings
from gateway.upstream.deadlines import Deadlines, StallWatch
from gateway.upstream.h1 import H1Response, ResponseError
from gateway.upstream.sse import SseRelay, error_event
from gateway.upstream.stream_tally import response_usage

_ERROR_BODY_LIMIT = 64 * 1024
PROGRESS_EVERY = 16  # tokens between a stream's progress reports to the scheduler


class Relaying:
    """Relays an engine call's answer; what it uses is the dispatcher's (set in its constructor)."""

    driver: SchedulerDriver
    clock: Clock
    settings: UpstreamSettings
    deadlines: Deadlines
    response_ids: ResponseIds

    async def _read_whole(self, resp: H1Response) -> bytes:
        """The engine's whole body, read under the stall watch."""
        # Usually the whole body came with the headers: nothing to watch.
        watch = None
        if not resp.is_eof():
            watch = self.deadlines.stall(resp, self.settings.first_byte_timeout_s)
        try:
            return await resp.read()
        except ResponseError as e:
            raise errors.upstream_failed(
                f"engine dropped the connection mid-response: {e}", retryable=False
            ) from None
        except TimeoutError:
            raise errors.upstream_timeout("engine stopped sending the response") from None
        finally:
            if watch is not None:
                self.deadlines.forget(watch)

    async def _relay_body(self, ctx: RequestContext, resp: H1Response) -> web.Response:
        data = await self._read_whole(resp)
        now = self.clock.now()
        ctx.first_token_at = now
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise errors.upstream_failed("engine answered with invalid JSON", retryable=False) from None
        rewrite = ctx.client_model != ctx.served_model
        if isinstance(obj, dict):
            usage = obj.get("usage")
            if ctx.api is ApiKind.RESPONSES:
                rid = obj.get("id")
                if isinstance(rid, str) and ctx.endpoint is not None:
                    self.response_ids.record(rid, ctx.endpoint, ctx.tenant)
                usage = response_usage(usage) if isinstance(usage, dict) else None
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
        self, ctx: RequestContext, resp: H1Response, stream: ClientStream, request: web.Request | None
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
            record_stream(ctx, relay)
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
        self,
        dispatcher: Relaying,
        ctx: RequestContext,
        stream: ClientStream,
        relay: SseRelay,
        stall: StallWatch,
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


class ClientStream:
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


def record_stream(ctx: RequestContext, relay: SseRelay) -> None:
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


async def error_from(resp: H1Response, deadlines: Deadlines, timeout_s: float) -> BerthError:
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
