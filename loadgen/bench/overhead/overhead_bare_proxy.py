"""The floor for a Python proxy: what the peer harness (`../shared/perf-peers`) calls the aiohttp reference.

An aiohttp server and one keep-alive ClientSession on uvloop, round robin over the `--upstream` URLs.
It reads the JSON body (as any gateway must, to learn whether the client wants a stream), sends the
body up as it came, and passes the answer back: a whole body as bytes, a stream chunk by chunk with
`StreamResponse.write` as it arrives. No scheduling, no metrics, no validation: whatever berth costs
above this is the price of what berth does.

One addition, which the harness's copy does not have: berth's own event-loop lag monitor
(`gateway.core.looplag`: the same timer, interval and clock) and berth's `GET /admin/loop-lag`, so the
benchmark reads the floor's lag beside berth's the same way (ten timers a second: no measurable cost).

    python -m loadgen.bench.overhead.overhead_bare_proxy --port 9002 \\
        --upstream http://127.0.0.1:9001 [--upstream ...]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import AsyncIterator
from typing import Final

import aiohttp
import orjson
import uvloop
from aiohttp import web

from gateway.core.looplag import LAG_INTERVAL_S, RecentLag, watch_lag
from gateway.core.tasks import TaskSupervisor


class RoundRobin:
    def __init__(self, urls: list[str]) -> None:
        self._urls = itertools.cycle([u.rstrip("/") for u in urls])

    def next(self) -> str:
        return next(self._urls)


SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAMS = web.AppKey("upstreams", RoundRobin)
LAG = web.AppKey("lag", RecentLag)
#: berth's path for the same document (gateway.front.admin.LOOP_LAG_PATH).
LOOP_LAG_PATH: Final = "/admin/loop-lag"
#: Response headers that describe the upstream connection, not the answer: never passed on.
HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}
)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    stream = False
    if body and request.method == "POST":
        parsed = orjson.loads(body)
        stream = isinstance(parsed, dict) and bool(parsed.get("stream"))
    url = request.app[UPSTREAMS].next() + request.path_qs
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    async with request.app[SESSION].request(request.method, url, data=body or None, headers=headers) as up:
        out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
        if not stream:
            return web.Response(status=up.status, body=await up.read(), headers=out_headers)
        resp = web.StreamResponse(status=up.status, headers=out_headers)
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def loop_lag(request: web.Request) -> web.Response:
    after = int(request.query.get("after", "0"))
    return web.Response(body=orjson.dumps(request.app[LAG].document(after)), content_type="application/json")


def build_app(upstreams: list[str], lag_interval_s: float = LAG_INTERVAL_S) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[UPSTREAMS] = RoundRobin(upstreams)
    app[LAG] = RecentLag(interval_s=lag_interval_s)

    async def lag_ctx(app: web.Application) -> AsyncIterator[None]:
        tasks = TaskSupervisor()
        tasks.spawn("loop-lag", lambda: watch_lag(app[LAG], lag_interval_s))
        yield
        await tasks.close()

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=120)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
        ) as session:
            app[SESSION] = session
            yield

    app.cleanup_ctx.append(session_ctx)
    app.cleanup_ctx.append(lag_ctx)
    app.router.add_get(LOOP_LAG_PATH, loop_lag)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument(
        "--upstream", action="append", required=True, help="base URL, e.g. http://127.0.0.1:9001; repeatable"
    )
    p.add_argument(
        "--lag-interval-s",
        type=float,
        default=LAG_INTERVAL_S,
        help="seconds between lag samples (as berth's)",
    )
    args = p.parse_args(argv)
    web.run_app(
        build_app(args.upstream, args.lag_interval_s),
        host=args.host,
        port=args.port,
        access_log=None,
        backlog=4096,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
