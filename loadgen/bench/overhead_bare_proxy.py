"""The floor for a Python proxy: aiohttp server + one ClientSession on uvloop, bytes passed through.

No parsing, no scheduling, no metrics: the request body goes up as it came, a JSON answer comes back
as bytes, and a stream is relayed chunk by chunk with `StreamResponse.write` as it arrives. Whatever
berth costs above this is the price of what berth does.

    python -m loadgen.bench.overhead_bare_proxy --port 9002 --upstream http://127.0.0.1:9001
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def relay(request: web.Request) -> web.StreamResponse:
    session, upstream = request.app[SESSION], request.app[UPSTREAM]
    body = await request.read()
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    async with session.request(request.method, upstream + request.path_qs, data=body, headers=headers) as up:
        content_type = up.headers.get("Content-Type", "application/octet-stream")
        if up.content_type == "text/event-stream":
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": content_type})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        return web.Response(status=up.status, body=await up.read(), headers={"Content-Type": content_type})


def build_app(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=1024)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            app[SESSION] = session
            yield

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9001")
    args = p.parse_args(argv)
    web.run_app(
        build_app(args.upstream),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
