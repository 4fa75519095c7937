"""A client's event stream: its headers leave with the first event when that event is at hand, and at
once when it is not. Pins what berth relies on in aiohttp (a response class can hold its headers for the
first write; the writer's `send_headers` sends them alone) on a real StreamWriter over a transport
that records every write."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http import StreamWriter
from aiohttp.test_utils import make_mocked_request

from gateway.dispatch.event_stream import EventStreamResponse, open_event_stream

EVENT = b'data: {"choices":[]}\n\n'


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.writes.append(b"".join(bytes(d) for d in list_of_data))

    def is_closing(self) -> bool:
        return self.closing


def _request(transport: _Transport) -> web.Request:
    protocol = BaseProtocol(asyncio.get_running_loop())
    protocol.connection_made(transport)
    writer = StreamWriter(protocol, asyncio.get_running_loop())
    return make_mocked_request("POST", "/v1/chat/completions", writer=writer, transport=transport)


def _response() -> EventStreamResponse:
    out = EventStreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    out.enable_chunked_encoding()
    return out


async def test_headers_and_the_first_event_leave_in_one_write() -> None:
    transport = _Transport()
    out = _response()
    held = await open_event_stream(out, _request(transport), first_bytes_here=True)
    assert held is not None
    assert transport.writes == []  # prepared, nothing written: the headers wait for the event
    await out.write(EVENT)
    await out.write(EVENT)
    head, second = transport.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\n\r\n" + f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n" in head
    assert second == f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n"


async def test_headers_leave_at_once_when_no_event_is_at_hand() -> None:
    transport = _Transport()
    out = _response()
    assert await open_event_stream(out, _request(transport), first_bytes_here=False) is None
    (head,) = transport.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert head.endswith(b"\r\n\r\n")


async def test_held_headers_are_sent_on_demand_and_once() -> None:
    transport = _Transport()
    out = _response()
    held = await open_event_stream(out, _request(transport), first_bytes_here=True)
    assert held is not None
    held.send_headers()  # what came first forwarded nothing: the client gets its headers now
    held.send_headers()
    await out.write(EVENT)
    head, event = transport.writes
    assert head.endswith(b"\r\n\r\n")
    assert event == f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n"


async def test_held_headers_leave_with_the_end_of_an_empty_stream() -> None:
    transport = _Transport()
    out = _response()
    await open_event_stream(out, _request(transport), first_bytes_here=True)
    await out.write_eof()
    (only,) = transport.writes
    assert only.startswith(b"HTTP/1.1 200 OK\r\n")
    assert only.endswith(b"\r\n\r\n0\r\n\r\n")


# ----------------------------------------------------------------- ChunkWriter: events written with no await


def _pair() -> tuple[_Transport, web.Request, _Transport, web.Request]:
    a, b = _Transport(), _Transport()
    return a, _request(a), b, _request(b)


@pytest.mark.parametrize("events", [[EVENT], [EVENT, b"x", EVENT * 300]], ids=["one", "sizes"])
async def test_a_direct_write_is_what_aiohttp_writes(events: list[bytes]) -> None:
    by_aiohttp, req_a, direct_t, req_b = _pair()
    a, b = _response(), _response()
    await open_event_stream(a, req_a, first_bytes_here=False)
    await open_event_stream(b, req_b, first_bytes_here=False)
    assert b.direct is not None
    for e in events:
        await a.write(e)
        assert b.direct.write(e) is True
    await a.write_eof()
    await b.write_eof()
    assert direct_t.writes == by_aiohttp.writes  # headers, each framed chunk, the end
    writer_a, writer_b = req_a._payload_writer, req_b._payload_writer
    assert writer_a is not None
    assert writer_b is not None
    assert writer_b.output_size == writer_a.output_size


async def test_a_direct_write_reports_a_full_client_and_drains_as_aiohttp_does() -> None:
    transport = _Transport()
    request = _request(transport)
    out = _response()
    await open_event_stream(out, request, first_bytes_here=False)
    direct = out.direct
    assert direct is not None
    writer = request._payload_writer
    assert isinstance(writer, StreamWriter)
    protocol = writer.protocol
    protocol.pause_writing()  # the client's transport passed its high-water mark
    assert direct.write(EVENT) is False
    drained = asyncio.ensure_future(direct.drain())
    await asyncio.sleep(0)  # one loop turn: the drain waits for the client
    assert not drained.done()
    protocol.resume_writing()
    await drained
    assert direct.write(EVENT) is True


async def test_a_direct_write_to_a_closing_client_is_a_reset() -> None:
    transport = _Transport()
    out = _response()
    await open_event_stream(out, _request(transport), first_bytes_here=False)
    assert out.direct is not None
    transport.closing = True
    with pytest.raises(ConnectionResetError):
        out.direct.write(EVENT)


async def test_no_direct_writer_for_a_compressed_stream() -> None:
    transport = _Transport()
    out = _response()
    out.enable_compression()
    request = make_mocked_request(
        "POST",
        "/v1/chat/completions",
        headers={"Accept-Encoding": "gzip"},
        writer=_request(transport)._payload_writer,
        transport=transport,
    )
    await open_event_stream(out, request, first_bytes_here=False)
    assert out.direct is None  # aiohttp's own write compresses


async def test_held_headers_keep_the_direct_writer_back_until_they_are_sent() -> None:
    transport = _Transport()
    out = _response()
    held = await open_event_stream(out, _request(transport), first_bytes_here=True)
    assert held is not None
    before = out.direct
    assert before is None  # a direct write now would go out before the headers
    await out.write(EVENT)  # the headers leave with the first event
    direct = out.headers_sent()
    assert direct is not None
    assert out.direct is direct
    assert direct.write(EVENT) is True
    head, event = transport.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert event == f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n"
