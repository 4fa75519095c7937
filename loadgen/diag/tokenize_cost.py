"""What matching a request by its token ids costs berth per request (the precise prefix source).

Three parts, for prompts of 1,000, 8,000 and 32,000 tokens:
- `parse`: reading the tokenize answer in-process: the count alone (`tokenize_count`, what
  `prompt_tokens = "tokenize"` reads) against the count and the ids (`tokenize_ids`), and the
  prompt's berth keys (`token_chain`, 16-token blocks) from the ids;
- `call`: one whole `tokenize()` call over loopback HTTP (berth's own code path: aiohttp session,
  one engine connection kept alive) to an engine stand-in in another process that answers at once
  with a prepared body as vLLM shapes it (`{"count", "max_model_len", "tokens"}`): the round trip
  without the engine's own tokenizing, with and without reading the ids;
- `cpu`: berth's process CPU time per call during `call` (the gateway's cost; the stand-in's is
  not counted).
The engine's own tokenization (and its API server's request handling) comes on top of `call` in the
latency, not in berth's CPU.

    berth-loadgen diag tokenize-cost [--calls N]

Wall-clock figures: run on a quiet machine (`flock /tmp/berth-heavy.lock ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web

from gateway.core.blockhash import token_chain
from gateway.upstream.dialects import tokenize_count, tokenize_ids
from gateway.upstream.tokenize import TokenizeResult, tokenize

SIZES: Final = (1_000, 8_000, 32_000)


def answer(n: int) -> bytes:
    rng = random.Random(n)
    return orjson.dumps(
        {"count": n, "max_model_len": 131072, "tokens": [rng.randrange(150_000) for _ in range(n)]}
    )


def median_us(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def both(body: bytes) -> tuple[int, tuple[int, ...]]:
    return tokenize_count(body), tokenize_ids(body)


def parse_part(repeat: int) -> None:
    print("parse (in-process, median µs)")
    print(f"{'tokens':>8} {'count':>8} {'count+ids':>10} {'keys(16)':>9}")
    for n in SIZES:
        body = answer(n)
        ids = tokenize_ids(body)
        c = median_us(functools.partial(tokenize_count, body), repeat)
        ci = median_us(functools.partial(both, body), repeat)
        k = median_us(functools.partial(token_chain, ids, 16), repeat)
        print(f"{n:>8} {c:>8.1f} {ci:>10.1f} {k:>9.1f}")


def _serve(port_q: Any) -> None:
    bodies = {n: answer(n) for n in SIZES}

    async def handle(request: web.Request) -> web.Response:
        n = int(request.query["n"])
        await request.read()
        return web.Response(body=bodies[n], content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/tokenize", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


async def call_part(port: int, calls: int) -> None:
    print(f"call (loopback HTTP, {calls} sequential calls each; median µs wall, mean µs berth CPU)")
    print(f"{'tokens':>8} {'ids':>5} {'wall':>8} {'cpu':>8}")
    body = orjson.dumps({"model": "m", "prompt": "x", "add_special_tokens": True})
    async with aiohttp.ClientSession() as session:
        for n in SIZES:
            url = f"http://127.0.0.1:{port}/tokenize?n={n}"
            for ids in (False, True):
                for _ in range(20):  # warm the connection and the server
                    await tokenize(session, url, body, "w", 5.0, ids=ids)
                walls = []
                cpu0 = time.process_time()
                for i in range(calls):
                    t = time.perf_counter()
                    a = await tokenize(session, url, body, str(i), 5.0, ids=ids)
                    walls.append(time.perf_counter() - t)
                    assert a.result is TokenizeResult.OK
                cpu = (time.process_time() - cpu0) / calls
                print(f"{n:>8} {ids!s:>5} {statistics.median(walls) * 1e6:>8.0f} {cpu * 1e6:>8.0f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args(argv)
    parse_part(args.repeat)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    server = ctx.Process(target=_serve, args=(q,), daemon=True)
    server.start()
    try:
        port = q.get(timeout=30)
        asyncio.run(call_part(port, args.calls))
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
