"""A fleet with more seats than the engine-call pool is warned about at startup and on reload, and the
pool's limit is a gauge."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine

WARNING = "upstream_pool_smaller_than_seats"


def _toml(urls: list[str], *, cap: int, pool_total: int) -> str:
    eps = "".join(f'[[endpoints]]\nurl = "{u}"\nengine = "vllm"\ncap = {cap}\n' for u in urls)
    return f"[upstream]\npool_per_host = 64\npool_total = {pool_total}\n{eps}"


async def test_seats_beyond_the_pool_are_warned_about_at_startup(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    urls = [await engine_server(FakeEngine()) for _ in range(2)]
    with capture_logs() as logs:
        r = await start_gateway([], toml=_toml(urls, cap=64, pool_total=100))
    [warning] = [e for e in logs if e["event"] == WARNING]
    assert (warning["key"], warning["pool"], warning["seats"]) == ("upstream.pool_total", 100, 128)
    assert warning["log_level"] == "warning"
    page = r.gw.metrics.render().decode()
    assert "berth_upstream_pool_limit_connections 100.0" in page


async def test_a_fleet_that_fits_is_not_warned_about_and_a_reload_that_grows_it_is(
    engine_server: EngineServer, start_gateway: StartGateway, tmp_path: Path
) -> None:
    urls = [await engine_server(FakeEngine()) for _ in range(3)]
    with capture_logs() as logs:
        r = await start_gateway([], toml=_toml(urls[:2], cap=50, pool_total=100))
    assert [e for e in logs if e["event"] == WARNING] == []
    (tmp_path / "gateway.toml").write_text(_toml(urls, cap=50, pool_total=100))
    with capture_logs() as logs:
        assert await r.gw.reload()
    [warning] = [e for e in logs if e["event"] == WARNING]
    assert (warning["key"], warning["pool"], warning["seats"]) == ("upstream.pool_total", 100, 150)
