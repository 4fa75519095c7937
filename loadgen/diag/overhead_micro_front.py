"""The front's pieces of `overhead_micro` (`finish`, `finish_logged`, `front`): what each measures is in
that module's docstring."""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Final

from loadgen.diag.overhead_micro_sched import _requests, _scheduler


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
