"""The engine-call connection's framing (gateway.upstream.h1) without sockets: a response fed to the
protocol in pieces cut anywhere reads back whole, and the connection goes back to its owner only when
the answer ended with keep-alive."""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.h1 import BODY_BUFFER_LIMIT, BadResponse, EngineDropped, H1Connection, H1Response


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False
        self.reading = True

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading


class Owner:
    """The pool's side: which connections came back, which were lost."""

    def __init__(self) -> None:
        self.given_back: list[H1Connection] = []
        self.forgotten: list[H1Connection] = []

    def released(self, conn: H1Connection) -> None:
        self.given_back.append(conn)

    def lost(self, conn: H1Connection) -> None:
        self.forgotten.append(conn)


def _conn(loop: asyncio.AbstractEventLoop) -> tuple[H1Connection, FakeTransport, Owner]:
    owner = Owner()
    conn = H1Connection(owner, ("http", "e", 80), loop)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport, owner


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def _chunked(body: bytes, size: int) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out += b"%x\r\n%b\r\n" % (len(part), part)
    return out + b"0\r\n\r\n"


@given(
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
    chunk=st.one_of(st.none(), st.integers(min_value=1, max_value=700)),
    keep=st.booleans(),
)
def test_a_response_cut_anywhere_reads_back_whole(
    body: bytes, cuts: list[int], chunk: int | None, keep: bool
) -> None:
    async def run() -> None:
        conn, transport, owner = _conn(asyncio.get_running_loop())
        resp = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        framing = (
            b"Content-Length: %d\r\n" % len(body) if chunk is None else b"Transfer-Encoding: chunked\r\n"
        )
        close = b"" if keep else b"Connection: close\r\n"
        raw = b"HTTP/1.1 201 Created\r\n" + framing + close + b"\r\n"
        raw += body if chunk is None else _chunked(body, chunk)
        for piece in _pieces(raw, cuts):
            conn.data_received(piece)
        assert (resp.status, resp.reason) == (201, "Created")
        assert resp.is_eof()
        assert await resp.read() == body
        assert resp.total_bytes == len(body)
        assert owner.given_back == ([conn] if keep else [])
        assert transport.closing is not keep
        assert conn.usable() is keep

    asyncio.run(run())


def test_a_body_up_to_the_connection_end_and_an_interim_answer() -> None:
    async def run() -> None:
        conn, _, owner = _conn(asyncio.get_running_loop())
        resp = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        conn.data_received(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\npart one, ")
        assert (resp.status, resp.reason) == (200, "OK")
        conn.data_received(b"part two")
        assert not resp.is_eof()
        conn.connection_lost(None)
        assert await resp.read() == b"part one, part two"
        assert owner.forgotten == [conn]
        assert owner.given_back == []

    asyncio.run(run())


@pytest.mark.parametrize(
    ("pieces", "error"),
    [
        pytest.param([b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"], EngineDropped, id="cut-body"),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"], EngineDropped, id="cut-chunk"
        ),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], BadResponse, id="bad-chunk"
        ),
    ],
)
def test_a_body_that_cannot_end_fails_its_reader(pieces: list[bytes], error: type[Exception]) -> None:
    async def run() -> None:
        conn, transport, _ = _conn(asyncio.get_running_loop())
        resp = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        for p in pieces:
            conn.data_received(p)
        if not transport.closing:
            conn.connection_lost(None)
        with pytest.raises(error):
            await resp.read()

    asyncio.run(run())


def test_a_second_answer_to_one_request_closes_the_connection() -> None:
    async def run() -> None:
        conn, transport, owner = _conn(asyncio.get_running_loop())
        resp = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        one = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        conn.data_received(one + one)
        assert await resp.read() == b"ok"  # the first answer is whole and stands
        assert transport.closing
        assert owner.given_back == []

    asyncio.run(run())


# ----------------------------------------------------------------- deliver: the body handed to a sink


def _streaming(loop: asyncio.AbstractEventLoop) -> tuple[H1Connection, FakeTransport, H1Response]:
    conn, transport, _ = _conn(loop)
    resp = conn.send(b"POST / HTTP/1.1\r\n\r\n")
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    return conn, transport, resp


@given(
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
    chunk=st.integers(min_value=1, max_value=700),
    before=st.integers(min_value=0, max_value=4000),
)
def test_a_delivered_body_reaches_the_sink_whole_and_in_order(
    body: bytes, cuts: list[int], chunk: int, before: int
) -> None:
    async def run() -> None:
        conn, _, resp = _streaming(asyncio.get_running_loop())
        raw = _chunked(body, chunk)
        pieces = _pieces(raw, cuts)
        split = before % (len(pieces) + 1)
        for p in pieces[:split]:  # buffered before the sink is given: it gets them first
            conn.data_received(p)
        got: list[bytes] = []

        def sink(data: bytes) -> bool:
            got.append(data)
            return True

        delivering = asyncio.ensure_future(resp.deliver(sink))
        await asyncio.sleep(0)  # deliver has attached the sink
        for p in pieces[split:]:
            conn.data_received(p)
            assert not resp._chunks  # nothing waits unread while a sink takes the body
        assert await delivering is True
        assert b"".join(got) == body
        assert resp.total_bytes == len(body)

    asyncio.run(run())


def test_a_sink_that_stops_leaves_the_rest_to_read_and_the_socket_paused_past_the_limit() -> None:
    async def run() -> None:
        conn, transport, resp = _streaming(asyncio.get_running_loop())
        got: list[bytes] = []

        def sink(data: bytes) -> bool:
            got.append(data)
            return len(got) < 2  # the second chunk fills the client: stop

        delivering = asyncio.ensure_future(resp.deliver(sink))
        await asyncio.sleep(0)
        conn.data_received(b"1\r\na\r\n1\r\nb\r\n")
        assert await delivering is False
        big = b"x" * (BODY_BUFFER_LIMIT + 1)
        conn.data_received(b"%x\r\n%b\r\n" % (len(big), big))
        assert got == [b"a", b"b"]  # the sink was not called again
        assert not transport.is_reading()  # buffered past the limit: the engine's socket is paused

        def stop_at_once(data: bytes) -> bool:
            got.append(data)
            return False

        assert await resp.deliver(stop_at_once) is False  # what is buffered goes to the sink first
        assert transport.is_reading()
        conn.data_received(b"1\r\nc\r\n0\r\n\r\n")
        async for rest in resp:
            got.append(rest)
        assert got == [b"a", b"b", big, b"c"]

    asyncio.run(run())


def test_what_a_sink_raises_and_a_dropped_engine_are_raised_by_deliver() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        conn, _, resp = _streaming(loop)

        def failing(data: bytes) -> bool:
            raise ConnectionResetError("the client left")

        delivering = asyncio.ensure_future(resp.deliver(failing))
        await asyncio.sleep(0)
        conn.data_received(b"1\r\na\r\n")  # the connection's callback does not see the error
        with pytest.raises(ConnectionResetError):
            await delivering

        conn, _, resp = _streaming(loop)
        delivering = asyncio.ensure_future(resp.deliver(lambda data: True))
        await asyncio.sleep(0)
        conn.connection_lost(None)
        with pytest.raises(EngineDropped):
            await delivering

    asyncio.run(run())


def test_a_cancelled_delivery_detaches_its_sink() -> None:
    async def run() -> None:
        conn, _, resp = _streaming(asyncio.get_running_loop())
        got: list[bytes] = []

        def sink(data: bytes) -> bool:
            got.append(data)
            return True

        delivering = asyncio.ensure_future(resp.deliver(sink))
        await asyncio.sleep(0)
        delivering.cancel()
        with pytest.raises(asyncio.CancelledError):
            await delivering
        conn.data_received(b"1\r\na\r\n")
        assert got == []  # a preempted or abandoned relay is given nothing more
        assert await resp.read(1) == b"a"

    asyncio.run(run())


class NullOwner:
    """A pool that keeps nothing (the real one outlives its connections)."""

    def released(self, conn: H1Connection) -> None:
        pass

    def lost(self, conn: H1Connection) -> None:
        pass


class OwningTransport(FakeTransport):
    """A transport that holds its protocol, as uvloop's and asyncio's do."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol = protocol


def test_a_lost_connection_leaves_no_cycle_for_the_collector() -> None:
    # Reference counting alone frees it (the parser's bound callbacks and the transport's hold on the
    # protocol are let go): with the collector saving what it finds, it finds none of the connection.
    loop = asyncio.new_event_loop()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        conn = H1Connection(NullOwner(), ("http", "e", 80), loop)
        conn.connection_made(OwningTransport(conn))
        resp = conn.send(b"GET / HTTP/1.1\r\n\r\n")
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        conn.connection_lost(None)
        del conn, resp
        gc.collect()
        found = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        loop.close()
    assert "H1Connection" not in found
    assert "OwningTransport" not in found
