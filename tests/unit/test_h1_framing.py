"""The engine-call connection's framing (gateway.upstream.h1) without sockets: a response fed to the
protocol in pieces cut anywhere reads back whole, and the connection goes back to its owner only when
the answer ended with keep-alive."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.h1 import BadResponse, EngineDropped, H1Connection


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
