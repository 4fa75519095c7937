"""Security through the real daemon over loopback: client keys ([auth] required, the keys file and its
reload, the api-key header, /v1/models), tenants' allowed classes and limits (429 rate_limited with
Retry-After, a disconnect gives the seat back), engine credentials (the key on generation, scrape and
tokenize; a refused key is engine_auth_failed), and the ops listener."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from gateway.admission.limits import Limit
from gateway.app import build_ops_app, warn_unauthenticated
from gateway.config import ADMIN_TOKEN_ENV, load_default_policy
from gateway.sched.plugins import default_registry
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.spec import EndpointSpec
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine

CHAT = "/v1/chat/completions"
KEY = "sk-team-a-0123456789"
OTHER_KEY = "sk-team-b-9876543210"
ENGINE_KEY = "engine-key-abcdef"
ADMIN = "admin-token-xyz"


@pytest.fixture(autouse=True)
def _no_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _endpoint(url: str, extra: str = "") -> str:
    return f'[[endpoints]]\nid = "e1"\nurl = "{url}"\nengine = "vllm"\n{extra}'


def _body(*, stream: bool = False, max_tokens: int = 5) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
        "max_tokens": max_tokens,
    }


async def _post(
    r: Running, headers: dict[str, str] | None = None, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, str], Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(r.url + CHAT, data=orjson.dumps(body or _body()), headers=headers) as resp,
    ):
        raw = await resp.read()
        return resp.status, dict(resp.headers), orjson.loads(raw) if raw.startswith(b"{") else raw


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ----------------------------------------------------------------- client authentication
def _auth_toml(url: str, *, required: bool) -> str:
    return (
        f"[auth]\nrequired = {'true' if required else 'false'}\n"
        f'[[tenants]]\nname = "team-a"\napi_key_sha256 = ["{_sha(KEY)}"]\n' + _endpoint(url)
    )


async def test_required_auth_answers_401_for_a_missing_or_unknown_key(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine()
    r = await start_gateway([], toml=_auth_toml(await engine_server(eng), required=True))
    for headers, message in (
        (None, "this gateway needs an API key"),
        (_bearer("sk-unknown"), "invalid API key"),
        ({"Authorization": f"Basic {KEY}"}, "this gateway needs an API key"),
        ({"api-key": "sk-unknown"}, "invalid API key"),
    ):
        status, resp_headers, body = await _post(r, headers)
        assert status == 401, headers
        assert body["error"]["code"] == "invalid_api_key"
        assert body["error"]["type"] == "invalid_request_error"
        assert message in body["error"]["message"]
        assert resp_headers["WWW-Authenticate"].startswith("Bearer")
        status, listing = await _get(r.url + "/v1/models", headers)
        assert status == 401
        assert orjson.loads(listing)["error"]["code"] == "invalid_api_key"
    assert eng.requests == []  # nothing reached the engine
    assert (await _post(r, _bearer(KEY)))[0] == 200
    assert (await _post(r, {"api-key": KEY}))[0] == 200  # as Azure-style SDKs send it
    status, listing = await _get(r.url + "/v1/models", _bearer(KEY))
    assert status == 200
    assert [m["id"] for m in orjson.loads(listing)["data"]] == ["tiny"]


async def test_without_required_auth_anyone_is_served(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway([], toml=_auth_toml(await engine_server(FakeEngine()), required=False))
    assert (await _post(r))[0] == 200
    assert (await _post(r, _bearer("sk-unknown")))[0] == 200
    assert (await _get(r.url + "/v1/models"))[0] == 200


async def test_the_openai_sdk_with_api_key_against_required_auth(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway([], toml=_auth_toml(await engine_server(FakeEngine()), required=True))
    async with openai.AsyncOpenAI(base_url=r.url + "/v1", api_key=KEY, max_retries=0) as client:
        out = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert out.choices[0].message.content
        assert [m.id async for m in client.models.list()] == ["tiny"]
    async with openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="sk-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as e:
            await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert e.value.code == "invalid_api_key"


async def test_the_keys_file_reloads(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[keys]]\ntenant = "team-a"\nsha256 = "{_sha(KEY)}"\n')
    toml = (
        '[auth]\nrequired = true\nkeys_file = "keys.toml"\n[[tenants]]\nname = "team-a"\n'
        '[[tenants]]\nname = "team-b"\n' + _endpoint(await engine_server(FakeEngine()))
    )
    r = await start_gateway([], toml=toml)
    assert (await _post(r, _bearer(KEY)))[0] == 200
    assert (await _post(r, _bearer(OTHER_KEY)))[0] == 401
    keys.write_text(f'[[keys]]\ntenant = "team-b"\nsha256 = "{_sha(OTHER_KEY)}"\n')
    assert await r.gw.reload()
    assert (await _post(r, _bearer(OTHER_KEY)))[0] == 200
    assert (await _post(r, _bearer(KEY)))[0] == 401  # removed from the file: gone
    # a broken keys file is rejected whole: the keys in force stay
    keys.write_text('[[keys]]\ntenant = "team-c"\nsha256 = "00"\n')
    with capture_logs() as logs:
        assert not await r.gw.reload()
    [rejected] = [e for e in logs if e["event"] == "config_reload_rejected"]
    assert "keys.toml:keys[0].tenant: unknown tenant 'team-c'" in rejected["error"]
    assert (await _post(r, _bearer(OTHER_KEY)))[0] == 200


def test_a_public_listener_without_required_auth_is_warned_about() -> None:
    with capture_logs() as logs:
        warn_unauthenticated(False, "0.0.0.0", 8080)
        warn_unauthenticated(False, "127.0.0.1", 8080)
        warn_unauthenticated(False, "::1", 8080)
        warn_unauthenticated(False, "localhost", 8080)
        warn_unauthenticated(True, "10.0.0.5", 8080)
    assert [(e["event"], e["listen"]) for e in logs] == [("auth_not_required", "0.0.0.0:8080")]


# ----------------------------------------------------------------- tenants: classes and limits
def _tenant_toml(url: str, tenant: str, auth: str = "") -> str:
    return (
        f"[auth]\nrequired = true\n{auth}"
        f'[[tenants]]\nname = "team-a"\napi_keys = ["{KEY}"]\n{tenant}' + _endpoint(url)
    )


def _classes() -> list[str]:
    return list(load_default_policy(default_registry()).slo.classes)


async def test_a_class_outside_allowed_classes_is_downgraded_or_refused(
    engine_server: EngineServer, start_gateway: StartGateway, tmp_path: Path
) -> None:
    url = await engine_server(FakeEngine())
    r = await start_gateway([], toml=_tenant_toml(url, ""))
    first, second, *_ = _classes()
    tenant = f'allowed_classes = ["{first}"]\n'
    (tmp_path / "gateway.toml").write_text(_tenant_toml(url, tenant))
    assert await r.gw.reload()
    status, headers, _ = await _post(r, {**_bearer(KEY), "x-berth-slo-class": second})
    assert (status, headers["X-Berth-Slo-Class"]) == (200, first)
    status, headers, _ = await _post(r, {**_bearer(KEY), "x-berth-slo-class": first})
    assert (status, headers["X-Berth-Slo-Class"]) == (200, first)
    (tmp_path / "gateway.toml").write_text(_tenant_toml(url, tenant, 'class_not_allowed = "reject"\n'))
    assert await r.gw.reload()
    status, _, body = await _post(r, {**_bearer(KEY), "x-berth-slo-class": second})
    assert status == 403
    assert body["error"]["code"] == "slo_class_not_allowed"
    assert body["error"]["param"] == "x-berth-slo-class"
    _, metrics = await _get(r.url + "/metrics")
    assert 'berth_tenant_class_downgrades_total{tenant="team-a"} 1.0' in metrics.decode()


def _rate_limited(limit: str) -> dict[str, Any]:
    return {
        "error": {
            "message": f"rate limit exceeded: this API key's {limit}",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limited",
        }
    }


async def _counted(r: Running, *lines: str) -> None:
    text = (await _get(r.url + "/metrics"))[1].decode()
    for line in lines:
        assert line in text, line


async def test_requests_per_s_answers_429_with_retry_after(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine()
    r = await start_gateway([], toml=_tenant_toml(await engine_server(eng), "requests_per_s = 0.01\n"))
    assert (await _post(r, _bearer(KEY)))[0] == 200
    status, headers, body = await _post(r, _bearer(KEY))
    assert (status, body) == (429, _rate_limited("requests_per_s"))
    assert headers["Retry-After"] == "100"  # one request at 0.01 a second, rounded up
    assert len(eng.requests) == 1
    await _counted(
        r,
        'berth_tenant_rate_limited_total{limit="requests_per_s",tenant="team-a"} 1.0',
        'berth_tenant_requests_total{outcome="rate_limited",tenant="team-a"} 1.0',
        'berth_tenant_requests_total{outcome="ok",tenant="team-a"} 1.0',
        'berth_rejections_total{reason="rate_limited",',
    )


async def test_tokens_per_min_charges_the_estimate_and_corrects_it_with_the_usage(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokens=400)  # usage: 3 prompt + 400 completion tokens
    r = await start_gateway([], toml=_tenant_toml(await engine_server(eng), "tokens_per_min = 600\n"))
    body = _body(max_tokens=450)  # charged at admission: the prompt estimate + 450
    assert (await _post(r, _bearer(KEY), body))[0] == 200
    level = r.gw.services.tenancy.limiter.level("team-a", Limit.TOKENS, r.gw.clock.now())
    assert level is not None
    assert 197 <= level < 240  # 600 - 403 used (plus what refilled since); uncharged 450 - 400 came back
    status, headers, answer = await _post(r, _bearer(KEY), body)
    assert (status, answer) == (429, _rate_limited("tokens_per_min"))
    assert 20 <= int(headers["Retry-After"]) <= 27  # (~452 - ~200) tokens at 10 a second, rounded up
    await _counted(r, 'berth_tenant_rate_limited_total{limit="tokens_per_min",tenant="team-a"} 1.0')


async def test_max_concurrency_answers_429_and_a_disconnect_gives_the_seat_back(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokens=50, hold=asyncio.Event())
    r = await start_gateway([], toml=_tenant_toml(await engine_server(eng), "max_concurrency = 1\n"))
    tenancy = r.gw.services.tenancy
    async with aiohttp.ClientSession() as client:
        first = asyncio.ensure_future(
            client.post(r.url + CHAT, data=orjson.dumps(_body(stream=True)), headers=_bearer(KEY))
        )
        await eng.started.wait()
        assert tenancy.limiter.inflight("team-a") == 1
        status, headers, body = await _post(r, _bearer(KEY))
        assert (status, body["error"]["code"], headers["Retry-After"]) == (429, "rate_limited", "1")
        assert "max_concurrency" in body["error"]["message"]
        first.cancel()  # the client goes away while the engine holds its request
        with pytest.raises(asyncio.CancelledError):
            await first
    await eng.aborted.wait()  # the gateway closed the engine call: its finish phase has run
    assert tenancy.limiter.inflight("team-a") == 0
    eng.hold = None
    assert (await _post(r, _bearer(KEY)))[0] == 200
    _, metrics = await _get(r.url + "/metrics")
    assert 'berth_tenant_requests_total{outcome="client_disconnect",tenant="team-a"} 1.0' in metrics.decode()


async def test_tenant_usage_is_counted_with_anonymous_for_requests_without_a_tenant(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway([], toml=_auth_toml(await engine_server(FakeEngine(tokens=7)), required=False))
    assert (await _post(r, _bearer(KEY)))[0] == 200
    assert (await _post(r))[0] == 200
    _, metrics = await _get(r.url + "/metrics")
    text = metrics.decode()
    for tenant in ("team-a", "anonymous"):
        assert f'berth_tenant_requests_total{{outcome="ok",tenant="{tenant}"}} 1.0' in text
        assert f'berth_tenant_completion_tokens_total{{tenant="{tenant}"}} 5.0' in text  # max_tokens
        assert f'berth_tenant_prompt_tokens_total{{tenant="{tenant}"}} 3.0' in text  # the engine's usage


# ----------------------------------------------------------------- engine credentials
@pytest.fixture
async def keyed_sim() -> AsyncIterator[SimFleet]:
    spec = EndpointSpec(
        models=("tiny",),
        profile="test-fast",
        load_time_s=0.0,
        output_len=LengthDist("fixed", 4.0),
        api_key=ENGINE_KEY,
    )
    async with SimFleet([spec]) as f:
        yield f


async def test_the_engine_key_is_sent_on_generation_and_scrapes(
    keyed_sim: SimFleet, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E1_KEY", ENGINE_KEY)
    [url] = keyed_sim.urls
    # no `models`: they are discovered from the sim's /v1/models, which answers only with the key
    r = await start_gateway([], toml=f'[[endpoints]]\nid = "e1"\nurl = "{url}"\napi_key_env = "E1_KEY"\n')
    assert r.gw.scheduler.models(ready_only=True) == {"tiny"}
    for stream in (False, True):
        status, _, _ = await _post(r, body=_body(stream=stream))
        assert status == 200
    doc = orjson.loads((await _get(r.url + "/admin/fleet"))[1])
    [ep] = doc["endpoints"]
    assert ep["auth"] == {"state": "ok", "failing_routes": {}}
    assert ep["engine"] == "vllm"  # detected from the sim's /metrics, which needs the key too
    assert ep["gauges"]["fresh"] is True


async def test_the_engine_key_is_sent_to_tokenize(
    engine_server: EngineServer, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E1_KEY", ENGINE_KEY)
    eng = FakeEngine(api_key=ENGINE_KEY, tokenize_count=3)
    url = await engine_server(eng)
    toml = '[telemetry]\nprompt_tokens = "tokenize"\ntokenize_timeout_s = 5\n' + _endpoint(
        url, 'api_key_env = "E1_KEY"\n'
    )
    r = await start_gateway([], toml=toml)
    assert (await _post(r))[0] == 200
    assert eng.tokenizes  # counted by the engine, with the key
    for path in ("/tokenize", CHAT, "/health", "/metrics", "/v1/models"):
        assert set(eng.authorization[path]) == {f"Bearer {ENGINE_KEY}"}, path


async def test_an_engine_that_refuses_the_key_is_a_configuration_error(
    keyed_sim: SimFleet, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("E1_KEY", "not-the-engine-key")
    [url] = keyed_sim.urls
    toml = "[upstream]\nmax_retries = 3\n" + _endpoint(url, 'models = ["tiny"]\napi_key_env = "E1_KEY"\n')
    with capture_logs() as logs:
        r = await start_gateway([], toml=toml)
        for _ in range(3):
            status, _, body = await _post(r)
            assert status == 502
            assert body["error"]["code"] == "engine_auth_failed"
        await r.scrape()
    failed = [e for e in logs if e["event"] == "engine_auth_failed"]
    assert len(failed) == 1  # once per endpoint per change
    assert failed[0]["endpoint"] == "e1"
    assert all("not-the-engine-key" not in repr(e) for e in logs)
    doc = orjson.loads((await _get(r.url + "/admin/fleet"))[1])
    [ep] = doc["endpoints"]
    assert ep["auth"]["state"] == "failed"
    assert ep["auth"]["failing_routes"]["generation"] == 401
    _, metrics = await _get(r.url + "/metrics")
    text = metrics.decode()
    assert 'berth_endpoint_auth_failed{endpoint="e1"} 1.0' in text
    assert "berth_engine_auth_failures_total" in text
    assert "berth_upstream_retries_total{" not in text  # not an engine failure: no retry elsewhere
    # the operator fixes the key and reloads: the endpoint works and its state clears
    monkeypatch.setenv("E1_KEY", ENGINE_KEY)
    (tmp_path / "gateway.toml").write_text(toml)
    with capture_logs() as logs:
        assert await r.gw.reload()
        assert (await _post(r))[0] == 200
        await r.scrape()
    doc = orjson.loads((await _get(r.url + "/admin/fleet"))[1])
    assert doc["endpoints"][0]["auth"]["state"] == "ok"


# ----------------------------------------------------------------- ops listener
async def test_the_ops_listener_takes_metrics_and_admin_off_the_public_port(
    engine_server: EngineServer, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, ADMIN)
    url = await engine_server(FakeEngine())
    toml = '[ops]\nlisten = "127.0.0.1:0"\nrequire_admin_token_for_metrics = true\n' + _endpoint(url)
    r = await start_gateway([], toml=toml)
    for path in ("/metrics", "/admin/fleet"):
        status, body = await _get(r.url + path, _bearer(ADMIN))
        assert status == 404, path
        assert orjson.loads(body)["error"]["code"] == "not_found"
    for path in ("/healthz", "/readyz", "/v1/models"):  # probes stay where load balancers look
        assert (await _get(r.url + path))[0] == 200, path
    ops = TestServer(build_ops_app(r.gw))
    await ops.start_server()
    try:
        base = str(ops.make_url("")).rstrip("/")
        assert (await _get(base + "/metrics"))[0] == 401  # behind the admin token
        status, body = await _get(base + "/metrics", _bearer(ADMIN))
        assert status == 200
        assert b"berth_requests_total" in body or b"berth_" in body
        assert (await _get(base + "/admin/fleet", _bearer(ADMIN)))[0] == 200
        assert (await _get(base + "/healthz"))[0] == 200
        assert (await _get(base + "/v1/models"))[0] == 404  # the ops port serves no client routes
    finally:
        await ops.close()


async def test_without_an_ops_listener_metrics_can_still_need_the_admin_token(
    engine_server: EngineServer, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, ADMIN)
    url = await engine_server(FakeEngine())
    r = await start_gateway([], toml="[ops]\nrequire_admin_token_for_metrics = true\n" + _endpoint(url))
    assert (await _get(r.url + "/metrics"))[0] == 401
    assert (await _get(r.url + "/metrics", _bearer(ADMIN)))[0] == 200
    plain = await start_gateway([], toml=_endpoint(url))
    assert (await _get(plain.url + "/metrics"))[0] == 200
