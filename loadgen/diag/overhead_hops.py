"""What berth adds to the event loop per request: tasks, futures, timers, callbacks and task wake-ups,
counted against the bare aiohttp proxy's.

    berth-loadgen diag overhead-hops                                  # this checkout
    berth-loadgen diag overhead-hops --tree main=OTHER_CHECKOUT --tree new=.

In one process per checkout: the proxy under test (the bare proxy, `overhead_bare_proxy`, then berth as
`berth serve --endpoint UP1 --endpoint UP2 --log-level warning` builds it) runs on a counting asyncio
loop in the main thread; the stand-in upstream (`overhead_upstream`, two ports) and a client run on a
loop of their own in another thread, so only the proxy's loop is counted. The client sends
`--requests` non-streamed requests one at a time, then `--streams` streamed ones of `--chunks` chunks
(paced by the upstream, one chunk per read, as a real engine's tokens), after a warm-up of each.

Counted while the client runs (the proxy's background work included: it shows under its own sites):
- `task`: tasks made (`loop.create_task`, or `asyncio.Task(...)` on the loop), by coroutine;
- `future`: `loop.create_future()` (asyncio.Event, Queue and sleep make theirs so), by caller;
- `timer`: `loop.call_at`/`call_later` (aiohttp's read timeouts, `asyncio.timeout`, sleeps), by caller;
- `wakeup`: a task resumed (`call_soon` of a task's step: one await that suspended), by task coroutine;
- `callback`: any other `call_soon` (futures' done callbacks, protocol pauses), by callback;
- `iteration`: turns of the loop (one `select` each).

A site is the innermost frame outside asyncio and this file (`file:function`). The figures are counts
per request (per stream, and per chunk), deterministic up to the few background ticks that land in the
window; the loop is asyncio's own selector loop (uvloop, which berth serves on, cannot be counted from
Python), which makes the same calls for what berth and aiohttp ask of it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final

import orjson

from loadgen.diag.trees import tree_arg

KINDS: Final = ("task", "future", "timer", "wakeup", "callback", "iteration")
PAGE: Final = "/v1/chat/completions"
_HERE: Final = os.path.abspath(__file__)
_MARKERS: Final = ("site-packages/", "/gateway/", "/loadgen/", "/lib/python")


def _short(path: str) -> str:
    for marker in _MARKERS:
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker) :].lstrip("/")
    return os.path.basename(path)


def _site(depth: int = 2) -> str:
    """`file:function` of the innermost frame outside asyncio and this file."""
    f: FrameType | None = sys._getframe(depth)
    while f is not None:
        name = f.f_code.co_filename
        if "/asyncio/" not in name and name != _HERE:
            return f"{_short(name)}:{f.f_code.co_name}"
        f = f.f_back
    return "?"


def _coro_name(coro: object) -> str:
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    qual = getattr(coro, "__qualname__", None) or type(coro).__name__
    if code is None:
        return str(qual)
    return f"{_short(code.co_filename)}:{qual}"


class CountingLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, counting what is asked of it while `counting` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.counting = False
        self.set_task_factory(self._task)

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        # aiohttp makes some of its tasks with asyncio.Task(...) directly: those show as their first
        # wake-up (a call_soon of the new task's step) rather than here.
        if self.counting:
            self.counts["task", _coro_name(coro)] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    def create_future(self) -> asyncio.Future[Any]:
        if self.counting:
            self.counts["future", _site()] += 1
        return super().create_future()

    # The signatures are the loop's at run time; typeshed's generic ones cannot be overridden by a wrapper.
    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> Any:
        if self.counting:
            self.counts["timer", _site()] += 1
        return super().call_at(when, callback, *args, context=context)

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> Any:
        if self.counting:
            owner = getattr(callback, "__self__", None)
            if isinstance(owner, asyncio.Task):
                self.counts["wakeup", _coro_name(owner.get_coro())] += 1
            else:
                name = getattr(callback, "__qualname__", None) or type(callback).__name__
                self.counts["callback", f"{name} <- {_site()}"] += 1
        return super().call_soon(callback, *args, context=context)

    def _run_once(self) -> None:
        if self.counting:
            self.counts["iteration", "select"] += 1
        super()._run_once()  # type: ignore[misc]


# ----------------------------------------------------------------- the proxies under test
async def _bare(upstreams: list[str]) -> tuple[str, Callable[[], Awaitable[None]]]:
    from aiohttp import web

    from loadgen.bench.overhead.overhead_bare_proxy import build_app

    runner = web.AppRunner(build_app(upstreams), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return _url(runner), runner.cleanup


async def _berth(upstreams: list[str]) -> tuple[str, Callable[[], Awaitable[None]]]:
    import structlog
    from aiohttp import web

    from gateway.app import Gateway, ServeOptions, build_app
    from gateway.config import apply_overrides, default_config, load_runtime, parse_endpoint_flag
    from gateway.core.logging import LEVEL, configure_logging
    from gateway.sched.plugins import default_registry

    # At warning, as the overhead benchmarks run berth; put back on the way out (a test process keeps
    # its own logging).
    before, info_before = structlog.get_config(), LEVEL.info
    configure_logging("warning")
    flags = tuple(parse_endpoint_flag(f"{u},engine=vllm") for u in upstreams)
    cfg = apply_overrides(default_config(), endpoints=flags)
    registry = default_registry()
    runtime = load_runtime(None, cfg, registry, endpoints=flags)
    gw = Gateway(runtime, cfg, ServeOptions(config_path=None, endpoints=flags), registry=registry)
    # As gateway.app.serve builds its runner.
    runner = web.AppRunner(build_app(gw), handle_signals=False, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    await gw.endpoints.first_round(timeout_s=10)

    async def cleanup() -> None:
        try:
            await runner.cleanup()
        finally:
            structlog.configure(**before)
            LEVEL.info = info_before

    return _url(runner), cleanup


def _url(runner: Any) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


PROXIES: Final[dict[str, Callable[[list[str]], Coroutine[Any, Any, tuple[str, Any]]]]] = {
    "bare": _bare,
    "berth": _berth,
}


# ----------------------------------------------------------------- the upstream and the client
class _Side:
    """The upstream and the client, on a loop of their own in a thread."""

    def __init__(self, chunk_interval_s: float) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(chunk_interval_s,), daemon=True)
        self.upstreams: list[str] = []
        self._thread.start()
        self._ready.wait(30)

    def _run(self, chunk_interval_s: float) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start(chunk_interval_s))
        self._ready.set()
        self.loop.run_forever()

    async def _start(self, chunk_interval_s: float) -> None:
        import aiohttp
        from aiohttp import web

        from loadgen.bench.overhead.overhead_upstream import build_app

        self.runner = web.AppRunner(build_app(chunk_interval_s), access_log=None, handle_signals=False)
        await self.runner.setup()
        for _ in range(2):
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
        self.upstreams = [f"http://{h}:{p}" for h, p, *_ in self.runner.addresses]
        self.session = aiohttp.ClientSession()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(600)

    async def requests(self, url: str, n: int, *, stream: bool, chunks: int) -> int:
        """`n` requests, one at a time; the chunks received (streamed) or answers (not)."""
        body = orjson.dumps(
            {
                "model": "bench",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": chunks,
                "stream": stream,
            }
        )
        got = 0
        headers = {"Content-Type": "application/json"}
        for _ in range(n):
            async with self.session.post(url + PAGE, data=body, headers=headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"proxy answered {resp.status}: {await resp.text()}")
                if stream:
                    async for _chunk in resp.content.iter_any():
                        got += 1
                else:
                    await resp.read()
                    got += 1
        return got

    def close(self) -> None:
        async def stop() -> None:
            await self.session.close()
            await self.runner.cleanup()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def count(proxy: str, requests: int, streams: int, chunks: int, chunk_interval_s: float) -> dict[str, Any]:
    """Counts per request (non-streamed) and per stream of `proxy` on a counting loop."""
    side = _Side(chunk_interval_s)
    loop = CountingLoop()
    asyncio.set_event_loop(loop)
    done: asyncio.Future[None] = loop.create_future()
    out: dict[str, Any] = {}
    url = ""

    def client() -> None:
        try:
            for mode, n, stream in (("request", requests, False), ("stream", streams, True)):
                side.call(side.requests(url, max(2, n // 10), stream=stream, chunks=chunks))  # warm-up
                loop.counting = True
                side.call(side.requests(url, n, stream=stream, chunks=chunks))
                loop.counting = False
                out[mode] = {"n": n, "counts": {f"{k}|{s}": c for (k, s), c in loop.counts.items()}}
                loop.counts.clear()
            loop.call_soon_threadsafe(done.set_result, None)
        except BaseException as e:  # handed to the proxy's loop, which raises it
            loop.call_soon_threadsafe(done.set_exception, e)

    async def main() -> None:
        nonlocal url
        url, cleanup = await PROXIES[proxy](side.upstreams)
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        try:
            await done
        finally:
            await cleanup()
        thread.join(10)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        side.close()
    out["chunks"] = chunks
    return out


# ----------------------------------------------------------------- the report
def per_unit(result: dict[str, Any], mode: str) -> dict[tuple[str, str], float]:
    n = result[mode]["n"]
    out: dict[tuple[str, str], float] = {}
    for key, c in result[mode]["counts"].items():
        kind, _, site = key.partition("|")
        out[kind, site] = c / n
    return out


def totals(counts: dict[tuple[str, str], float]) -> dict[str, float]:
    out = dict.fromkeys(KINDS, 0.0)
    for (kind, _), v in counts.items():
        out[kind] += v
    return out


def render(results: dict[str, dict[str, dict[str, Any]]], *, min_count: float = 0.02) -> str:
    """Per tree: the totals per kind for the bare proxy and berth, and berth's sites."""
    lines: list[str] = []
    for tree, by_proxy in results.items():
        chunks = by_proxy["berth"]["chunks"]
        for mode, unit in (
            ("request", "per non-streamed request"),
            ("stream", f"per stream of {chunks} chunks"),
        ):
            bare, berth = per_unit(by_proxy["bare"], mode), per_unit(by_proxy["berth"], mode)
            tb, tt = totals(bare), totals(berth)
            lines.append(f"[{tree}] {unit}")
            lines.append(f"  {'kind':10}{'bare':>10}{'berth':>10}{'added':>10}")
            for k in KINDS:
                lines.append(f"  {k:10}{tb[k]:10.2f}{tt[k]:10.2f}{tt[k] - tb[k]:+10.2f}")
            if mode == "stream":
                lines.append(
                    "  per chunk: "
                    + ", ".join(f"{k} {tb[k] / chunks:.2f} -> {tt[k] / chunks:.2f}" for k in KINDS)
                )
            lines.append("  berth's sites (count per unit; bare's in brackets):")
            for (kind, site), v in sorted(berth.items(), key=lambda kv: (kv[0][0], -kv[1])):
                if kind == "iteration" or v < min_count:
                    continue
                b = bare.get((kind, site), 0.0)
                lines.append(f"    {kind:9}{v:8.2f} ({b:5.2f})  {site}")
            lines.append("")
    return "\n".join(lines)


def _child(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    child = ["--child", "--requests", str(args.requests), "--streams", str(args.streams),
             "--chunks", str(args.chunks), "--chunk-interval-ms", str(args.chunk_interval_ms)]  # fmt: skip
    # This file runs by its path, with only `tree` on the path: the tree need not have it.
    code = (
        f"import runpy, sys; sys.argv = {[__file__, *child]!r}; "
        f"runpy.run_path({__file__!r}, run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree, check=True, capture_output=True, timeout=900
    )
    result: dict[str, Any] = orjson.loads(out.stdout)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag overhead-hops", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--tree", type=tree_arg, action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--requests", type=int, default=500, help="non-streamed requests (default 500)")
    p.add_argument("--streams", type=int, default=50, help="streamed requests (default 50)")
    p.add_argument("--chunks", type=int, default=32, help="chunks per stream (default 32)")
    p.add_argument("--chunk-interval-ms", type=float, default=1.0, help="upstream pause between chunks")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help="JSON report")
    args = p.parse_args(argv)
    if args.child:
        interval = args.chunk_interval_ms / 1000.0
        res = {proxy: count(proxy, args.requests, args.streams, args.chunks, interval) for proxy in PROXIES}
        sys.stdout.write(orjson.dumps(res).decode())
        return 0
    trees = args.tree or [("berth", Path(__file__).resolve().parents[2])]
    results = {name: _child(tree, args) for name, tree in trees}
    text = render(results)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"benchmark": "overhead-hops", "trees": {n: str(t) for n, t in trees}, "results": results,
                  "table": text}  # fmt: skip
        args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
