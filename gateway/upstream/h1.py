"""One HTTP/1.1 connection to an engine and the response it carries: berth's client for generation calls.

aiohttp's client does far more per call than an engine call needs (a request object, header
multidicts, a payload writer, cookie and redirect handling, its Python-side stream reader); an
engine call writes one pre-built request and reads one response. `H1Connection` is an
`asyncio.Protocol` whose bytes go to httptools' C parser (llhttp); the body arrives as the parser's
decoded chunks (Content-Length, chunked, or up to the connection's end) in an `H1Response`.

One response at a time per connection (no pipelining). The response owns its connection until the
parser has seen the whole message: then the connection goes back to its owner (the pool) when the
server keeps it alive, or is closed. A response closed before that closes the connection, so that
the engine sees the drop and aborts the request (preemption, a client that left, a timeout).

Flow control: while more than `BODY_BUFFER_LIMIT` bytes of body wait unread, the connection stops
reading from the socket, and reads again once the reader has taken them.

A reader that handles each chunk synchronously (a relay) can take the body as it arrives instead
(`deliver`): the chunks go to its sink from the connection's own callback, with no future, no task
wake-up and no buffering per chunk; the reader's task sleeps until the body ends, fails, or the sink
asks to stop (its client is slow: the reader then waits for it and reads on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, Protocol, cast

import httptools

#: Body bytes buffered unread before the socket is paused.
BODY_BUFFER_LIMIT: Final = 256 * 1024
#: The longest status line and headers of a response (aiohttp's client allowed 8190 per line).
MAX_HEAD_BYTES: Final = 64 * 1024

_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding"})


class ResponseError(Exception):
    """The engine's response cannot be read to its end: base of the two below."""


class EngineDropped(ResponseError):
    """The connection ended (or failed) before the response did."""


class BadResponse(ResponseError):
    """The engine sent something that is not an HTTP/1.1 response (or headers over the limit)."""


class ConnectionOwner(Protocol):
    """Where a connection goes when its response is done (the pool)."""

    def released(self, conn: H1Connection) -> None:
        """The response was received whole and the server keeps the connection alive: reuse it."""

    def lost(self, conn: H1Connection) -> None:
        """The connection is closed: forget it (it may have been idle, or in use)."""


class H1Response:
    """An engine's answer: `status` and `reason` once the headers came, then the body.

    Read the body whole (`read()`), at most n bytes of it (`read(n)`: an error's), or as it comes
    (`async for chunk in resp`: each step takes every byte buffered). `total_bytes`, `is_eof()` and
    `set_exception()` are what `gateway.upstream.deadlines.StallWatch` watches. Bytes already received
    are read before a failure is raised.
    """

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_eof",
        "_exc",
        "_loop",
        "_paused",
        "_sink",
        "_waiter",
        "reason",
        "status",
        "total_bytes",
    )

    def __init__(self, conn: H1Connection | None, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0  # 0 until the headers came
        self.reason = ""
        self.total_bytes = 0  # body bytes received
        self._conn = conn  # until the message ended (then the pool's) or the response was closed
        self._loop = loop
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._sink: Callable[[bytes], bool] | None = None

    # -- the reader's side

    async def head(self) -> None:
        """Wait for the status line and headers (raises ResponseError if the connection fails first)."""
        while self.status == 0:
            if self._exc is not None:
                raise self._exc
            await self._wait()

    def is_eof(self) -> bool:
        """Whether the whole body was received (what is left may only wait to be read)."""
        return self._eof

    def set_exception(self, exc: BaseException) -> None:
        """Fail the reader's next read once what was received is read (the stall watch's timeout)."""
        self._exc = exc
        self._wake()

    async def read(self, limit: int = -1) -> bytes:
        """The body to its end, or (`limit` >= 0) its first `limit` bytes, fewer if it ends first."""
        parts: list[bytes] = []
        size = 0
        while True:
            if self._chunks:  # taken as it comes: a paused socket reads again
                part = self._take()
                parts.append(part)
                size += len(part)
            if self._eof or 0 <= limit <= size:
                break
            if self._exc is not None:
                raise self._exc
            await self._wait()
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if 0 <= limit < len(data):
            data = data[:limit]
        return data

    def __aiter__(self) -> H1Response:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                raise StopAsyncIteration
            await self._wait()
        return self._take()

    async def deliver(self, sink: Callable[[bytes], bool]) -> bool:
        """Give the body to `sink` as it comes, chunk by chunk, until it ends (True) or the sink asks to
        stop (False: read on with `deliver` again or `async for`).

        `sink(chunk)` runs in the connection's callback, not in the reader's task, so it must not block;
        it returns whether it takes more. Bytes buffered before are given to it first, here. What the
        sink raises is raised here (the response is then broken: close it), as are the read's failures.
        """
        if self._sink is not None:
            raise RuntimeError("the body is already being delivered")
        if self._chunks and not sink(self._take()):
            return False
        self._sink = sink
        try:
            while True:
                if self._exc is not None:  # a failed read, or the sink failed
                    raise self._exc
                if self._eof:
                    return True
                if not self._delivering():
                    return False  # the sink asked to stop
                await self._wait()
        finally:
            self._sink = None

    def close(self) -> None:
        """Done with the response: a fully received one has given its connection back already (a no-op);
        otherwise the connection is closed (the engine sees the drop and aborts the request)."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abandon()
            if self._exc is None:
                self._exc = EngineDropped("the response was closed before it ended")

    # -- the connection's side

    def _delivering(self) -> bool:
        return self._sink is not None

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            conn = self._conn
            if conn is not None:
                conn.resume_reading()
        return data

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        sink = self._sink
        if sink is not None:  # nothing is buffered while a sink is attached
            try:
                more = sink(chunk)
            except Exception as e:  # the reader's failure, raised in its task
                self._sink = None
                if self._exc is None:
                    self._exc = e
                self._wake()
                return
            if not more:
                self._sink = None
                self._wake()
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > BODY_BUFFER_LIMIT and not self._paused and self._conn is not None:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def _end(self) -> None:
        self._eof = True
        self._conn = None
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._conn = None
        if self._exc is None:
            self._exc = exc
        self._wake()


#: What a lost connection keeps as its parser: one that holds no callbacks (see `connection_lost`).
_LOST_PARSER: Final = httptools.HttpResponseParser(object())


class H1Connection(asyncio.Protocol):
    """One keep-alive connection to an engine (`key`: its origin); `send` starts a request on it."""

    __slots__ = (
        "_done",
        "_framed",
        "_head_bytes",
        "_header_bytes",
        "_interim",
        "_keep_alive",
        "_loop",
        "_owner",
        "_parser",
        "_reason",
        "_resp",
        "_transport",
        "closed",
        "idle_since",
        "key",
    )

    def __init__(
        self, owner: ConnectionOwner, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.key = key
        self.idle_since = 0.0  # when it last went back to the pool
        self.closed = False
        self._owner = owner
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._resp: H1Response | None = None
        self._reason: list[bytes] = []
        self._head_bytes = 0  # bytes read while the head was incomplete
        self._header_bytes = 0  # the headers' names and values
        self._framed = False  # the response has a Content-Length or Transfer-Encoding
        self._interim = False  # a 1xx response, before the real one
        self._done = False  # the parser saw the response's end
        self._keep_alive = False  # ... and the server keeps the connection open after it

    def send(self, data: bytes) -> H1Response:
        """Write a whole request (head and body, prepared by the caller) and return its response."""
        transport = self._transport
        if transport is None or self._resp is not None or self.closed:
            self.close()
            raise RuntimeError("the connection is not ready for a request")
        resp = self._resp = H1Response(self, self._loop)
        self._reason.clear()
        self._head_bytes = self._header_bytes = 0
        self._framed = self._interim = self._done = False
        transport.write(data)
        return resp

    def usable(self) -> bool:
        """Whether a request may be sent now (open, not closing, no response in flight)."""
        transport = self._transport
        return not self.closed and transport is not None and not transport.is_closing() and self._resp is None

    def close(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.close()

    def abandon(self) -> None:
        """The response's reader gave it up before its end: the connection cannot carry another."""
        self._resp = None
        self.close()

    def pause_reading(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def resume_reading(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a read-write transport (uvloop's is not registered as an asyncio.Transport: no isinstance)
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        resp = self._resp
        if resp is None:
            self.close()  # bytes nobody asked for (on an idle connection): it cannot be trusted
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            if self._done:  # the response is whole, but bytes came after it: the connection is not reused
                self._finished(resp, reuse=False)
                return
            self._resp = None
            cause = e.__context__  # what a callback of ours raised
            resp._fail(
                cause
                if isinstance(cause, BadResponse)
                else BadResponse(f"engine sent an invalid HTTP response: {e}")
            )
            self.close()
            return
        if self._done:
            self._finished(resp, reuse=True)
        elif resp.status == 0:
            self._head_bytes += len(data)  # all of it was head: the head is not complete yet
            if self._head_bytes > MAX_HEAD_BYTES:
                self._resp = None
                resp._fail(BadResponse(f"engine response headers over {MAX_HEAD_BYTES} bytes"))
                self.close()

    def _finished(self, resp: H1Response, *, reuse: bool) -> None:
        keep = reuse and self._keep_alive
        self._resp = None
        if resp._paused:
            resp._paused = False
            self.resume_reading()
        resp._end()
        if keep and not self.closed:
            self._owner.released(self)
        else:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self._resp
        self._resp = None
        if resp is not None:
            if resp.status and not self._framed:
                resp._end()  # a body without length or chunks ends with the connection
            elif resp.status:
                resp._fail(EngineDropped(f"engine closed the connection mid-response{_cause(exc)}"))
            else:
                resp._fail(EngineDropped(f"engine closed the connection before answering{_cause(exc)}"))
        self._owner.lost(self)
        # The parser holds this protocol's bound callbacks and the transport holds the protocol: both
        # cycles are broken here, so a closed connection is freed by its reference count. Left to the
        # cyclic collector, each one was a dozen objects of garbage (the connection, its parser, the
        # transport, the bound callbacks), promoted into the older generations while it was in use.
        self._transport = None
        self._parser = _LOST_PARSER

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self._done:
            raise BadResponse("engine sent a second response to one request")

    def on_status(self, status: bytes) -> None:
        self._reason.append(status)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEAD_BYTES:  # a head that came whole in one read
            raise BadResponse(f"engine response headers over {MAX_HEAD_BYTES} bytes")
        if name.lower() in _FRAMING:
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._interim = True  # 100 Continue and the like: the answer follows
            self._reason.clear()
            return
        resp = self._resp
        assert resp is not None
        resp.reason = b"".join(self._reason).decode("latin-1")
        resp.status = status
        resp._wake()

    def on_body(self, body: bytes) -> None:
        resp = self._resp
        assert resp is not None
        resp._feed(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = self._framed = False
            return
        self._done = True
        # read here: the parser forgets the message's flags once this callback returns
        self._keep_alive = self._parser.should_keep_alive()


def _cause(exc: Exception | None) -> str:
    return "" if exc is None else f" ({exc})"
