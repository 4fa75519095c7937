"""The fault-matrix soak (`berth-loadgen bench soak --quick`) end to end, and the gauges it reads."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson

from gateway.telemetry.promtext import parse
from gateway.upstream.client import pool_counts
from loadgen.bench.reliability import soak
from loadgen.bench.reliability.soak_faults import SERVER_FAULTS
from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine


def test_the_quick_soak_holds_every_invariant(tmp_path: Path) -> None:
    status = soak.main(["--quick", "--out", str(tmp_path)])
    doc = orjson.loads((tmp_path / "report.json").read_bytes())
    failed = {name: inv["detail"] for name, inv in doc["invariants"].items() if not inv["pass"]}
    assert failed == {}
    assert status == 0
    for kind in SERVER_FAULTS:
        assert doc["faults_injected"][kind] >= 1, kind
    assert doc["drain"]["exit_code"] == 0
    assert (tmp_path / "report.md").read_text().startswith("# berth fault-matrix soak")


async def test_the_leak_gauges_follow_the_request_path(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    engine_url = await engine_server(FakeEngine())
    r = await start_gateway([engine_url + ",engine=vllm"])
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(r.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
        async with s.get(r.url + "/metrics") as resp:
            page = parse(await resp.text())
    assert (page.value("berth_asyncio_tasks") or 0) > 0
    assert page.value("berth_scheduler_waiting_requests") == 0
    assert page.value("berth_upstream_connections", state="in_use") == 0
    # the engine call's connection went back to its pool
    assert (page.value("berth_upstream_connections", state="idle") or 0) >= 1
    # the shared session (tokenize calls) is counted too: the reading of aiohttp's connector holds
    async with r.gw.session().get(engine_url + "/health") as resp:
        await resp.read()
    assert pool_counts(r.gw.session())[1] >= 1
