"""berth's engine-call client (gateway.upstream.h1, .pool, client.open_request) against real servers on
loopback: aiohttp servers for well-formed answers, raw asyncio servers for the ones aiohttp would not
send (garbage, huge heads, a body cut short, a server closing a kept-alive connection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import uvloop
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.core.clock import FakeClock
from gateway.core.errors import BerthError
from gateway.upstream.client import UpstreamSettings, open_request, pool_counts
from gateway.upstream.deadlines import Deadlines
from gateway.upstream.h1 import BODY_BUFFER_LIMIT, EngineDropped, H1Connection, H1Response
from gateway.upstream.pool import KEEPALIVE_S, Pool
from loadgen.diag import overhead_micro

PATH = "/v1/chat/completions"
BODY = b'{"model":"tiny"}'


class WatchedPool(Pool):
    """A pool that says when it forgot a closed connection (tests await that instead of sleeping)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.lost_conns = 0
        self._lost_changed = asyncio.Event()

    def lost(self, conn: H1Connection) -> None:
        super().lost(conn)
        self.lost_conns += 1
        self._lost_changed.set()

    async def wait_lost(self, n: int) -> None:
        while self.lost_conns < n:
            self._lost_changed.clear()
            await self._lost_changed.wait()


@dataclass
class Rig:
    pool: WatchedPool
    clock: FakeClock
    settings: UpstreamSettings
    deadlines: Deadlines = field(init=False)

    def __post_init__(self) -> None:
        self.deadlines = Deadlines(self.clock)

    async def call(
        self, url: str, rid: str = "b1", auth: dict[str, str] | None = None, body: bytes = BODY
    ) -> H1Response:
        return await open_request(
            self.pool, url + PATH, body, rid, self.settings, deadlines=self.deadlines, auth=auth
        )


def _rig(**settings: float) -> Rig:
    s = UpstreamSettings(**settings)  # type: ignore[arg-type]
    clock = FakeClock()
    pool = WatchedPool(
        clock=clock, per_host=s.pool_per_host, total=s.pool_total, connect_timeout_s=s.connect_timeout_s
    )
    return Rig(pool, clock, s)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    r = _rig()
    yield r
    r.pool.close()


# ----------------------------------------------------------------- servers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Served:
    url: str
    requests: list[web.Request] = field(default_factory=list)
    peers: list[object] = field(default_factory=list)  # each request's client address: a connection each

    @property
    def connections(self) -> int:
        return len(set(self.peers))


@pytest.fixture
async def aio_server() -> AsyncIterator[Callable[[Handler], Awaitable[Served]]]:
    servers: list[TestServer] = []

    async def start(handler: Handler) -> Served:
        app = web.Application()
        served: Served

        async def record(request: web.Request) -> web.StreamResponse:
            served.requests.append(request)
            served.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
            return await handler(request)

        app.router.add_post(PATH, record)
        srv = TestServer(app)
        await srv.start_server()
        servers.append(srv)
        served = Served(str(srv.make_url("")).rstrip("/"))
        return served

    yield start
    for s in servers:
        await s.close()


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawServer:
    url: str
    connections: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection's script ended


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Script], Awaitable[RawServer]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> RawServer:
        raw: RawServer

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            raw.connections += 1
            try:
                await script(reader, writer)
            finally:
                writer.close()
                raw.closed.set()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(srv)
        port = srv.sockets[0].getsockname()[1]
        raw = RawServer(f"http://127.0.0.1:{port}")
        return raw

    yield start
    for s in servers:
        s.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head (its body read and dropped); b"" when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


def answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%b\r\n%b" % (len(body), extra, body)


# ----------------------------------------------------------------- framing


async def test_a_content_length_body_and_the_request_berth_sends(
    rig: Rig, aio_server: Callable[[Handler], Awaitable[Served]]
) -> None:
    async def handler(request: web.Request) -> web.Response:
        assert await request.read() == BODY
        return web.json_response({"ok": True})

    srv = await aio_server(handler)
    resp = await rig.call(srv.url, rid="b7", auth={"Authorization": "Bearer k"})
    assert (resp.status, resp.reason) == (200, "OK")
    assert await resp.read() == b'{"ok": true}'
    assert resp.is_eof()
    assert resp.total_bytes == len(b'{"ok": true}')
    h = srv.requests[0].headers
    assert h["X-Request-Id"] == "b7"
    assert h["Authorization"] == "Bearer k"
    assert h["Content-Type"] == "application/json"
    assert h["Accept-Encoding"] == "identity"
    assert h["User-Agent"].startswith("berth/")
    assert h["Host"] == srv.url.removeprefix("http://")
    assert srv.requests[0].method == "POST"
    assert srv.requests[0].path == PATH
    assert len(rig.deadlines) == 0  # the headers' watch is forgotten


async def test_a_chunked_body_arrives_as_it_is_sent(
    rig: Rig, aio_server: Callable[[Handler], Awaitable[Served]]
) -> None:
    go = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse()
        out.enable_chunked_encoding()
        await out.prepare(request)
        await out.write(b"data: one\n\n")
        await go.wait()
        await out.write(b"data: two\n\n")
        await out.write_eof()
        return out

    srv = await aio_server(handler)
    resp = await rig.call(srv.url)
    chunks = aiter(resp)
    assert await anext(chunks) == b"data: one\n\n"
    assert not resp.is_eof()
    go.set()
    rest = [c async for c in chunks]
    assert b"".join(rest) == b"data: two\n\n"
    assert resp.is_eof()
    assert pool_counts(None, rig.pool) == (0, 1)


async def test_an_error_answer_is_read_up_to_the_limit(
    rig: Rig, aio_server: Callable[[Handler], Awaitable[Served]]
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=503, reason="Busy Now", body=b"x" * 1000)

    srv = await aio_server(handler)
    resp = await rig.call(srv.url)
    assert (resp.status, resp.reason) == (503, "Busy Now")
    assert await resp.read(100) == b"x" * 100
    resp.close()  # received whole: the connection went back already
    assert pool_counts(None, rig.pool) == (0, 1)


async def test_a_body_that_ends_with_the_connection(
    rig: Rig, raw_server: Callable[[Script], Awaitable[RawServer]]
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")

    srv = await raw_server(script)
    resp = await rig.call(srv.url)
    assert await resp.read() == b"all of it"
    await rig.pool.wait_lost(1)
    assert pool_counts(None, rig.pool) == (0, 0)


# ----------------------------------------------------------------- keep-alive


async def test_sequential_calls_reuse_one_connection(
    rig: Rig, aio_server: Callable[[Handler], Awaitable[Served]]
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=b"ok")

    srv = await aio_server(handler)
    for i in range(3):
        resp = await rig.call(srv.url, rid=f"b{i}")
        assert await resp.read() == b"ok"
        resp.close()
    assert srv.connections == 1
    assert [r.headers["X-Request-Id"] for r in srv.requests] == ["b0", "b1", "b2"]
    assert pool_counts(None, rig.pool) == (0, 1)


async def test_connection_close_is_not_reused(
    rig: Rig, aio_server: Callable[[Handler], Awaitable[Served]]
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=b"ok", headers={"Connection": "close"})

    srv = await aio_server(handler)
    for _ in range(2):
        resp = await rig.call(srv.url)
        assert await resp.read() == b"ok"
    assert srv.connections == 2
    await rig.pool.wait_lost(2)
    assert pool_counts(None, rig.pool) == (0, 0)


async def test_an_idle_connection_the_server_closed_is_dropped_and_a_new_one_made(
    rig: Rig, raw_server: Callable[[Script], Awaitable[RawServer]]
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"ok"))  # keep-alive by default, and yet closed once written
        await writer.drain()

    srv = await raw_server(script)
    assert await (await rig.call(srv.url)).read() == b"ok"
    await rig.pool.wait_lost(1)  # the server's close reached the idle connection
    assert pool_counts(None, rig.pool) == (0, 0)
    assert await (await rig.call(srv.url)).read() == b"ok"
    assert srv.connections == 2


async def test_a_connection_idle_past_the_keepalive_is_not_reused(
    rig: Rig, aio_server: Callable[[Handler], Awaitable[Served]]
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=b"ok")

    srv = await aio_server(handler)
    assert await (await rig.call(srv.url)).read() == b"ok"
    rig.clock.advance(KEEPALIVE_S)
    assert await (await rig.call(srv.url)).read() == b"ok"
    assert srv.connections == 2
    await rig.pool.wait_lost(1)  # the stale one was closed
    assert pool_counts(None, rig.pool) == (0, 1)


# ----------------------------------------------------------------- failures


async def test_a_server_closing_mid_body_fails_the_read_after_what_came(
    rig: Rig, raw_server: Callable[[Script], Awaitable[RawServer]]
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nten bytes!")
        await writer.drain()

    srv = await raw_server(script)
    resp = await rig.call(srv.url)
    assert await anext(aiter(resp)) == b"ten bytes!"
    with pytest.raises(EngineDropped, match="mid-response"):
        await anext(aiter(resp))
    await rig.pool.wait_lost(1)
    assert pool_counts(None, rig.pool) == (0, 0)

    whole = await rig.call(srv.url)
    with pytest.raises(EngineDropped):
        await whole.read()


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "engine request failed", id="garbage-status-line"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n",
            "engine request failed: engine response headers over 65536 bytes",
            id="huge-headers",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (100 * 1024),
            "engine request failed: engine response headers over 65536 bytes",
            id="endless-head",
        ),
        pytest.param(b"", "engine dropped the connection", id="closed-before-answering"),
    ],
)
async def test_no_answer_is_a_retryable_502(
    rig: Rig, raw_server: Callable[[Script], Awaitable[RawServer]], reply: bytes, message: str
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if reply:
            writer.write(reply)
            await writer.drain()
            await reader.read()  # until berth closes the connection

    srv = await raw_server(script)
    with pytest.raises(BerthError) as ei:
        await rig.call(srv.url)
    assert (ei.value.status, ei.value.retryable) == (502, True)
    assert message in ei.value.message
    await rig.pool.wait_lost(1)
    assert pool_counts(None, rig.pool) == (0, 0)
    assert len(rig.deadlines) == 0


async def test_no_engine_listening_is_a_retryable_502(rig: Rig) -> None:
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    with pytest.raises(BerthError) as ei:
        await rig.call(f"http://127.0.0.1:{port}")
    assert (ei.value.status, ei.value.retryable) == (502, True)
    assert "cannot connect to engine" in ei.value.message
    assert pool_counts(None, rig.pool) == (0, 0)
    assert (rig.pool._total, rig.pool._open) == (0, {})


async def test_a_response_closed_before_its_end_closes_the_connection(
    rig: Rig, raw_server: Callable[[Script], Awaitable[RawServer]]
) -> None:
    gone = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        assert await reader.read() == b""  # the engine sees the client go
        gone.set()

    srv = await raw_server(script)
    resp = await rig.call(srv.url)
    assert await anext(aiter(resp)) == b"first"
    resp.close()
    await gone.wait()
    await rig.pool.wait_lost(1)
    assert pool_counts(None, rig.pool) == (0, 0)
    resp.close()  # again: nothing more happens
    with pytest.raises(EngineDropped):
        await anext(aiter(resp))


async def test_the_header_deadline_closes_the_connection(
    raw_server: Callable[[Script], Awaitable[RawServer]],
) -> None:
    rig = _rig(first_byte_timeout_s=1.0)
    received, gone = asyncio.Event(), asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        received.set()
        assert await reader.read() == b""  # never answers; sees berth give up
        gone.set()

    srv = await raw_server(script)
    call = asyncio.ensure_future(rig.call(srv.url))
    await received.wait()  # the call is written and waits for the headers
    rig.clock.advance(1.0)
    rig.deadlines.sweep()
    with pytest.raises(BerthError) as ei:
        await call
    assert ei.value.status == 504
    await gone.wait()
    await rig.pool.wait_lost(1)
    rig.pool.close()


# ----------------------------------------------------------------- limits


async def test_callers_wait_for_a_free_connection_in_arrival_order(
    aio_server: Callable[[Handler], Awaitable[Served]],
) -> None:
    rig = _rig(pool_per_host=1, pool_total=1)
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        if request.headers["X-Request-Id"] == "b0":
            arrived.set()
            await release.wait()
        return web.Response(body=request.headers["X-Request-Id"].encode())

    srv = await aio_server(handler)

    async def one(rid: str) -> bytes:
        resp = await rig.call(srv.url, rid=rid)
        try:
            return await resp.read()
        finally:
            resp.close()

    first = asyncio.ensure_future(one("b0"))
    await arrived.wait()
    later = [asyncio.ensure_future(one(f"b{i}")) for i in (1, 2, 3)]
    while len(rig.pool._waiters) < 3:
        await asyncio.sleep(0)  # a loop turn: until all three wait
    assert pool_counts(None, rig.pool) == (1, 0)
    release.set()
    assert await asyncio.gather(first, *later) == [b"b0", b"b1", b"b2", b"b3"]
    assert [r.headers["X-Request-Id"] for r in srv.requests] == ["b0", "b1", "b2", "b3"]
    assert srv.connections == 1
    rig.pool.close()


async def test_no_free_connection_within_the_connect_timeout_is_a_503_naming_the_limit(
    aio_server: Callable[[Handler], Awaitable[Served]],
) -> None:
    rig = _rig(pool_per_host=1, pool_total=4, connect_timeout_s=0.05)
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.Response(body=b"ok")

    srv = await aio_server(handler)
    first = asyncio.ensure_future(rig.call(srv.url))
    await arrived.wait()
    with pytest.raises(BerthError) as ei:
        await rig.call(srv.url)
    # the engine was never asked: the gateway's own limit held the call (per host: another may have room)
    assert (ei.value.status, ei.value.code, ei.value.retryable) == (503, "upstream_pool_exhausted", True)
    assert "no free connection to the engine within 0.05s" in ei.value.message
    assert "upstream.pool_per_host = 1" in ei.value.message
    assert rig.pool._waiters == type(rig.pool._waiters)()  # the one that gave up left the queue
    release.set()
    resp = await first
    assert await resp.read() == b"ok"
    assert pool_counts(None, rig.pool) == (0, 1)
    rig.pool.close()


async def test_a_connection_closed_while_handed_to_a_waiter_is_not_used(
    aio_server: Callable[[Handler], Awaitable[Served]],
) -> None:
    rig = _rig(pool_per_host=1, pool_total=1)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=b"ok")

    srv = await aio_server(handler)
    assert await (await rig.call(srv.url)).read() == b"ok"
    host, port = srv.url.removeprefix("http://").split(":")
    conn = rig.pool.take(("http", host, int(port)))  # the pool's one connection, in use
    assert conn is not None
    second = asyncio.ensure_future(rig.call(srv.url, rid="b2"))
    while not rig.pool._waiters:
        await asyncio.sleep(0)  # a loop turn: until the call waits for a connection
    rig.pool.released(conn)  # handed over to the waiting call ...
    conn.close()  # ... and closed before that call goes on
    assert await (await second).read() == b"ok"
    assert srv.connections == 2
    rig.pool.close()


async def test_the_total_is_shared_by_closing_idle_connections_elsewhere(
    aio_server: Callable[[Handler], Awaitable[Served]],
) -> None:
    rig = _rig(pool_per_host=2, pool_total=1)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=b"ok")

    a, b = await aio_server(handler), await aio_server(handler)
    assert await (await rig.call(a.url)).read() == b"ok"
    assert pool_counts(None, rig.pool) == (0, 1)
    assert await (await rig.call(b.url)).read() == b"ok"  # a's idle connection made room
    assert pool_counts(None, rig.pool) == (0, 1)
    assert rig.pool.lost_conns == 1
    rig.pool.close()


# ----------------------------------------------------------------- flow control


async def test_a_slow_reader_pauses_the_socket_and_gets_every_byte(
    rig: Rig, raw_server: Callable[[Script], Awaitable[RawServer]]
) -> None:
    size = 16 * BODY_BUFFER_LIMIT
    payload = bytes(range(256)) * (size // 256)
    written = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(payload))
        await writer.drain()  # holds while berth does not read
        written.set()

    srv = await raw_server(script)
    resp = await rig.call(srv.url)
    while not resp._paused:
        await resp._wait()  # each arrival of body bytes, until the buffer passes the limit
    # paused: at most one socket read past the limit is buffered, the rest waits in the kernel
    assert BODY_BUFFER_LIMIT < resp.total_bytes < size
    assert not written.is_set()
    assert await resp.read() == payload
    await written.wait()
    assert pool_counts(None, rig.pool) == (0, 1)


# ----------------------------------------------------------------- uvloop (what berth serve runs on)


def test_the_client_on_uvloop() -> None:
    async def scenario() -> None:
        rig = _rig()

        async def handler(request: web.Request) -> web.StreamResponse:
            if request.headers["X-Request-Id"] == "big":
                return web.Response(body=b"z" * (4 * BODY_BUFFER_LIMIT))
            out = web.StreamResponse()
            out.enable_chunked_encoding()
            await out.prepare(request)
            for i in range(3):
                await out.write(b"%d" % i)
            await out.write_eof()
            return out

        app = web.Application()
        app.router.add_post(PATH, handler)
        srv = TestServer(app)
        await srv.start_server()
        url = str(srv.make_url("")).rstrip("/")
        try:
            resp = await rig.call(url)
            assert b"".join([c async for c in resp]) == b"012"
            assert await (await rig.call(url, rid="big")).read() == b"z" * (4 * BODY_BUFFER_LIMIT)
            assert pool_counts(None, rig.pool) == (0, 1)
        finally:
            rig.pool.close()
            await srv.close()

    uvloop.run(scenario())


def test_the_micro_benchmark_times_an_engine_call() -> None:
    """`overhead_micro --pieces engine_call`: calls this checkout's client against a real upstream."""
    out = overhead_micro.run_once(("engine_call",), 64, 4)
    assert set(out) == {"engine_call"}
    assert out["engine_call"] > 0


def test_the_micro_benchmark_times_a_streamed_chunk_both_ways() -> None:
    """`overhead_micro --pieces relay_iter,relay_deliver`: the relay's read and write per chunk."""
    out = overhead_micro.run_once(("relay_iter", "relay_deliver"), 400, 4)
    assert set(out) == {"relay_iter", "relay_deliver"}
    assert out["relay_iter"] > 0
    assert out["relay_deliver"] > 0
