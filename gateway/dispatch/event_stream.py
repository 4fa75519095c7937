"""The client's side of a streamed answer: an event stream whose headers leave with its first event, and
whose events are written without an await.

A plain `StreamResponse` writes its headers as it is prepared, and the first event follows in a second
write: two writes, two packets, and two wake-ups of the client for one event. When the engine's first
bytes are already here as the client's response is prepared (the usual case: an engine's headers and its
first event come together, and at a burst of streams every one of them pays this), the headers are held
and leave with the first event in one write. When nothing is here yet (a long prefill), they are sent at
once, as before: a client never waits longer for its headers.

After the headers, each event is a chunk of the chunked body. `StreamResponse.write` frames it through
two coroutines and checks for back-pressure every 64 KiB; `ChunkWriter.write` frames and writes it at
once, in the engine connection's callback (`H1Response.deliver`), and reports back-pressure with every
chunk: the relay stops taking the engine's bytes while the client's transport is over its high-water
mark, and waits (`drain`) as `StreamResponse.write` would.
"""

from __future__ import annotations

import asyncio

from aiohttp import ClientConnectionResetError, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_writer import StreamWriter


class ChunkWriter:
    """Writes chunks of a prepared, chunked, uncompressed response whose headers were sent, as aiohttp's
    `StreamWriter.write` does (the same bytes, the same `output_size`), with no await."""

    __slots__ = ("_protocol", "_transport", "_writer")

    def __init__(self, writer: StreamWriter, transport: asyncio.WriteTransport) -> None:
        self._writer = writer
        self._protocol = writer.protocol
        # The connection's one transport (aiohttp forgets it when the connection is lost; it is then
        # closing, which `write` checks as aiohttp's own write does).
        self._transport = transport

    def write(self, data: bytes) -> bool:
        """Write `data` (not empty) as one chunk; whether the client takes more now (False: its transport
        is over its high-water mark, `drain` before writing again). Raises ConnectionResetError if the
        client's connection is closing."""
        transport = self._transport
        if transport.is_closing():
            raise ClientConnectionResetError("Cannot write to closing transport")
        framed = b"%x\r\n%b\r\n" % (len(data), data)
        self._writer.output_size += len(framed)
        transport.write(framed)
        return not self._protocol.writing_paused

    async def drain(self) -> None:
        """Wait until the client's transport is below its low-water mark again."""
        await self._writer.drain()


class EventStreamResponse(web.StreamResponse):
    """A streamed response whose headers `prepare` keeps for the first write (aiohttp >= 3.12 does when
    this class attribute says so, as its own `web.Response` does); `send_headers` on the writer sends
    them alone. `direct`: its `ChunkWriter` once prepared by `open_event_stream` and its headers sent
    (None before, and if aiohttp's writer is not the plain chunked one it writes for).
    tests/unit/test_event_stream.py pins aiohttp's behaviour."""

    _send_headers_immediately = False
    direct: ChunkWriter | None = None
    _chunk_writer: ChunkWriter | None = None

    def headers_sent(self) -> ChunkWriter | None:
        """The held headers went out (with the first event, or alone): `direct` may write from now on."""
        self.direct = self._chunk_writer
        return self.direct


async def open_event_stream(
    out: EventStreamResponse, request: web.Request, first_bytes_here: bool
) -> AbstractStreamWriter | None:
    """Prepare `out`; its writer if the headers wait for the first write (`first_bytes_here`: the
    engine's first bytes arrived with its headers, so that write is imminent), None if they were sent.
    Whoever holds the writer sends the headers (`send_headers`) if what it writes first is nothing, and
    says when they went (`out.headers_sent()`); `out.direct` is set then (at once if they were sent here)."""
    writer = await out.prepare(request)
    if writer is None:
        return None
    if type(writer) is StreamWriter and writer.chunked and writer.length is None and not out.compression:
        transport = writer.transport
        if transport is not None:
            out._chunk_writer = ChunkWriter(writer, transport)
    if first_bytes_here:
        return writer
    writer.send_headers()
    out.headers_sent()
    return None
