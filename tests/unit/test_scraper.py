"""EndpointScraper against a fake engine served by aiohttp on loopback. Rounds are driven with
run_once() and a FakeClock; nothing sleeps."""

from __future__ import annotations

import asyncio
import gzip
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from gateway.core.clock import FakeClock
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, EngineKind
from gateway.telemetry.engine_metrics import SGLANG_METRICS, VLLM_METRICS, EngineMetrics
from gateway.telemetry.promtext import SLICE_LINES
from gateway.telemetry.scraper import EndpointScraper, ScrapeSettings, Wait
from gateway.upstream.client import UpstreamSettings, make_fetcher
from gateway.upstream.fetch import Fetcher

DATA = Path(__file__).parent / "data"
VLLM_PAGE = (DATA / "vllm_v1_dp2.prom").read_text()
SGLANG_PAGE = (DATA / "sglang.prom").read_text()
VLLM_GAUGES = EngineGauges(running=5.0, waiting=1.0, kv_usage=0.3)
EID = EndpointId("gpu-01:8000")

READY = EndpointHealth.READY
UNHEALTHY = EndpointHealth.UNHEALTHY


@dataclass
class FakeEngine:
    """What the fake engine answers; tests change it between rounds."""

    health_status: int = 200
    hang_health: bool = False
    metrics_status: int = 200
    metrics: str = VLLM_PAGE
    models_status: int = 200
    models: list[str] = field(default_factory=lambda: ["Qwen/Qwen2.5-Coder-7B-Instruct"])
    hits: Counter[str] = field(default_factory=Counter)
    metrics_headers: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/v1/models", self.models_list)
        return app

    async def health(self, request: web.Request) -> web.Response:
        self.hits["health"] += 1
        if self.hang_health:
            await asyncio.Event().wait()  # never answers: the scraper's timeout must fire
        return web.Response(status=self.health_status)

    async def metrics_page(self, request: web.Request) -> web.Response:
        self.hits["metrics"] += 1
        self.metrics_headers.append(dict(request.headers))
        body = self.metrics.encode()
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        # Like prometheus_client's handler: gzip whenever the client accepts it.
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return web.Response(status=self.metrics_status, body=body, headers=headers)

    async def models_list(self, request: web.Request) -> web.Response:
        self.hits["models"] += 1
        data = [{"id": m, "object": "model", "created": 1, "owned_by": "vllm"} for m in self.models]
        return web.Response(
            status=self.models_status,
            body=orjson.dumps({"object": "list", "data": data}),
            content_type="application/json",
        )


@dataclass
class RecordingSink:
    events: list[tuple[Any, ...]] = field(default_factory=list)
    fail_on: str | None = None

    def _record(self, *event: Any) -> None:
        self.events.append(event)
        if event[0] == self.fail_on:
            raise RuntimeError(f"sink broke on {event[0]}")

    def on_health(self, eid: EndpointId, health: EndpointHealth) -> None:
        self._record("health", eid, health)

    def on_gauges(self, eid: EndpointId, gauges: EngineGauges) -> None:
        self._record("gauges", eid, gauges)

    def on_models(self, eid: EndpointId, models: list[str]) -> None:
        self._record("models", eid, models)

    def on_engine(self, eid: EndpointId, kind: EngineKind) -> None:
        self._record("engine", eid, kind)

    def on_scrape(self, eid: EndpointId, ok: bool, duration_s: float, bad_lines: int) -> None:
        self._record("scrape", eid, ok, bad_lines)

    def take(self) -> list[tuple[Any, ...]]:
        """Events since the last take, without the endpoint id."""
        out = [(e[0], *e[2:]) for e in self.events]
        self.events.clear()
        return out


@dataclass
class Rig:
    engine: FakeEngine
    sink: RecordingSink
    clock: FakeClock
    scraper: EndpointScraper
    server: Any


@pytest.fixture
async def client() -> AsyncIterator[Fetcher]:
    # Like gateway.upstream.client.make_fetcher: the daemon's scrape client, on a pool of its own.
    fetcher = make_fetcher(UpstreamSettings(connect_timeout_s=2.0), FakeClock())
    yield fetcher
    fetcher.pool.close()


@pytest.fixture
def make_rig(aiohttp_server: AiohttpServer, client: Fetcher) -> Any:  # a factory coroutine
    async def make(
        *,
        engine: FakeEngine | None = None,
        dialect: EngineMetrics | None = None,
        settings: ScrapeSettings | None = None,
        clock: FakeClock | None = None,
        wait: Wait = asyncio.sleep,
    ) -> Rig:
        engine = engine or FakeEngine()
        server = await aiohttp_server(engine.app())
        sink = RecordingSink()
        clock = clock or FakeClock()
        scraper = EndpointScraper(
            EID,
            str(server.make_url("/")),
            dialect,
            client,
            settings or ScrapeSettings(unhealthy_after=3, models_refresh_s=30.0),
            sink,
            clock,
            wait=wait,
        )
        return Rig(engine, sink, clock, scraper, server)

    return make


async def test_healthy_engine_becomes_ready_with_gauges(make_rig: Any) -> None:
    rig: Rig = await make_rig()
    assert not rig.scraper.round_done.is_set()
    await rig.scraper.run_once()
    assert rig.sink.take() == [
        ("engine", EngineKind.VLLM),
        ("gauges", VLLM_GAUGES),
        ("models", ["Qwen/Qwen2.5-Coder-7B-Instruct"]),
        ("health", READY),
        ("scrape", True, 0),
    ]
    assert rig.scraper.round_done.is_set()
    assert rig.scraper.health is READY
    assert rig.scraper.dialect is VLLM_METRICS
    assert rig.scraper.models == ["Qwen/Qwen2.5-Coder-7B-Instruct"]
    assert rig.scraper.url == str(rig.server.make_url("/"))
    assert rig.scraper.last_exposition is not None
    # The page was asked for in format 0.0.4, uncompressed (the client does not decompress).
    headers = rig.engine.metrics_headers[0]
    assert "version=0.0.4" in headers["Accept"]
    assert headers["Accept-Encoding"] == "identity"

    await rig.scraper.run_once()  # steady state: gauges and the round, nothing else
    assert rig.sink.take() == [("gauges", VLLM_GAUGES), ("scrape", True, 0)]
    assert rig.engine.hits == Counter(health=2, metrics=2, models=1)


async def test_a_large_page_is_parsed_between_other_work(make_rig: Any) -> None:
    """The page is parsed SLICE_LINES lines per turn of the loop: a task that only yields gets a turn
    between slices, so it turns at least once per slice while the scraper parses."""
    filler = "".join(f'filler_gauge{{i="{i}"}} {i}\n' for i in range(10 * SLICE_LINES))
    rig: Rig = await make_rig(engine=FakeEngine(metrics=VLLM_PAGE + filler), dialect=VLLM_METRICS)
    turns = 0
    stop = asyncio.Event()

    async def other() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(other())
    await asyncio.sleep(0)  # it starts
    before = turns
    await rig.scraper.run_once()
    stop.set()
    await task
    assert ("gauges", VLLM_GAUGES) in rig.sink.take()
    assert rig.scraper.last_exposition is not None
    assert rig.scraper.last_exposition.value("filler_gauge") == sum(range(10 * SLICE_LINES))
    assert turns - before >= 10  # the page is 10 slices and more: one turn of the other task per slice


@pytest.mark.parametrize("dialect", [None, VLLM_METRICS], ids=["detected", "configured"])
async def test_once_a_whole_page_confirmed_the_engine_only_what_berth_reads_is_parsed(
    make_rig: Any, dialect: EngineMetrics | None
) -> None:
    rig: Rig = await make_rig(dialect=dialect)
    e2e = "vllm:e2e_request_latency_seconds_bucket"
    await rig.scraper.run_once()  # a whole page: detection (or the mismatch check) reads every name
    first = rig.scraper.last_exposition
    assert first is not None
    assert first.has(e2e)
    for _ in range(2):  # then only the scraped names (the second time from the previous page's lines)
        await rig.scraper.run_once()
        expo = rig.scraper.last_exposition
        assert expo is not None
        assert not expo.has(e2e)
        assert ("gauges", VLLM_GAUGES) in rig.sink.take()
        for read in (VLLM_METRICS.ttft_histogram, VLLM_METRICS.itl_histogram):
            now, then = read(expo), read(first)
            assert now is not None
            assert then is not None
            assert (now.count, now.sum) == (then.count, then.sum)  # what the cross-checks read


async def test_configured_dialect_is_not_reported_as_detected(make_rig: Any) -> None:
    rig: Rig = await make_rig(dialect=VLLM_METRICS)
    await rig.scraper.run_once()
    assert [e[0] for e in rig.sink.take()] == ["gauges", "models", "health", "scrape"]


async def test_engine_detection_sglang(make_rig: Any) -> None:
    rig: Rig = await make_rig(
        engine=FakeEngine(metrics=SGLANG_PAGE, models=["meta-llama/Llama-3.1-8B-Instruct"])
    )
    await rig.scraper.run_once()
    events = rig.sink.take()
    assert events[0] == ("engine", EngineKind.SGLANG)
    assert ("gauges", EngineGauges(running=12.0, waiting=4.0, kv_usage=0.625)) in events
    assert rig.scraper.dialect is SGLANG_METRICS


async def test_engine_detected_once_it_shows_its_metrics(make_rig: Any) -> None:
    rig: Rig = await make_rig(engine=FakeEngine(metrics="process_open_fds 7\n"))
    await rig.scraper.run_once()
    assert rig.sink.take() == [
        ("models", ["Qwen/Qwen2.5-Coder-7B-Instruct"]),
        ("health", READY),
        ("scrape", False, 0),
    ]
    assert rig.scraper.dialect is None
    rig.engine.metrics = VLLM_PAGE
    await rig.scraper.run_once()
    assert rig.sink.take() == [("engine", EngineKind.VLLM), ("gauges", VLLM_GAUGES), ("scrape", True, 0)]


async def test_configured_dialect_kept_when_the_page_says_otherwise(make_rig: Any) -> None:
    rig: Rig = await make_rig(engine=FakeEngine(metrics=SGLANG_PAGE), dialect=VLLM_METRICS)
    await rig.scraper.run_once()
    # The operator said vLLM; the SGLang page has no vLLM gauges, so no gauges (and a logged mismatch).
    assert [e[0] for e in rig.sink.take()] == ["models", "health", "scrape"]
    assert rig.scraper.dialect is VLLM_METRICS


@pytest.mark.parametrize(
    ("metrics_status", "page", "bad_lines"),
    [
        pytest.param(
            200,
            "this is not {prometheus text\n\x00\xff}}}\nvllm:num_requests_running{a= 1\n",
            3,
            id="garbage",
        ),
        pytest.param(500, VLLM_PAGE, 0, id="status-500"),
        pytest.param(200, "", 0, id="empty"),
    ],
)
async def test_broken_metrics_keep_the_endpoint_ready(
    make_rig: Any, metrics_status: int, page: str, bad_lines: int
) -> None:
    rig: Rig = await make_rig(
        engine=FakeEngine(metrics=page, metrics_status=metrics_status), dialect=VLLM_METRICS
    )
    await rig.scraper.run_once()
    assert rig.sink.take() == [
        ("models", ["Qwen/Qwen2.5-Coder-7B-Instruct"]),
        ("health", READY),
        ("scrape", False, bad_lines),
    ]
    assert rig.scraper.health is READY


async def test_partly_garbled_page_still_gives_gauges(make_rig: Any) -> None:
    rig: Rig = await make_rig(engine=FakeEngine(metrics=VLLM_PAGE + "\x00 garbage }}}\n"))
    await rig.scraper.run_once()
    assert rig.sink.take()[-2:] == [("health", READY), ("scrape", True, 1)]


async def test_health_failures_make_it_unhealthy_and_one_success_ready(make_rig: Any) -> None:
    rig: Rig = await make_rig(engine=FakeEngine(health_status=503))
    for _ in range(2):
        await rig.scraper.run_once()
        assert rig.sink.take() == [("scrape", False, 0)]
        assert rig.scraper.health is EndpointHealth.STARTING
    assert rig.scraper.round_done.is_set()  # set after the first round, whatever happened
    await rig.scraper.run_once()
    assert rig.sink.take() == [("health", UNHEALTHY), ("scrape", False, 0)]
    await rig.scraper.run_once()
    assert rig.sink.take() == [("scrape", False, 0)]  # no repeated transition
    # While the health check fails, nothing else is asked.
    assert rig.engine.hits == Counter(health=4)

    rig.engine.health_status = 200
    await rig.scraper.run_once()
    assert rig.sink.take() == [
        ("engine", EngineKind.VLLM),
        ("gauges", VLLM_GAUGES),
        ("models", ["Qwen/Qwen2.5-Coder-7B-Instruct"]),
        ("health", READY),
        ("scrape", True, 0),
    ]


async def test_ready_endpoint_goes_unhealthy_after_n_failures(make_rig: Any) -> None:
    rig: Rig = await make_rig(dialect=VLLM_METRICS)
    await rig.scraper.run_once()
    rig.sink.take()
    rig.engine.health_status = 503
    transitions = []
    for _ in range(3):
        await rig.scraper.run_once()
        transitions += [e for e in rig.sink.take() if e[0] == "health"]
    assert transitions == [("health", UNHEALTHY)]
    rig.engine.health_status = 200
    await rig.scraper.run_once()
    assert ("health", READY) in rig.sink.take()


async def test_unreachable_engine_counts_as_failure(make_rig: Any) -> None:
    rig: Rig = await make_rig(settings=ScrapeSettings(unhealthy_after=1))
    await rig.server.close()
    await rig.scraper.run_once()
    assert rig.sink.take() == [("health", UNHEALTHY), ("scrape", False, 0)]


async def test_health_timeout_counts_as_failure(make_rig: Any) -> None:
    rig: Rig = await make_rig(
        engine=FakeEngine(hang_health=True), settings=ScrapeSettings(unhealthy_after=1, timeout_s=0.05)
    )
    await rig.scraper.run_once()
    assert rig.sink.take() == [("health", UNHEALTHY), ("scrape", False, 0)]


async def test_models_are_refreshed_every_models_refresh_s(make_rig: Any) -> None:
    rig: Rig = await make_rig(dialect=VLLM_METRICS, settings=ScrapeSettings(models_refresh_s=30.0))
    await rig.scraper.run_once()
    assert ("models", ["Qwen/Qwen2.5-Coder-7B-Instruct"]) in rig.sink.take()

    rig.clock.advance(29.0)
    await rig.scraper.run_once()
    assert rig.engine.hits["models"] == 1

    rig.clock.advance(1.0)
    await rig.scraper.run_once()  # due again, unchanged: asked, not reported
    assert rig.engine.hits["models"] == 2
    assert not [e for e in rig.sink.take() if e[0] == "models"]

    rig.engine.models = ["Qwen/Qwen2.5-Coder-7B-Instruct", "sql-lora"]
    rig.clock.advance(30.0)
    await rig.scraper.run_once()
    assert ("models", ["Qwen/Qwen2.5-Coder-7B-Instruct", "sql-lora"]) in rig.sink.take()
    assert rig.scraper.models == ["Qwen/Qwen2.5-Coder-7B-Instruct", "sql-lora"]


async def test_failed_model_discovery_is_retried_next_round(make_rig: Any) -> None:
    rig: Rig = await make_rig(engine=FakeEngine(models_status=500), dialect=VLLM_METRICS)
    await rig.scraper.run_once()
    assert [e[0] for e in rig.sink.take()] == ["gauges", "health", "scrape"]  # still ready
    assert rig.scraper.models is None
    rig.engine.models_status = 200
    await rig.scraper.run_once()
    assert ("models", ["Qwen/Qwen2.5-Coder-7B-Instruct"]) in rig.sink.take()
    assert rig.engine.hits["models"] == 2


async def test_update_settings_applies_a_lower_threshold_at_once(make_rig: Any) -> None:
    rig: Rig = await make_rig(
        engine=FakeEngine(health_status=503), settings=ScrapeSettings(unhealthy_after=5)
    )
    await rig.scraper.run_once()
    await rig.scraper.run_once()
    rig.sink.take()
    rig.scraper.update_settings(ScrapeSettings(unhealthy_after=2))
    assert rig.sink.take() == [("health", UNHEALTHY)]
    assert rig.scraper.settings.unhealthy_after == 2


async def test_a_broken_sink_does_not_break_the_round(make_rig: Any) -> None:
    rig: Rig = await make_rig(dialect=VLLM_METRICS)
    rig.sink.fail_on = "gauges"
    await rig.scraper.run_once()  # does not raise, and the rest of the round still happens
    assert [e[0] for e in rig.sink.take()] == ["gauges", "models", "health", "scrape"]
    assert rig.scraper.round_done.is_set()


async def test_run_loops_with_the_injected_wait(make_rig: Any) -> None:
    clock = FakeClock()
    waits: list[float] = []

    async def fake_wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise asyncio.CancelledError
        clock.advance(seconds)

    rig: Rig = await make_rig(
        dialect=VLLM_METRICS, settings=ScrapeSettings(interval_s=2.0), clock=clock, wait=fake_wait
    )
    with pytest.raises(asyncio.CancelledError):
        await rig.scraper.run()
    # the first round at once, then the endpoint's own phase of the interval, then every interval
    assert waits == [pytest.approx(rig.scraper.phase * 2.0), 2.0, 2.0]
    assert rig.engine.hits["metrics"] == 3
    assert [e[2] for e in rig.sink.events if e[0] == "scrape"] == [True, True, True]


async def test_phases_spread_a_fleets_rounds_over_the_interval(make_rig: Any) -> None:
    rig: Rig = await make_rig(dialect=VLLM_METRICS)
    phases = []
    for i in range(100):
        rig.scraper.eid = EndpointId(f"node-{i}/model")
        phases.append(rig.scraper.phase)
    assert all(0.0 <= p < 1.0 for p in phases)
    rig.scraper.eid = EndpointId("node-0/model")
    assert rig.scraper.phase == phases[0]
    # spread: every tenth of the interval holds some of the 100 endpoints, none holds a third of them
    deciles = [sum(1 for p in phases if k / 10 <= p < (k + 1) / 10) for k in range(10)]
    assert min(deciles) > 0
    assert max(deciles) < 34


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        ScrapeSettings(interval_s=0.0)
    with pytest.raises(ValueError, match="timeout_s"):
        ScrapeSettings(timeout_s=-1.0)
    with pytest.raises(ValueError, match="unhealthy_after"):
        ScrapeSettings(unhealthy_after=0)
