"""The scrapers' GETs (gateway.upstream.fetch.Fetcher) against raw asyncio servers on loopback: the
request berth writes, keep-alive reuse, the body limit, the one retry of a GET dropped before its answer
and none mid-answer, garbage, and a call cut short. Nothing sleeps: tests await the server's events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from gateway import __version__
from gateway.core.clock import FakeClock
from gateway.upstream.client import UpstreamSettings, make_fetcher, pool_counts
from gateway.upstream.fetch import Fetcher, FetchFailed

Script = Callable[["Conn", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Conn:
    """One connection the server accepted: the request heads it read."""

    heads: list[bytes] = field(default_factory=list)

    async def request(self, reader: asyncio.StreamReader) -> bool:
        """Read one request head; False when the client closed the connection instead."""
        try:
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
        except asyncio.IncompleteReadError:
            return False
        return True


@dataclass
class Server:
    url: str
    conns: list[Conn] = field(default_factory=list)
    closed: asyncio.Queue[None] = field(default_factory=asyncio.Queue)  # one item per connection ended
    asked: asyncio.Event = field(default_factory=asyncio.Event)  # a request head was read

    @property
    def heads(self) -> list[bytes]:
        return [h for c in self.conns for h in c.heads]


@pytest.fixture
async def server() -> AsyncIterator[Callable[[Script], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> Server:
        srv: Server

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = Conn()
            srv.conns.append(conn)
            try:
                await script(conn, reader, writer)
            finally:
                writer.close()
                srv.closed.put_nowait(None)

        raw = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(raw)
        srv = Server(f"http://127.0.0.1:{raw.sockets[0].getsockname()[1]}")
        return srv

    yield start
    for s in servers:
        s.close()


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    f = make_fetcher(UpstreamSettings(connect_timeout_s=5.0), FakeClock())
    yield f
    f.pool.close()


def answer(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %b\r\nContent-Length: %d\r\n\r\n%b" % (status, len(body), body)


def serving(*bodies: bytes) -> Script:
    """A server that answers each request of a connection with the next body (keep-alive)."""

    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for body in bodies:
            if not await conn.request(reader):
                return
            writer.write(answer(body))
            await writer.drain()
        await reader.read()  # until the client closes

    return script


async def test_the_request_berth_writes_and_the_answer(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    srv = await server(serving(b"page"))
    status, body = await fetcher.get(srv.url + "/metrics", {"Accept": "text/plain;version=0.0.4"}, 100)
    assert (status, body) == (200, b"page")
    assert srv.heads == [
        b"GET /metrics HTTP/1.1\r\n"
        + f"Host: {srv.url.removeprefix('http://')}\r\nUser-Agent: berth/{__version__}\r\n".encode()
        + b"Accept: text/plain;version=0.0.4\r\n\r\n"
    ]


@pytest.mark.parametrize(
    ("headers", "authorization"),
    [
        pytest.param({}, b"Authorization: Basic dXNlcjpwYXNz\r\n", id="url-credentials"),
        pytest.param({"Authorization": "Bearer k"}, b"Authorization: Bearer k\r\n", id="endpoint-key-wins"),
    ],
)
async def test_credentials(
    fetcher: Fetcher,
    server: Callable[[Script], Awaitable[Server]],
    headers: dict[str, str],
    authorization: bytes,
) -> None:
    srv = await server(serving(b"ok"))
    url = srv.url.replace("http://", "http://user:pass@") + "/health"
    assert await fetcher.get(url, headers, 100) == (200, b"ok")
    (head,) = srv.heads
    assert head.count(b"Authorization") == 1
    assert authorization in head
    assert b"user:pass" not in head


async def test_a_newline_in_a_header_is_refused_before_anything_is_sent(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    srv = await server(serving(b"ok"))
    with pytest.raises(FetchFailed, match="newline"):
        await fetcher.get(srv.url + "/health", {"Authorization": "Bearer k\r\nX-Evil: 1"}, 100)
    assert srv.conns == []


async def test_a_kept_alive_connection_is_reused(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    srv = await server(serving(b"one", b"two", b"three"))
    for body in (b"one", b"two", b"three"):
        assert await fetcher.get(srv.url + "/health", {}, 100) == (200, body)
    assert len(srv.conns) == 1
    assert pool_counts(None, fetcher.pool) == (0, 1)


async def test_a_status_other_than_200_is_an_answer(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await conn.request(reader)
        writer.write(answer(b"no", b"401 Unauthorized"))
        await reader.read()

    srv = await server(script)
    assert await fetcher.get(srv.url + "/health", {}, 100) == (401, b"no")


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_over_the_limit_fails_and_closes_the_connection(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]], chunked: bool
) -> None:
    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await conn.request(reader)
        if chunked:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(3):
                writer.write(b"40\r\n" + b"x" * 64 + b"\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 192)
        await reader.read()  # the rest never comes: until berth closes the connection

    srv = await server(script)
    with pytest.raises(FetchFailed, match="exceeds 100 bytes"):
        await fetcher.get(srv.url + "/metrics", {}, 100)
    await srv.closed.get()  # berth closed it (the server's read ended)
    assert pool_counts(None, fetcher.pool) == (0, 0)


async def test_a_whole_answer_over_the_limit_fails_and_its_connection_stays(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    srv = await server(serving(b"x" * 192, b"ok"))
    with pytest.raises(FetchFailed, match="exceeds 100 bytes"):
        await fetcher.get(srv.url + "/metrics", {}, 100)
    assert await fetcher.get(srv.url + "/health", {}, 100) == (200, b"ok")
    assert len(srv.conns) == 1  # received whole: the connection was fit for the next request


async def test_a_stale_kept_alive_connection_is_retried_once_on_a_new_one(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(srv.conns) == 1:  # the first connection answers once, then drops the next request unanswered
            await conn.request(reader)
            writer.write(answer(b"first"))
            await writer.drain()
            await conn.request(reader)
            return
        await serving(b"again")(conn, reader, writer)

    srv = await server(script)
    assert await fetcher.get(srv.url + "/health", {}, 100) == (200, b"first")
    assert await fetcher.get(srv.url + "/health", {}, 100) == (200, b"again")
    assert [len(c.heads) for c in srv.conns] == [2, 1]


@pytest.mark.parametrize(
    ("mid_answer", "connections"), [(False, 2), (True, 1)], ids=["before-the-answer", "mid-answer"]
)
async def test_a_drop_before_the_answer_is_retried_once_and_mid_answer_not_at_all(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]], mid_answer: bool, connections: int
) -> None:
    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await conn.request(reader)
        if mid_answer:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()

    srv = await server(script)
    with pytest.raises(FetchFailed, match="closed the connection"):
        await fetcher.get(srv.url + "/health", {}, 100)
    assert len(srv.conns) == connections
    assert pool_counts(None, fetcher.pool) == (0, 0)


async def test_a_kept_alive_connection_dropped_mid_answer_is_not_retried(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await conn.request(reader)
        writer.write(answer(b"first"))
        await conn.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()

    srv = await server(script)
    assert await fetcher.get(srv.url + "/health", {}, 100) == (200, b"first")
    with pytest.raises(FetchFailed, match="mid-answer"):
        await fetcher.get(srv.url + "/health", {}, 100)
    assert len(srv.conns) == 1


async def test_garbage_is_a_failure(fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]) -> None:
    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await conn.request(reader)
        writer.write(b"this is not http\r\n\r\n")
        await reader.read()

    srv = await server(script)
    with pytest.raises(FetchFailed, match="invalid HTTP response"):
        await fetcher.get(srv.url + "/health", {}, 100)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/health", "http:///health", "http://[::1/health"])
async def test_a_url_that_is_not_http_is_a_failure(fetcher: Fetcher, url: str) -> None:
    with pytest.raises(FetchFailed):
        await fetcher.get(url, {}, 100)


async def test_a_refused_connection_is_an_os_error(fetcher: Fetcher) -> None:
    raw = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = raw.sockets[0].getsockname()[1]
    raw.close()
    await raw.wait_closed()
    with pytest.raises(OSError):  # noqa: PT011 - what the connect raised (ConnectionRefusedError)
        await fetcher.get(f"http://127.0.0.1:{port}/health", {}, 100)
    assert pool_counts(None, fetcher.pool) == (0, 0)


async def test_a_call_cut_short_closes_its_connection(
    fetcher: Fetcher, server: Callable[[Script], Awaitable[Server]]
) -> None:
    async def script(conn: Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await conn.request(reader)
        srv.asked.set()
        await reader.read()  # never answers; returns when berth closes the connection

    srv = await server(script)
    call = asyncio.get_running_loop().create_task(fetcher.get(srv.url + "/health", {}, 100))
    await srv.asked.wait()
    call.cancel()  # what the scraper's timeout does
    with pytest.raises(asyncio.CancelledError):
        await call
    await srv.closed.get()  # the server saw the connection close
    assert pool_counts(None, fetcher.pool) == (0, 0)
