"""berth's own per-request work without HTTP: CPU time per request in-process, A/B across checkouts.

    berth-loadgen diag overhead-micro                                  # this checkout
    berth-loadgen diag overhead-micro --tree main=OTHER_CHECKOUT --tree new=.  --rounds 7

Each piece is berth's real code, driven the way one non-streamed request at saturation drives it, over
`--requests` requests per run, timed with `time.thread_time_ns` (CPU time of this thread: another
process's load does not count, and the figure is µs of CPU per request, not a clock):

- `sched`: the scheduler's cycle of one request on the packaged default policy with two endpoints and
  `--inflight` requests running (the overhead benchmark's 64 connections over two upstreams): `submit`
  (placed at once) and, for the oldest running request, `complete`;
- `sched_stream`: the same with a progress report every 16 tokens of a 256-token stream (`progress`);
- `finish`: the front's finish phase of a finished request (its metrics, telemetry's record and its
  folding-in, the task clock; the log line is off, as at `--log-level warning`, which the overhead
  benchmarks run berth at);
- `finish_logged`: the same at `--log-level info` (berth's default), the canonical line written to
  /dev/null;
- `engine_call` (not run unless named in `--pieces`): one non-streamed engine call as the checkout makes
  it (`gateway.upstream.client.open_request`, the whole answer read, the response closed), 16 at a time,
  to the overhead benchmark's stand-in upstream (`overhead_upstream`) served on its own loop in another
  thread (its CPU is not this thread's), on uvloop as `berth serve` runs: what the engine-call client
  costs (aiohttp's ClientSession before berth's own HTTP/1.1 client, the pool after);
- `front`: the whole of berth's own Python for one request, as the OpenAI chat handler runs it
  (`gateway.front.api.handle`): auth, the body read, parse, admission (model, SLO, the scheduler's
  request), the dispatcher's acquire and release of a seat (the scheduler's submit and complete, as in
  `sched`, with `--inflight` requests running on each endpoint), and the finish phase (as `finish`);
  only the engine call is left out (a stub in the dispatcher's place answers from the seat it was
  given, as the runner would after reading an engine's answer). The request is aiohttp's own
  (`make_mocked_request`) with the peer harness's headers and body, made before the clock starts.
- `backlog_N` (not run unless named in `--pieces`, e.g. `backlog_0,backlog_1000,backlog_3000`): the
  scheduler's cycle behind N queued batch requests, under chat-and-batch's ordering (`priority-bands`,
  arrival order inside a band) and class bound (`BACKLOG_POLICY`): every seat is taken, an interactive
  request is submitted (admission counts its class's queue; it waits, first in line), and the oldest
  running one completes, which places it. What a submit and a completion cost while a batch backlog
  waits (a slow piece with a long backlog before the queue kept its keys: give it fewer `--requests`).
- `relay_iter` and `relay_deliver` (not run unless named; per streamed chunk, `--requests` chunks): the
  engine's chunks of a stream (the overhead benchmark's 200-chunk chat stream) fed to berth's engine
  connection (`H1Connection.data_received`, one chunk per loop callback, as from a socket) and written
  to the client's aiohttp response over transports that only count bytes (no syscalls, no `SseRelay`):
  `relay_iter` reads them with `async for` and writes with `StreamResponse.write` (berth's relay before
  `H1Response.deliver`, and its path when the writer is not the plain chunked one), `relay_deliver`
  takes them in the connection's callback and writes with `ChunkWriter` (its path now). On uvloop.
- `fleet_N` (not run unless named, e.g. `fleet_2,fleet_100`): `sched` with N endpoints and 8 requests
  running (the overhead benchmark's fleet phase: 8 connections in front of 100 endpoints): what
  placement costs per request as the fleet grows. With `--policy NAME` the fleet pieces run the shipped
  preset `policies/NAME.toml` of the checkout instead of `default`, their requests of its default class
  with first-token and end-to-end targets (2 s, 8 s), and the clock moves 5 ms per request (a fleet
  finishing 200 requests a second: the SLO plugins' loads age as they would).

With `--tree NAME=DIR` (repeatable) each checkout runs in a child process with DIR first on its path
(compiled modules in DIR included), the children taking turns round by round; the report gives each
piece's median over rounds, and each later tree's median per-round difference to the first.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.diag.trees import tree_arg

PIECES: Final = ("sched", "sched_stream", "finish", "finish_logged", "front")
EXTRA_PIECES: Final = ("engine_call", "relay_iter", "relay_deliver")  # run only when named
ENGINE_CALLS_AT_ONCE: Final = 16
BACKLOG: Final = "backlog_"  # + the number of batch requests queued
FLEET: Final = "fleet_"  # + the number of endpoints
FLEET_RUNNING: Final = 8  # requests running in the fleet pieces (the overhead benchmark's fleet phase)
#: With `--policy`: the fleet pieces' requests' targets, and the clock's step per request.
POLICY_TTFT_MS: Final = 2000.0
POLICY_E2E_MS: Final = 8000.0
POLICY_STEP_S: Final = 0.005
#: The backlog pieces' policy: chat-and-batch's ordering and classes, least-outstanding placement, and
#: admission that only bounds the interactive class's queue (no predictions).
BACKLOG_POLICY: Final = """
name = "backlog"
[ordering]
plugin = "priority-bands"
params = { within = "arrival" }
[placement]
picker = { plugin = "max-score" }
filters = []
[[placement.scorers]]
plugin = "least-outstanding"
weight = 1.0
[admission]
plugin = "admit-all"
[slo]
default_class = "interactive"
[[slo.classes]]
name = "interactive"
band = 0
max_queue = 512
[[slo.classes]]
name = "batch"
kind = "batch"
band = 1
"""
PROGRESS_EVERY: Final = 16  # as gateway.dispatch.relay
STREAM_TOKENS: Final = 256


def _scheduler(inflight: int, policy_text: str | None = None, endpoints: int = 2) -> Any:
    from gateway.config.policy import load_default_policy, parse_policy_text
    from gateway.core.clock import FakeClock
    from gateway.core.types import EndpointHealth, EndpointId, EngineKind, ModelName
    from gateway.sched.plugins import default_registry
    from gateway.sched.scheduler import Scheduler
    from gateway.sched.types import EndpointSpec, QueueLimits

    clock = FakeClock()
    reg = default_registry()
    pol = (
        load_default_policy(reg) if policy_text is None else parse_policy_text(policy_text, "micro.toml", reg)
    )
    sched = Scheduler(pol, clock, QueueLimits(max_queue_per_model=1_000_000))
    model = ModelName("bench")
    specs = [
        EndpointSpec(EndpointId(f"e{i}"), f"http://e{i}", EngineKind.VLLM, frozenset({model}), cap=inflight)
        for i in range(endpoints)
    ]
    sched.sync_endpoints(specs)
    for s in specs:
        sched.set_health(s.id, EndpointHealth.READY)
    return sched, clock


def _requests(n: int, clock: Any, slo_class: str = "default", prefix: str = "b") -> list[Any]:
    from gateway.core.types import SLO, ApiKind, ModelName, RequestId
    from gateway.sched.request import SchedRequest

    slo = SLO(slo_class=slo_class)
    return [
        SchedRequest(
            id=RequestId(f"{prefix}{i}"),
            model=ModelName("bench"),
            api=ApiKind.CHAT,
            arrival=clock.now(),
            slo=slo,
            prompt_tokens=12,
            max_tokens=16,
            stream=False,
            predicted_output_tokens=16.0,
            predicted_output_p90=16.0,
        )
        for i in range(n)
    ]


def bench_sched(
    n: int, inflight: int, *, stream: bool, endpoints: int = 2, policy: str | None = None
) -> float:
    """CPU ns per request of the scheduler's cycle (submit, progress, complete) with `inflight` requests
    running over `endpoints` endpoints (each capped at `inflight`); `policy`: a shipped preset's name
    (see the module's docstring)."""
    import dataclasses

    from gateway.core.types import SLO
    from gateway.sched.decisions import Dispatch

    text = None if policy is None else (Path.cwd() / "policies" / f"{policy}.toml").read_text()
    sched, clock = _scheduler(inflight, text, endpoints=endpoints)
    reqs = _requests(n + inflight, clock)
    step = 0.0
    if policy is not None:
        step = POLICY_STEP_S
        slo_policy = sched.policy.slo
        slo = SLO(slo_class=slo_policy.default_class, ttft_ms=POLICY_TTFT_MS, deadline_ms=POLICY_E2E_MS)
        reqs = [dataclasses.replace(r, slo=slo) for r in reqs]
    for r in reqs[:inflight]:
        assert isinstance(sched.submit(r), Dispatch)
    reports = [(k, k * 0.01) for k in range(1, STREAM_TOKENS + 1, PROGRESS_EVERY)] if stream else []
    progress, submit, complete = sched.progress, sched.submit, sched.complete
    gc.collect()
    t0 = time.thread_time_ns()
    for i in range(n):
        old = reqs[i].id
        if reports:
            for produced, _ in reports:
                progress(old, produced, 0.001)
        if step:
            clock.advance(step)
        complete(old)
        d = submit(reqs[i + inflight])
        if d is None:
            raise RuntimeError("the micro-benchmark's request was queued: it must be placed at once")
    return (time.thread_time_ns() - t0) / n


def bench_backlog(n: int, inflight: int, backlog: int) -> float:
    """CPU ns per request of the scheduler's cycle behind `backlog` queued batch requests (see the
    module's docstring)."""
    from collections import deque

    from gateway.sched.decisions import Dispatch

    sched, clock = _scheduler(inflight, BACKLOG_POLICY)
    seated = _requests(2 * inflight, clock, "interactive", "s")
    for r in seated:
        assert isinstance(sched.submit(r), Dispatch)
    for r in _requests(backlog, clock, "batch", "q"):
        assert sched.submit(r) is None
    reqs = _requests(n, clock, "interactive")
    running = deque(r.id for r in seated)
    submit, complete = sched.submit, sched.complete
    gc.collect()
    t0 = time.thread_time_ns()
    for r in reqs:
        if submit(r) is not None:
            raise RuntimeError(
                "the backlog micro-benchmark's request was not queued: every seat must be taken"
            )
        placed = complete(running.popleft())
        if len(placed) != 1 or placed[0].req is not r:
            raise RuntimeError(
                "the backlog micro-benchmark's completion must place the waiting interactive request"
            )
        running.append(r.id)
    return (time.thread_time_ns() - t0) / n


def bench_finish(n: int, *, logged: bool = False) -> float:
    """CPU ns per request of the front's finish phase (metrics, telemetry's record, task clock); with
    `logged`, its canonical log line at info level, written to /dev/null."""
    import structlog
    from prometheus_client import CollectorRegistry

    from gateway.admission.state import SloAdmission
    from gateway.admission.tenancy import TenantAccounting
    from gateway.config.schema import TelemetryConfig
    from gateway.core.clock import FakeClock
    from gateway.core.logging import LEVEL, configure_logging
    from gateway.core.metrics import GatewayMetrics
    from gateway.core.types import ApiKind, EndpointId
    from gateway.dispatch.context import RequestContext
    from gateway.front import api
    from gateway.telemetry.live import LiveTelemetry

    clock = FakeClock()
    metrics = GatewayMetrics(CollectorRegistry())
    sched, _ = _scheduler(64)
    telemetry = LiveTelemetry(sched, clock, TelemetryConfig())
    slo = SloAdmission()
    req = _requests(1, clock)[0]

    class _S:  # the services the finish phase reads
        pass

    s: Any = _S()
    s.clock, s.metrics, s.telemetry, s.slo, s.lifecycle_finished = clock, metrics, telemetry, slo, None
    s.tenancy = TenantAccounting()
    s.scheduler = sched
    ctxs = []
    for i in range(n):
        ctx = RequestContext(id=f"r{i}", api=ApiKind.CHAT, arrival=clock.now())
        ctx.client_model = ctx.served_model = "bench"
        ctx.slo_class = "default"
        ctx.endpoint = EndpointId("e0")
        ctx.dispatched_at = ctx.first_token_at = clock.now()
        ctx.status, ctx.prompt_tokens, ctx.output_tokens, ctx.attempts = 200, 12, 16, 1
        ctx.sched = req
        ctxs.append(ctx)
    before, info_before = structlog.get_config(), LEVEL.info
    with open(os.devnull, "wb") as devnull:
        configure_logging("info" if logged else "warning", devnull)
        try:
            gc.collect()
            t0 = time.thread_time_ns()
            for i, ctx in enumerate(ctxs):
                api.finish(s, ctx)
                if i % 64 == 63:
                    telemetry.drain()  # what its background task does with each finished request
            return (time.thread_time_ns() - t0) / n
        finally:
            structlog.configure(**before)  # as it was: a test process keeps its own logging
            LEVEL.info = info_before


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


#: The peer harness's request (`post_chat.lua`), for the bench's model.
FRONT_BODY: Final = (
    b'{"model":"bench","messages":[{"role":"user","content":"Hello, how are you?"}],'
    b'"max_tokens":16,"stream":false}'
)
FRONT_HEADERS: Final = {
    "Host": "127.0.0.1:18100",
    "Content-Type": "application/json",
    "Authorization": "Bearer sk-7f3c9a1e5b2d4f608a9c1e3b5d7f9a2c4e6b8d0f1a3c5e7b",
    "Content-Length": str(len(FRONT_BODY)),
}


def _no_op(*args: Any, **kwargs: Any) -> None:
    pass


#: Requests made (outside the timed part) per batch: each request's body can be read once.
_FRONT_BATCH: Final = 500


def bench_front(n: int, inflight: int) -> float:
    """CPU ns per request of the OpenAI chat handler, the engine call left out (see the module's
    docstring)."""
    import asyncio
    from unittest import mock

    import structlog
    from aiohttp import web
    from aiohttp.streams import StreamReader
    from aiohttp.test_utils import make_mocked_request
    from prometheus_client import CollectorRegistry

    from gateway.admission.models import ModelCatalog
    from gateway.admission.slo import Tenants
    from gateway.admission.state import SloAdmission
    from gateway.config.schema import TelemetryConfig
    from gateway.core.logging import LEVEL, configure_logging
    from gateway.core.metrics import GatewayMetrics
    from gateway.core.types import ApiKind
    from gateway.dispatch.driver import SchedulerDriver
    from gateway.front import api
    from gateway.front.services import RequestSettings, Services
    from gateway.sched.decisions import Dispatch
    from gateway.telemetry.live import LiveTelemetry

    sched, clock = _scheduler(inflight + 1)  # a seat free on each endpoint beside `inflight` running
    for r in _requests(2 * inflight, clock, prefix="seated"):
        assert isinstance(sched.submit(r), Dispatch)
    driver = SchedulerDriver(sched)
    telemetry = LiveTelemetry(sched, clock, TelemetryConfig())
    settings = RequestSettings(
        catalog=ModelCatalog(), policy_name=sched.policy.name, slo=sched.policy.slo, tenants=Tenants()
    )

    def no_session() -> Any:
        raise RuntimeError("the front piece makes no engine call")

    s = Services(
        clock=clock,
        metrics=GatewayMetrics(CollectorRegistry()),
        scheduler=sched,
        telemetry=telemetry,
        slo=SloAdmission(),
        settings=settings,
        max_body_bytes=1 << 20,
        admin_token="",
        session=no_session,
    )
    answer = web.Response(body=b'{"ok":true}', status=200)

    class _Dispatcher:
        """The dispatcher at its boundary: a seat from the scheduler, the context as the runner leaves
        it after an engine's answer, the seat given back."""

        _answer = answer

        async def run(self, ctx: Any, sreq: Any, *args: Any, **kwargs: Any) -> web.StreamResponse:
            seat = await driver.acquire(sreq)
            try:
                ctx.attempts += 1
                ctx.endpoint = seat.endpoint.id
                ctx.dispatched_at = ctx.first_token_at = clock.now()
                ctx.prompt_tokens, ctx.output_tokens, ctx.status = 12, 16, 200
                return answer
            finally:
                driver.release(seat.req.id)

    s.start_dispatch(_Dispatcher())  # type: ignore[arg-type]
    handle = api.handle
    chat = ApiKind.CHAT

    def batch(loop: asyncio.AbstractEventLoop, k: int) -> list[web.Request]:
        out = []
        for _ in range(k):
            protocol = mock.Mock()
            protocol.resume_reading = _no_op  # a server's protocol does this cheaply: not the mock's cost
            content = StreamReader(protocol, 2**16, loop=loop)
            content.feed_data(FRONT_BODY)
            content.feed_eof()
            out.append(
                make_mocked_request(
                    "POST", chat.path, headers=FRONT_HEADERS, protocol=protocol, payload=content, loop=loop
                )
            )
        return out

    async def main() -> int:
        loop = asyncio.get_running_loop()
        spent = 0
        done = 0
        while done < n:
            reqs = batch(loop, min(_FRONT_BATCH, n - done))
            gc.collect()
            t0 = time.thread_time_ns()
            for req in reqs:
                resp = await handle(s, chat, req)
                if resp is not answer:
                    raise RuntimeError(f"the front piece's request failed: {resp.status}")
                clock.advance(0.0002)
                done += 1
                if done % 64 == 0:
                    telemetry.drain()  # what its background task does with each finished request
            spent += time.thread_time_ns() - t0
        return spent

    before, info_before = structlog.get_config(), LEVEL.info
    with open(os.devnull, "wb") as devnull:
        configure_logging("warning", devnull)
        try:
            return asyncio.run(main()) / n
        finally:
            structlog.configure(**before)
            LEVEL.info = info_before


def run_once(pieces: Sequence[str], n: int, inflight: int, policy: str | None = None) -> dict[str, float]:
    """µs of CPU per request of each piece, in this process."""
    benches: dict[str, Callable[[], float]] = {
        "sched": lambda: bench_sched(n, inflight, stream=False),
        "sched_stream": lambda: bench_sched(n, inflight, stream=True),
        "finish": lambda: bench_finish(n),
        "finish_logged": lambda: bench_finish(n, logged=True),
        "engine_call": lambda: bench_engine_call(n),
        "relay_iter": lambda: bench_relay(n, deliver=False),
        "relay_deliver": lambda: bench_relay(n, deliver=True),
        "front": lambda: bench_front(n, inflight),
    }
    out: dict[str, float] = {}
    for p in pieces:
        if p.startswith(BACKLOG):
            out[p] = bench_backlog(n, inflight, int(p.removeprefix(BACKLOG))) / 1000.0
        elif p.startswith(FLEET):
            count = int(p.removeprefix(FLEET))
            out[p] = bench_sched(n, FLEET_RUNNING, stream=False, endpoints=count, policy=policy) / 1000.0
        else:
            out[p] = benches[p]() / 1000.0
    return out


def _child(tree: Path, pieces: Sequence[str], n: int, inflight: int, policy: str | None) -> dict[str, float]:
    # This file runs by its path, with only `tree` on the path: the tree need not have it.
    env = dict(os.environ, PYTHONPATH=str(tree))
    child = ["--child", "--requests", str(n), "--inflight", str(inflight), "--pieces", ",".join(pieces)]
    if policy is not None:
        child += ["--policy", policy]
    code = (
        f"import runpy, sys; sys.argv = {[__file__, *child]!r}; "
        f"runpy.run_path({__file__!r}, run_name='__main__')"
    )
    argv = [sys.executable, "-c", code]
    out = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, timeout=600)
    result: dict[str, float] = orjson.loads(out.stdout)
    return result


def _backlog(piece: str) -> bool:
    """A `backlog_N` or `fleet_N` piece."""
    return any(piece.startswith(k) and piece.removeprefix(k).isdigit() for k in (BACKLOG, FLEET))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag overhead-micro", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--tree", type=tree_arg, action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=20000, help="requests per run (default 20000)")
    p.add_argument("--inflight", type=int, default=32, help="running requests per endpoint (default 32)")
    p.add_argument("--pieces", default=",".join(PIECES))
    p.add_argument("--policy", default=None, help="the fleet pieces' shipped preset (default: default)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help="JSON report")
    args = p.parse_args(argv)
    pieces = [x for x in args.pieces.split(",") if x]
    if unknown := {x for x in pieces if x not in PIECES + EXTRA_PIECES and not _backlog(x)}:
        known = ",".join(PIECES + EXTRA_PIECES)
        p.error(f"unknown pieces {sorted(unknown)}; choose from {known}, {BACKLOG}N or {FLEET}N")
    if args.child:
        sys.stdout.write(orjson.dumps(run_once(pieces, args.requests, args.inflight, args.policy)).decode())
        return 0
    trees = args.tree or [("berth", Path(__file__).resolve().parents[2])]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees[r % len(trees) :] + trees[: r % len(trees)]
        for name, tree in order:
            res = _child(tree, pieces, args.requests, args.inflight, args.policy)
            runs[name].append(res)
            shown = "  ".join(f"{k} {v:6.2f}" for k, v in res.items())
            print(f"round {r + 1}/{args.rounds} {name:10} {shown}  (µs CPU per request)", file=sys.stderr)
    first = trees[0][0]
    summary: dict[str, dict[str, float]] = {}
    lines = [f"{'piece':14}" + "".join(f"{name:>22}" for name, _ in trees)]
    for piece in pieces:
        row = f"{piece:14}"
        for name, _ in trees:
            vals = [x[piece] for x in runs[name]]
            s = summary.setdefault(f"{name}.{piece}", {})
            s["median"] = statistics.median(vals)
            cell = f"{s['median']:.2f}"
            if name != first:
                diffs = [a[piece] - b[piece] for a, b in zip(runs[name], runs[first], strict=True)]
                s["minus_first"] = statistics.median(diffs)
                cell += f" ({s['minus_first']:+.2f})"
            row += f"{cell:>22}"
        lines.append(row)
    table = "\n".join(lines)
    print(f"µs of CPU per request, median of {args.rounds} rounds of {args.requests} requests "
          f"(difference to {first}: median per round)\n{table}")  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"benchmark": "overhead-micro", "trees": {n: str(t) for n, t in trees},
                  "runs": runs, "summary": summary, "table": table}  # fmt: skip
        args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
