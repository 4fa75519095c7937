"""The client's side of a streamed answer: an event stream whose headers leave with its first event.

A plain `StreamResponse` writes its headers as it is prepared, and the first event follows in a second
write: two writes, two packets, and two wake-ups of the client for one event. When the engine's first
bytes are already here as the client's response is prepared (the usual case: an engine's headers and its
first event come together, and at a burst of streams every one of them pays this), the headers are held
and leave with the first event in one write. When nothing is here yet (a long prefill), they are sent at
once, as before: a client never waits longer for its headers.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter


class EventStreamResponse(web.StreamResponse):
    """A streamed response whose headers `prepare` keeps for the first write (aiohttp >= 3.12 does when
    this class attribute says so, as its own `web.Response` does); `send_headers` on the writer sends
    them alone. tests/unit/test_event_stream.py pins aiohttp's behaviour."""

    _send_headers_immediately = False


async def open_event_stream(
    out: EventStreamResponse, request: web.Request, first_bytes_here: bool
) -> AbstractStreamWriter | None:
    """Prepare `out`; its writer if the headers wait for the first write (`first_bytes_here`: the
    engine's first bytes arrived with its headers, so that write is imminent), None if they were sent.
    Whoever holds the writer sends the headers (`send_headers`) if what it writes first is nothing."""
    writer = await out.prepare(request)
    if writer is None:
        return None
    if first_bytes_here:
        return writer
    writer.send_headers()
    return None
