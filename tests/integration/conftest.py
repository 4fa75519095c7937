"""Integration fixtures: the real gateway app over loopback HTTP in front of scripted fake engines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import Gateway, ServeOptions, build_app
from gateway.config import (
    apply_overrides,
    default_config,
    load_gateway_config,
    load_runtime,
    parse_endpoint_flag,
)
from gateway.sched.plugins import default_registry
from tests.integration.fake_engine import FakeEngine
from tests.integration.redis_server import RedisServer


@dataclass
class Running:
    gw: Gateway
    server: TestServer
    #: The SDK clients `client` made, closed by `start_gateway` before the server: an unclosed client's
    #: sockets close only when the collector finds it, in the middle of some later test.
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def client(self, *, api_key: str = "test", **kw: object) -> openai.AsyncOpenAI:
        """An SDK client of this gateway; the fixture closes it (`async with` may close it sooner)."""
        c = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)  # type: ignore[arg-type]
        self.clients.append(c)
        return c

    async def scrape(self) -> None:
        """One scrape round of every endpoint, now (no waiting for the interval)."""
        for s in self.gw.endpoints.scrapers():
            await s.run_once()


StartGateway = Callable[..., Awaitable[Running]]
EngineServer = Callable[[FakeEngine], Awaitable[str]]

#: How long a test server, as the fixture closes it, lets requests still in flight finish before it
#: cancels them (aiohttp's default: 60 s to finish, then up to 60 s more after the cancel). A test that
#: failed while the fake engine held a request (`FakeEngine(hold=...)`) leaves that request in flight:
#: its failure is then reported at once instead of after minutes of teardown.
SHUTDOWN_S = 1.0


@pytest.fixture
async def engine_server() -> AsyncIterator[EngineServer]:
    servers: list[TestServer] = []

    async def start(engine: FakeEngine) -> str:
        srv = TestServer(engine.app(), handler_cancellation=True)
        await srv.start_server(shutdown_timeout=SHUTDOWN_S)  # the runner's options go here, not above
        servers.append(srv)
        return str(srv.make_url("")).rstrip("/")

    yield start
    for s in servers:
        await s.close()


@pytest.fixture
async def start_gateway(tmp_path: Path) -> AsyncIterator[StartGateway]:
    running: list[Running] = []

    async def start(endpoints: Sequence[str], *, toml: str | None = None, port: int | None = None) -> Running:
        flags = tuple(parse_endpoint_flag(e) for e in endpoints)
        cfg_path: Path | None = None
        if toml is not None:
            cfg_path = tmp_path / "gateway.toml"
            cfg_path.write_text(toml)
            base = load_gateway_config(cfg_path)
        else:
            base = default_config()
        # Batches (any Files or Batches route opens their store) in the test's directory, never the cwd.
        cfg = apply_overrides(base, endpoints=flags, batch_dir=None if base.batch_dir else tmp_path / "batch")
        registry = default_registry()
        runtime = load_runtime(cfg_path, cfg, registry, endpoints=flags, seed=1)
        gw = Gateway(runtime, cfg, ServeOptions(config_path=cfg_path, endpoints=flags), registry=registry)
        server = TestServer(build_app(gw), port=port, handler_cancellation=True)
        await server.start_server(shutdown_timeout=SHUTDOWN_S)
        await gw.endpoints.first_round(timeout_s=10)
        r = Running(gw, server)
        running.append(r)
        return r

    yield start
    for r in running:
        for c in r.clients:
            await c.close()
        await r.server.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session (tests keep apart by key prefix); killed by pid at the end."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()
