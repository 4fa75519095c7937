"""The I/O pieces of `overhead_micro` (`engine_call`, `relay_iter`, `relay_deliver`): what each measures is in
that module's docstring."""

from __future__ import annotations

import gc
import time
from typing import Any, Final

import orjson

ENGINE_CALLS_AT_ONCE: Final = 16


def bench_engine_call(n: int) -> float:
    """CPU ns per engine call of this thread (see `engine_call` above)."""
    import asyncio
    import threading

    import uvloop
    from aiohttp import web

    from gateway.core.clock import SystemClock
    from gateway.upstream import client
    from gateway.upstream.deadlines import Deadlines
    from loadgen.bench.overhead.overhead_upstream import build_app

    started = threading.Event()
    upstream: dict[str, Any] = {}

    async def serve() -> None:
        runner = web.AppRunner(build_app(0.0), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        upstream["port"] = runner.addresses[0][1]
        upstream["stop"] = stop = asyncio.Event()
        upstream["loop"] = asyncio.get_running_loop()
        started.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=uvloop.run, args=(serve(),), daemon=True)
    thread.start()
    started.wait()
    url = f"http://127.0.0.1:{upstream['port']}/v1/chat/completions"
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})

    async def calls() -> float:
        settings = client.UpstreamSettings()
        clock = SystemClock()
        deadlines = Deadlines(clock)
        # The checkout's engine-call client: its pool (berth's own client) or aiohttp's session (before).
        make_pool = getattr(client, "make_pool", None)
        target: Any = make_pool(settings, clock) if make_pool else client.make_session(settings)

        async def worker(first: int, count: int) -> None:
            for i in range(first, first + count):
                resp = await client.open_request(target, url, body, f"b{i}", settings, deadlines=deadlines)
                await resp.read()
                resp.close()

        async def run(total: int) -> None:
            each = total // ENGINE_CALLS_AT_ONCE
            await asyncio.gather(*(worker(k * each, each) for k in range(ENGINE_CALLS_AT_ONCE)))

        try:
            await run(ENGINE_CALLS_AT_ONCE * 20)  # warm-up: the connections made
            gc.collect()
            t0 = time.thread_time_ns()
            await run(n)
            return (time.thread_time_ns() - t0) / (n // ENGINE_CALLS_AT_ONCE * ENGINE_CALLS_AT_ONCE)
        finally:
            if make_pool is None:
                await target.close()
            else:
                target.close()

    try:
        return uvloop.run(calls())
    finally:
        upstream["loop"].call_soon_threadsafe(upstream["stop"].set)
        thread.join()


def bench_relay(n: int, *, deliver: bool) -> float:
    """CPU ns per streamed chunk of this thread (see `relay_iter` / `relay_deliver` above)."""
    import asyncio

    import uvloop
    from aiohttp.base_protocol import BaseProtocol
    from aiohttp.http import StreamWriter
    from aiohttp.test_utils import make_mocked_request

    from gateway.dispatch.event_stream import EventStreamResponse, open_event_stream
    from gateway.upstream.h1 import H1Connection, H1Response
    from loadgen.bench.overhead.overhead_upstream import stream_events

    class Counting(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.written = 0

        def write(self, data: Any) -> None:
            self.written += len(data)

        def writelines(self, list_of_data: Any) -> None:
            self.written += sum(len(d) for d in list_of_data)

        def is_closing(self) -> bool:
            return False

        def close(self) -> None:
            pass

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    class Owner:
        def released(self, conn: H1Connection) -> None:
            pass

        def lost(self, conn: H1Connection) -> None:
            pass

    frames = [b"%x\r\n%b\r\n" % (len(e), e) for e in stream_events(True, 200, False)]
    frames.append(b"0\r\n\r\n")

    async def stream(loop: asyncio.AbstractEventLoop) -> None:
        transport = Counting()
        protocol = BaseProtocol(loop)
        protocol.connection_made(transport)
        writer = StreamWriter(protocol, loop)
        request = make_mocked_request("POST", "/v1/chat/completions", writer=writer, transport=transport)
        out = EventStreamResponse(status=200)
        out.enable_chunked_encoding()
        await open_event_stream(out, request, first_bytes_here=False)
        conn = H1Connection(Owner(), ("http", "engine", 80), loop)
        conn.connection_made(Counting())
        resp: H1Response = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        pending = iter(frames)

        def arrive() -> None:  # one chunk per loop callback, as the socket's reads bring them
            frame = next(pending, None)
            if frame is not None:
                conn.data_received(frame)
                loop.call_soon(arrive)

        loop.call_soon(arrive)
        direct = out.direct
        if deliver and direct is not None:
            while not await resp.deliver(direct.write):
                await direct.drain()
        else:
            async for chunk in resp:
                await out.write(chunk)

    async def run() -> float:
        loop = asyncio.get_running_loop()
        streams = max(1, n // 200)
        await stream(loop)  # warm-up
        gc.collect()
        t0 = time.thread_time_ns()
        for _ in range(streams):
            await stream(loop)
        return (time.thread_time_ns() - t0) / (streams * 200)

    return uvloop.run(run())
