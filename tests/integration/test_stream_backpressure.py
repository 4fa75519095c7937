"""A streamed answer's back-pressure through berth: a client that does not read makes berth stop reading
the engine (so neither berth's memory nor the engine's output runs ahead of the client), and once it
reads, every byte arrives in order. berth relays a stream's chunks in the engine connection's callback
(`H1Response.deliver`) and writes them with no await (`ChunkWriter`): this pins that a full client still
stops it."""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

import orjson
import pytest

from gateway.upstream.h1 import H1Connection
from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine

TOKENS = 2000
PAD = 16 * 1024  # 32 MB in all: more than every socket buffer between the engine and the client


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        eol = body.index(b"\r\n", pos)
        size = int(body[pos:eol], 16)
        if size == 0:
            return bytes(out)
        out += body[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


async def test_a_client_that_does_not_read_stops_berth_reading_the_engine(
    engine_server: EngineServer, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = FakeEngine(tokens=TOKENS, token_pad=PAD)
    gw = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    paused = asyncio.Event()
    pause_reading = H1Connection.pause_reading

    def spy(conn: H1Connection) -> None:
        paused.set()
        pause_reading(conn)

    monkeypatch.setattr(H1Connection, "pause_reading", spy)
    url = urlsplit(gw.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # a small window: the client fills fast
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (url.hostname, url.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    body = orjson.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: berth\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    try:
        waits = [asyncio.ensure_future(paused.wait()), asyncio.ensure_future(eng.ended.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        # The client read nothing: berth stopped taking the engine's bytes before the engine was done.
        assert paused.is_set()
        assert not eng.ended.is_set()

        got = bytearray()
        while not got.endswith(b"\r\n0\r\n\r\n"):
            piece = await reader.read(1 << 16)
            assert piece, "berth closed the connection before the stream's end"
            got += piece
        await eng.ended.wait()
    finally:
        writer.close()
    head, _, chunked = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    events = _dechunk(chunked).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    content = [orjson.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:-2]]
    assert content == [f" t{i}".ljust(PAD, "x") for i in range(TOKENS)]
