"""Telemetry through the real daemon over loopback: GET /admin/fleet (shape and access), GET
/admin/loop-lag (the recent lag samples, behind the same access rule), fitted
coefficients after traffic (refit called directly, no waiting for the background interval), stale
metrics failing open, and `berth top --once` against a running gateway."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import make_mocked_request
from structlog.testing import capture_logs

from gateway.cli import main
from gateway.config import ADMIN_TOKEN_ENV
from gateway.front.admin import fleet as fleet_route
from gateway.front.admin import loop_lag as loop_lag_route
from gateway.front.services import SERVICES
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.spec import EndpointSpec
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine

REPO = Path(__file__).resolve().parents[2]

TOKEN = "s3cret-admin"


@pytest.fixture(autouse=True)
def _no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def fleet(r: Running, token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    status, _, body = await get(r.url + "/admin/fleet", headers)
    assert status == 200, body
    doc = orjson.loads(body)
    assert isinstance(doc, dict)
    return doc


async def chat(r: Running, *, stream: bool, content: str = "hello there", max_tokens: int = 5) -> None:
    async with r.client() as client:
        if stream:
            s = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": content}],
                stream=True,
                max_tokens=max_tokens,
            )
            async for _ in s:
                pass
        else:
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": content}], max_tokens=max_tokens
            )


async def test_the_fleet_document_on_loopback_without_a_token(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokens=6, running=2, waiting=1)
    r = await start_gateway([await engine_server(eng) + ",engine=vllm,class=interactive"])
    await chat(r, stream=True)
    await chat(r, stream=False)
    r.gw.telemetry.refresh()
    doc = await fleet(r)
    assert {
        "version",
        "uptime_s",
        "policy",
        "ready",
        "fail_open",
        "endpoints",
        "models",
        "attainment",
        "telemetry",
    } <= set(doc)
    assert doc["ready"] is True
    assert doc["fail_open"]["active"] is False
    [ep] = doc["endpoints"]
    assert (ep["state"], ep["class"], ep["engine"]) == ("ready", "interactive", "vllm")
    assert ep["models"] == ["tiny"]
    assert ep["group"] is None  # the default policy has no endpoint groups
    assert ep["gauges"]["fresh"] is True
    assert (ep["gauges"]["running"], ep["gauges"]["waiting"], ep["gauges"]["kv_usage"]) == (2.0, 1.0, 0.25)
    assert ep["gauges"]["scrape_age_s"] >= 0
    assert ep["inflight"] == 0
    assert ep["running_by_kind"] == {"interactive": 0, "batch": 0}
    assert ep["running_context"] == {"prompt_tokens": 0, "predicted_output_tokens": 0.0}
    assert ep["latency"]["ttft_s"]["n"] == 1  # the stream; the non-streamed answer has no first token
    assert ep["latency"]["ttft_s"]["ewma"] > 0
    assert set(ep["latency"]["itl_s"]) == {"ewma", "p50", "p90", "p99", "n"}
    assert set(ep["perf"]) == {"prefill", "decode", "kv", "throughput"}
    assert set(ep["perf"]["prefill"]) == {"k1", "c1", "mape", "n"}
    assert ep["perf"]["prefill"]["n"] == 0  # still the prior
    assert set(ep["engine_check"]) == {"ttft", "itl"}
    assert set(ep["prediction_error"]) == {"ttft", "itl"}
    model = doc["models"]["tiny"]
    assert model["queued"] == {}
    assert model["queued_total"] == 0
    assert model["chars_per_token"] > 0
    assert model["groups"] == {}
    assert model["latency"]["ttft_s"]["n"] == 1
    assert doc["attainment"]["classes"] == {"default": {"finished": 2, "met": 2, "ratio": 1.0}}
    assert doc["telemetry"]["pending"] == 0


async def test_the_fleet_document_shows_the_endpoint_groups_of_demand_split(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    urls = [await engine_server(FakeEngine()) + f",engine=vllm,id=e{i}" for i in range(3)]
    r = await start_gateway(urls, toml=f'[policy]\nfile = "{REPO / "policies" / "coding-assistant.toml"}"\n')
    async with r.client() as client:
        await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "write a function"}],
            max_tokens=5,
            extra_headers={"x-berth-slo-class": "generation"},
        )
    doc = await fleet(r)
    groups = doc["models"]["tiny"]["groups"]
    # only generation asked for engine time so far: its group has all but the other group's one
    assert groups == {
        "decode": {"share": 1.0, "endpoints": ["e0", "e1"]},
        "context": {"share": 0.0, "endpoints": ["e2"]},
    }
    assert {ep["id"]: ep["group"] for ep in doc["endpoints"]} == {
        "e0": "decode",
        "e1": "decode",
        "e2": "context",
    }


async def test_a_configured_token_is_required_even_on_loopback(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    url = await engine_server(FakeEngine())
    r = await start_gateway([url + ",engine=vllm"], toml=f'[server]\nadmin_token = "{TOKEN}"\n')
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        status, resp_headers, body = await get(r.url + "/admin/fleet", headers)
        assert status == 401
        assert resp_headers["WWW-Authenticate"].startswith("Bearer")
        err = orjson.loads(body)["error"]
        assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_api_key")
    doc = await fleet(r, TOKEN)
    assert len(doc["endpoints"]) == 1
    async with aiohttp.ClientSession() as s, s.post(r.url + "/admin/fleet") as resp:
        assert resp.status == 405


async def test_without_a_token_remote_clients_are_forbidden(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    app = aiohttp.web.Application()
    app[SERVICES] = r.gw.services
    remote = make_mocked_request("GET", "/admin/fleet", app=app).clone(remote="192.0.2.7")
    resp = await fleet_route(remote)
    assert resp.status == 403
    assert isinstance(resp, aiohttp.web.Response)
    assert resp.body is not None
    err = orjson.loads(resp.body)["error"]  # type: ignore[arg-type]
    assert err["code"] == "forbidden"
    assert "loopback" in err["message"]
    local = make_mocked_request("GET", "/admin/fleet", app=app).clone(remote="127.0.0.1")
    assert (await fleet_route(local)).status == 200


async def test_the_lag_monitor_samples_at_the_configured_interval(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway(
        [await engine_server(FakeEngine()) + ",engine=vllm"], toml="[ops]\nloop_lag_interval_s = 0.002\n"
    )
    recent = r.gw.metrics.loop_lag_recent
    three_more = asyncio.Event()
    start, observe = recent.taken, recent.observe

    def counting(amount: float) -> None:
        observe(amount)
        if recent.taken >= start + 3:
            three_more.set()

    recent.observe = counting  # type: ignore[method-assign]
    await asyncio.wait_for(three_more.wait(), timeout=5.0)  # the monitor's own samples (2 ms apart)
    doc = orjson.loads((await get(r.url + f"/admin/loop-lag?after={start}"))[2])
    assert doc["interval_s"] == 0.002
    times = [t for t, _ in doc["samples"]]
    # Not a timing bound: at the default interval every gap is at least 100 ms; at 2 ms one of them
    # would have to be delayed 50 times over for the smallest to reach 100 ms.
    assert min(b - a for a, b in itertools.pairwise(times)) < 0.1


async def test_the_loop_lag_samples_since_a_count(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    recent = r.gw.metrics.loop_lag_recent
    recent.observe(0.0042)  # a sample of our own beside the monitor's (whose values are the machine's)
    mine = recent.taken
    status, headers, body = await get(r.url + "/admin/loop-lag")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    doc = orjson.loads(body)
    assert doc["interval_s"] == 0.1
    assert doc["taken"] >= mine
    assert [lag for _, lag in doc["samples"][mine - 1 : mine]] == [0.0042]
    status, _, body = await get(r.url + f"/admin/loop-lag?after={mine - 1}")
    assert [lag for _, lag in orjson.loads(body)["samples"]][:1] == [0.0042]
    status, _, body = await get(r.url + "/admin/loop-lag?after=soon")
    assert status == 400
    assert orjson.loads(body)["error"]["param"] == "after"
    # the garbage collector's pauses beside the samples (one of our own, kept: 1 ms or more)
    pauses = r.gw.metrics.gc_pauses
    pauses.callback("start", {"generation": 2})
    pauses._started -= 0.01  # a pause of 10 ms, without a collection
    pauses.callback("stop", {"generation": 2, "collected": 0})
    status, _, body = await get(r.url + f"/admin/loop-lag?gc_after={pauses.recent_taken - 1}")
    gc_doc = orjson.loads(body)["gc"]
    assert gc_doc["taken"] >= pauses.recent_taken
    assert [(gen, round(s, 2)) for _, gen, s, _ in gc_doc["pauses"]][:1] == [(2, 0.01)]
    assert gc_doc["generations"]["2"]["count"] >= 1
    status, _, body = await get(r.url + "/admin/loop-lag?gc_after=soon")
    assert orjson.loads(body)["error"]["param"] == "gc_after"
    app = aiohttp.web.Application()
    app[SERVICES] = r.gw.services
    remote = make_mocked_request("GET", "/admin/loop-lag", app=app).clone(remote="192.0.2.7")
    assert (await loop_lag_route(remote)).status == 403


async def test_the_loop_lag_takes_the_admin_token(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    url = await engine_server(FakeEngine())
    r = await start_gateway([url + ",engine=vllm"], toml=f'[server]\nadmin_token = "{TOKEN}"\n')
    assert (await get(r.url + "/admin/loop-lag"))[0] == 401
    assert (await get(r.url + "/admin/loop-lag", {"Authorization": f"Bearer {TOKEN}"}))[0] == 200


@pytest.fixture
async def sim() -> AsyncIterator[SimFleet]:
    spec = EndpointSpec(
        flavor="vllm",
        models=("tiny",),
        profile="test-fast",
        speed=0.25,  # iterations of ~8 ms: a loaded loop seldom reads two tokens at once (see below)
        load_time_s=0.0,
        output_len=LengthDist("fixed", 8.0),
    )
    async with SimFleet([spec]) as f:
        yield f


async def test_fitted_coefficients_appear_after_traffic(sim: SimFleet, start_gateway: StartGateway) -> None:
    r = await start_gateway([sim.urls[0] + ",engine=vllm"], toml="[telemetry]\nmin_observations = 8\n")
    await r.scrape()  # the simulator exports vllm:cache_config_info
    words = [5, 20, 60, 150, 300, 600, 1000, 1500, 2000, 2500, 40, 900]
    for n in words:
        await chat(r, stream=True, content="word " * n, max_tokens=8)
    # and some at once, so the batch size varies too
    await asyncio.gather(*(chat(r, stream=True, content="word " * n, max_tokens=8) for n in words[:6]))
    tel = r.gw.telemetry
    tel.refresh(refit=True)
    doc = await fleet(r)
    [ep] = doc["endpoints"]
    assert ep["kv_capacity_tokens"] == 8192  # num_gpu_blocks x block_size of the simulator
    assert ep["latency"]["ttft_s"]["n"] == len(words) + 6
    prefill = ep["perf"]["prefill"]
    # Fitted: no longer the prior. Each request sent alone found the endpoint idle (its TTFT is one
    # prefill, unless its first token was read together with its second: held back on the way); the six
    # sent at once give one observation per prefill iteration that can be timed.
    assert 8 <= prefill["n"] <= len(words) + 6
    assert prefill["mape"] is not None
    assert prefill["k1"] > 0 or prefill["c1"] > 0
    assert ep["prediction_error"]["ttft"] is not None
    # the scheduler sees the same numbers as plain fields of the endpoint's view
    view = r.gw.scheduler.endpoint_view(r.gw.scheduler.endpoint_ids()[0])
    assert view is not None
    assert view.perf is not None
    assert view.perf.n_prefill == prefill["n"]
    assert view.kv_capacity_tokens == 8192
    assert view.ttft_ewma_s is not None
    # the prompt-token estimate calibrated from the usage the simulator reported
    assert tel.tokens.observations("tiny") > 0
    _, _, body = await get(r.url + "/metrics")
    text = body.decode()
    eid = ep["id"]
    assert f'berth_perfmodel_coefficient{{coefficient="k1",endpoint="{eid}"}}' in text
    assert f'berth_perfmodel_fit_error_ratio{{endpoint="{eid}",part="prefill"}}' in text
    assert f'berth_prediction_error_ratio{{endpoint="{eid}",quantity="ttft"}}' in text
    assert f'berth_endpoint_kv_capacity_tokens{{endpoint="{eid}"}} 8192.0' in text
    assert 'berth_slo_attainment_ratio{slo_class="default"} 1.0' in text


async def test_stale_metrics_fail_open_with_a_metric_and_a_log_event(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(metrics_status=500)
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    with capture_logs() as logs:
        r.gw.telemetry.refresh()
    assert [e["event"] for e in logs if e["event"].startswith("telemetry_")] == ["telemetry_fail_open"]
    _, _, body = await get(r.url + "/metrics")
    text = body.decode()
    assert "berth_telemetry_fail_open 1.0" in text
    assert "berth_telemetry_fail_open_events_total 1.0" in text
    await chat(r, stream=False)  # routing still proceeds, on the gateway's own counts
    doc = await fleet(r)
    assert doc["fail_open"]["active"] is True
    assert doc["endpoints"][0]["gauges"]["fresh"] is False
    eng.metrics_status = 200
    await r.scrape()
    with capture_logs() as logs:
        r.gw.telemetry.refresh()
    assert [e["event"] for e in logs if e["event"].startswith("telemetry_")] == ["telemetry_fresh_again"]
    _, _, body = await get(r.url + "/metrics")
    assert "berth_telemetry_fail_open 0.0" in body.decode()


async def test_berth_top_once_prints_a_frame_of_a_running_gateway(
    engine_server: EngineServer, start_gateway: StartGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    r = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    await chat(r, stream=True)
    r.gw.telemetry.refresh()
    eid = r.gw.scheduler.endpoint_ids()[0]
    code = await asyncio.to_thread(main, ["top", "--once", "--url", r.url])
    out = capsys.readouterr().out  # (the daemon's own log lines land there too in tests)
    assert code == 0
    assert any(line.startswith("berth 0.") for line in out.splitlines())
    assert "\x1b" not in out
    for text in ("ENDPOINTS", "PERFORMANCE MODELS", "MODELS", "SLO ATTAINMENT", eid, "tiny"):
        assert text in out
    assert any(line.split()[:3] == ["default", "1", "1"] for line in out.splitlines())


async def test_berth_top_uses_the_admin_token(
    engine_server: EngineServer, start_gateway: StartGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    r = await start_gateway(
        [await engine_server(FakeEngine()) + ",engine=vllm"], toml=f'[server]\nadmin_token = "{TOKEN}"\n'
    )
    assert await asyncio.to_thread(main, ["top", "--once", "--url", r.url]) == 1
    assert "HTTP 401" in capsys.readouterr().err
    assert await asyncio.to_thread(main, ["top", "--once", "--url", r.url, "--token", TOKEN]) == 0
    assert "ENDPOINTS" in capsys.readouterr().out


async def test_the_scheduler_call_times_after_a_request(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    async with r.client() as client:
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    status, headers, body = await get(r.url + "/admin/sched-decisions")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    doc = orjson.loads(body)
    calls = doc["calls"]
    assert calls["submit"]["count"] >= 1
    assert calls["complete"]["count"] >= 1
    assert calls["endpoint"]["count"] >= 1  # the endpoint set, its health, its scrapes
    assert doc["max_s"] == max(c["max_s"] for c in calls.values())
    assert calls["submit"]["le"][-1] == calls["submit"]["count"]
    _, _, metrics = await get(r.url + "/metrics")
    assert b'berth_sched_decision_seconds_bucket{call="submit",le="+Inf"}' in metrics
    assert b'berth_sched_decision_max_seconds{call="complete"}' in metrics
    # The collector's schedule is wired to the same registry.
    assert b'berth_gc_scheduled_collections_total{kind="young"}' in metrics
    assert b"berth_gc_full_growth_ratio 0.25" in metrics
