"""SLOs over loopback HTTP: the x-berth-* response headers, 400s naming a bad SLO header, a 429 with the
machine-readable reason when admission rejects, engine priority sent only to priority-scheduling
endpoints, per-class goodput and rejections in /metrics and /admin/fleet."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine

POLICY = """
name = "slo-test"
[ordering]
plugin = "slack"
[placement]
picker = { plugin = "max-score" }
filters = [{ plugin = "overflow-guard" }, { plugin = "best-fit" }]
[admission]
plugin = "slo-feasibility"
[slo]
default_class = "chat"
[[slo.classes]]
name = "ide"
ttft_ms = 5000.0
on_infeasible = "reject"
[[slo.classes]]
name = "chat"
e2e_ms = 60000.0
"""

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def gateway(tmp_path: Path, start: StartGateway, urls: list[str], policy_text: str = POLICY) -> Any:
    policy = tmp_path / "slo-test.toml"
    policy.write_text(policy_text)
    return await start(urls, toml=f'[policy]\nfile = "{policy}"\n')


async def post(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        return r.status, r.headers, await r.read()


async def test_every_response_carries_the_berth_headers(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine()
    gw = await gateway(tmp_path, start_gateway, [await engine_server(eng) + ",engine=vllm"])
    status, headers, _ = await post(gw.url, BODY, {"x-berth-slo-class": "ide"})
    assert status == 200
    assert headers["x-berth-endpoint"]
    assert float(headers["x-berth-queue-ms"]) >= 0.0
    assert headers["x-berth-slo-class"] == "ide"
    assert headers["x-berth-slo-met"] == "true"
    # a streamed answer: the verdict is not known when the headers go out
    status, headers, _ = await post(gw.url, {**BODY, "stream": True})
    assert status == 200
    assert headers["x-berth-slo-class"] == "chat"
    assert "x-berth-slo-met" not in headers
    # a deadline already impossible for a non-streamed answer: served, but not met
    status, headers, _ = await post(gw.url, BODY, {"x-berth-deadline-ms": "0.001"})
    assert (status, headers["x-berth-slo-met"]) == (200, "false")


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        pytest.param({"x-berth-ttft-ms": "soon"}, "x-berth-ttft-ms", id="malformed"),
        pytest.param({"x-berth-colour": "blue"}, "x-berth-colour", id="unknown-header"),
        pytest.param({"x-berth-task-sla-ms": "100"}, "x-berth-task-sla-ms", id="sla-without-task"),
    ],
)
async def test_bad_slo_headers_are_400s_naming_the_header(
    tmp_path: Path,
    engine_server: EngineServer,
    start_gateway: StartGateway,
    headers: dict[str, str],
    named: str,
) -> None:
    eng = FakeEngine()
    gw = await gateway(tmp_path, start_gateway, [await engine_server(eng) + ",engine=vllm"])
    status, resp_headers, raw = await post(gw.url, BODY, headers)
    assert status == 400
    err = orjson.loads(raw)["error"]
    assert (err["param"], err["code"]) == (named, "invalid_slo_header")
    assert named in err["message"]
    assert resp_headers["x-berth-slo-met"] == "false"
    assert eng.requests == []  # nothing reached the engine


async def test_an_infeasible_slo_is_rejected_with_its_reason(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine()
    gw = await gateway(tmp_path, start_gateway, [await engine_server(eng) + ",engine=vllm"])
    # the first token cannot come within 1 ms (the prefill alone takes longer): the class says reject
    status, headers, raw = await post(gw.url, BODY, {"x-berth-slo-class": "ide", "x-berth-ttft-ms": "1"})
    assert status == 429
    err = orjson.loads(raw)["error"]
    assert err["code"] == "slo_infeasible"
    assert err["type"] == "rate_limit_error"
    assert "first token predicted in" in err["message"]
    assert int(headers["Retry-After"]) >= 1
    assert headers["x-berth-slo-class"] == "ide"
    assert eng.requests == []
    # a class that holds infeasible requests is served anyway
    status, _, _ = await post(gw.url, BODY, {"x-berth-slo-class": "chat", "x-berth-ttft-ms": "1"})
    assert status == 200
    gw.gw.telemetry.refresh()  # readers see finished requests once the refresh loop folded them in
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/metrics") as r:
            metrics = (await r.read()).decode()
        async with s.get(gw.url + "/admin/fleet") as r:
            fleet = orjson.loads(await r.read())
    assert 'berth_rejections_total{reason="slo_infeasible",slo_class="ide"} 1.0' in metrics
    assert 'berth_admission_decisions_total{outcome="reject",slo_class="ide"} 1.0' in metrics
    assert 'berth_admission_decisions_total{outcome="hold",slo_class="chat"} 1.0' in metrics
    assert 'berth_slo_requests_total{result="missed",slo_class="ide"} 1.0' in metrics
    ide = fleet["slo"]["classes"]["ide"]
    assert ide["rejections"] == {"slo_infeasible": 1}
    assert ide["admission"] == {"reject": 1}
    assert ide["on_infeasible"] == "reject"


async def test_priority_goes_only_to_priority_scheduling_endpoints(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    plain, prio = FakeEngine(), FakeEngine()
    gw = await gateway(
        tmp_path,
        start_gateway,
        [
            await engine_server(plain) + ",engine=vllm,id=plain",
            await engine_server(prio) + ",engine=vllm,id=prio,scheduling=priority",
        ],
        # round robin: both endpoints get requests; the priority comes from the slack ordering
        POLICY.replace('filters = [{ plugin = "overflow-guard" }, { plugin = "best-fit" }]', "").replace(
            '"max-score"', '"round-robin"'
        ),
    )
    for _ in range(6):
        status, _, _ = await post(gw.url, BODY, {"x-berth-slo-class": "chat"})
        assert status == 200
    assert prio.requests
    assert all(r["priority"] == 2 for r in prio.requests)  # slack: it can wait (class 2)
    assert plain.requests
    assert all("priority" not in r for r in plain.requests)  # an FCFS vLLM would answer 400


async def test_tasks_share_one_clock(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine()
    gw = await gateway(tmp_path, start_gateway, [await engine_server(eng) + ",engine=vllm"])
    hdrs = {"x-berth-task-id": "task-1", "x-berth-task-sla-ms": "60000", "x-berth-slo-class": "chat"}
    for _ in range(3):
        status, _, _ = await post(gw.url, BODY, hdrs)
        assert status == 200
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/admin/fleet") as r:
        tasks = orjson.loads(await r.read())["slo"]["tasks"]
    assert tasks["active"] == 1
    assert tasks["step_seconds"]["chat"][2] is not None  # three steps measured


async def test_reloads_requested_during_a_reload_run_once_more_after_it(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    """SIGHUPs close together: the first reloads, those that come while it runs ask for one more
    reload after it (they used to raise inside the signal callback, and the next reload never ran)."""
    gw = await gateway(tmp_path, start_gateway, [await engine_server(FakeEngine()) + ",engine=vllm"])
    for _ in range(3):  # in one turn of the loop, as signal callbacks that came together run
        gw.gw.request_reload()
    while "reload" in gw.gw.supervisor.names:
        await asyncio.sleep(0)
    ok = gw.gw.metrics.registry.get_sample_value("berth_config_reloads_total", {"result": "ok"})
    assert ok == 2.0
    gw.gw.request_reload()  # and later ones run as before
    while "reload" in gw.gw.supervisor.names:
        await asyncio.sleep(0)
    assert gw.gw.metrics.registry.get_sample_value("berth_config_reloads_total", {"result": "ok"}) == 3.0


@pytest.mark.parametrize("choice", ["default", "reject"])
async def test_an_unknown_class_is_the_policys_choice(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway, choice: str
) -> None:
    policy = POLICY.replace('default_class = "chat"', f'default_class = "chat"\nunknown_class = "{choice}"')
    gw = await gateway(tmp_path, start_gateway, [await engine_server(FakeEngine()) + ",engine=vllm"], policy)
    status, headers, raw = await post(gw.url, BODY, {"x-berth-slo-class": "gold"})
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
        metrics = (await r.read()).decode()
    if choice == "reject":
        assert status == 400
        err = orjson.loads(raw)["error"]
        assert (err["param"], err["code"]) == ("x-berth-slo-class", "invalid_slo_header")
        assert "'gold'" in err["message"]
        assert headers["x-berth-slo-met"] == "false"
        assert "berth_slo_unknown_class_total{" not in metrics
    else:
        assert status == 200
        assert headers["x-berth-slo-class"] == "chat"
        assert 'berth_slo_unknown_class_total{slo_class="chat"} 1.0' in metrics
