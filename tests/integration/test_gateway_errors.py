"""Every error case of the front, the queue and the engine call: precise error, nothing leaked."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.core.types import ModelName
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine

CHAT = "/v1/chat/completions"
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


async def _post(url: str, body: bytes, method: str = "POST") -> tuple[int, dict[str, str], dict[str, object]]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url, data=body, headers={"Content-Type": "application/json"}) as r,
    ):
        return r.status, dict(r.headers), orjson.loads(await r.read())


def _error(body: dict[str, object]) -> dict[str, object]:
    err = body["error"]
    assert isinstance(err, dict)
    assert set(err) == {"message", "type", "param", "code"}
    return err


def _inflight(r: Running) -> int:
    return sum(e.inflight for e in r.gw.scheduler.snapshot().endpoints)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_json"),
        (b'{"messages": []}', "model", "invalid_request"),
        (b'{"model": "tiny", "messages": []}', "messages", "invalid_request"),
        (b'{"model": "tiny", "messages": [{"content": "x"}]}', "messages[0].role", "invalid_request"),
        (
            b'{"model": "tiny", "messages": [{"role": "user"}], "max_tokens": 0}',
            "max_tokens",
            "invalid_request",
        ),
        (b'{"model": "tiny", "messages": [{"role": "user"}], "stream": "yes"}', "stream", "invalid_request"),
    ],
    ids=["malformed", "not-object", "no-model", "empty-messages", "no-role", "zero-max-tokens", "bad-stream"],
)
async def test_bad_requests_get_400_naming_the_field(
    engine_server: EngineServer, start_gateway: StartGateway, body: bytes, param: str | None, code: str
) -> None:
    eng = FakeEngine()
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    status, _, resp = await _post(r.url + CHAT, body)
    err = _error(resp)
    assert status == 400
    assert err["param"] == param
    assert err["code"] == code
    if param:
        assert f"'{param}'" in str(err["message"])
    assert eng.requests == []


async def test_unknown_model_404_via_sdk(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    r = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    with pytest.raises(openai.NotFoundError) as ei:
        await r.client().chat.completions.create(model="nope", messages=MSG)
    assert ei.value.code == "model_not_found"
    async with aiohttp.ClientSession() as s, s.get(r.url + "/metrics") as resp:
        metrics = await resp.text()
    # a made-up name never becomes a label value (unbounded series)
    assert 'model="nope"' not in metrics
    assert 'berth_requests_total{model="-",outcome="unknown_model"} 1.0' in metrics


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", CHAT, 405),
        ("PUT", "/v1/completions", 405),
        ("POST", "/v1/models", 405),
        ("GET", "/v2/nothing", 404),
    ],
    ids=["get-chat", "put-completions", "post-models", "404"],
)
async def test_wrong_method_and_path(
    engine_server: EngineServer, start_gateway: StartGateway, method: str, path: str, status: int
) -> None:
    r = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    got, _, body = await _post(r.url + path, b"{}", method=method)
    assert got == status
    _error(body)


async def test_oversized_body_413(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    url = await engine_server(FakeEngine())
    r = await start_gateway(
        [], toml=f'[server]\nmax_body_bytes = 1000\n[[endpoints]]\nurl = "{url}"\nengine = "vllm"\n'
    )
    big = orjson.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 5000}]})
    status, _, body = await _post(r.url + CHAT, big)
    assert status == 413
    assert _error(body)["code"] == "request_too_large"


async def test_queue_full_429_with_retry_after(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    hold = asyncio.Event()
    eng = FakeEngine(hold=hold)
    url = await engine_server(eng)
    r = await start_gateway(
        [],
        toml=f"[limits]\nmax_queue_per_model = 1\nretry_after_s = 3\n"
        f'[[endpoints]]\nurl = "{url}"\nengine = "vllm"\ncap = 1\n',
    )
    client = r.client()
    first = asyncio.ensure_future(client.chat.completions.create(model="tiny", messages=MSG))
    await eng.started.wait()
    second = asyncio.ensure_future(client.chat.completions.create(model="tiny", messages=MSG))
    while r.gw.scheduler.queue_depth(ModelName("tiny")) == 0:
        await asyncio.sleep(0)
    with pytest.raises(openai.RateLimitError) as ei:
        await client.chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.response.headers["retry-after"] == "3"
    assert ei.value.code == "queue_full"
    hold.set()
    await asyncio.gather(first, second)
    assert _inflight(r) == 0


async def test_no_ready_endpoint_503(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    eng = FakeEngine(health_status=503)
    url = await engine_server(eng)
    r = await start_gateway([f"{url},engine=vllm,models=tiny"])
    with pytest.raises(openai.InternalServerError) as ei:
        await r.client().chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.status_code == 503
    assert ei.value.code == "no_ready_endpoint"
    assert "retry-after" in ei.value.response.headers
    async with aiohttp.ClientSession() as s, s.get(r.url + "/readyz") as resp:
        assert resp.status == 503


async def test_engine_500_retried_on_another_endpoint(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    bad, good = FakeEngine(fail_status=500), FakeEngine()
    r = await start_gateway(
        [await engine_server(bad) + ",engine=vllm,id=a", await engine_server(good) + ",engine=vllm,id=b"]
    )
    for _ in range(4):
        resp = await r.client().chat.completions.create(model="tiny", messages=MSG)
        assert resp.choices[0].message.content
    assert len(good.requests) == 4
    assert _inflight(r) == 0


async def test_engine_failing_everywhere_502(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    r = await start_gateway([await engine_server(FakeEngine(fail_status=500)) + ",engine=vllm"])
    with pytest.raises(openai.APIStatusError) as ei:
        await r.client().chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.status_code == 502
    assert ei.value.code == "engine_failed"
    assert _inflight(r) == 0


async def test_engine_4xx_passes_through(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    r = await start_gateway([await engine_server(FakeEngine(fail_status=400)) + ",engine=vllm"])
    with pytest.raises(openai.BadRequestError) as ei:
        await r.client().chat.completions.create(model="tiny", messages=MSG)
    assert "engine exploded" in ei.value.message


async def test_engine_timeout_504(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    eng = FakeEngine(hold=asyncio.Event())  # never released: the engine never answers
    url = await engine_server(eng)
    r = await start_gateway(
        [],
        toml=f"[upstream]\nfirst_byte_timeout_s = 0.2\nmax_retries = 0\n"
        f'[[endpoints]]\nurl = "{url}"\nengine = "vllm"\n',
    )
    with pytest.raises(openai.APIStatusError) as ei:
        await r.client().chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.status_code == 504
    await eng.aborted.wait()  # the engine saw its request cancelled
    assert _inflight(r) == 0


async def test_a_full_connection_pool_is_a_503_naming_the_limit_not_an_engine_failure(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    """A call that gets no pooled connection within connect_timeout_s (here: the pool's one connection
    is busy) never reached the engine: 503 upstream_pool_exhausted naming the limit, with Retry-After;
    not 502 engine_failed, nor 504 "no response within 120s"."""
    hold = asyncio.Event()
    eng = FakeEngine(hold=hold)
    url = await engine_server(eng)
    r = await start_gateway(
        [],
        toml="[upstream]\nconnect_timeout_s = 0.2\nmax_retries = 0\npool_per_host = 1\npool_total = 1\n"
        f'[[endpoints]]\nurl = "{url}"\nengine = "vllm"\n',
    )
    client = r.client()
    first = asyncio.ensure_future(client.chat.completions.create(model="tiny", messages=MSG))
    await eng.started.wait()  # the first call holds the pool's only connection
    with pytest.raises(openai.APIStatusError) as ei:
        await client.chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.status_code == 503
    assert ei.value.code == "upstream_pool_exhausted"
    assert ei.value.type == "service_unavailable_error"
    assert "no free connection to the engine within 0.2s" in ei.value.message
    assert "upstream.pool_total = 1" in ei.value.message
    assert ei.value.response.headers["Retry-After"] == "1"
    hold.set()
    assert (await first).choices[0].message.content
    assert len(eng.requests) == 1
    assert _inflight(r) == 0


async def test_engine_dies_mid_stream_error_event(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokens=10, die_after_tokens=3)
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    stream = await r.client().chat.completions.create(model="tiny", messages=MSG, stream=True)
    got = []
    with pytest.raises(openai.APIError) as ei:
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content if chunk.choices else None)
    assert "engine" in ei.value.message
    assert got == [" t0", " t1", " t2"]
    assert _inflight(r) == 0


async def test_stream_stall_times_out_with_error_event(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokens=10, stall_after_tokens=2)
    url = await engine_server(eng)
    r = await start_gateway(
        [], toml=f'[upstream]\nread_timeout_s = 0.3\n[[endpoints]]\nurl = "{url}"\nengine = "vllm"\n'
    )
    stream = await r.client().chat.completions.create(model="tiny", messages=MSG, stream=True)
    with pytest.raises(openai.APIError) as ei:
        async for _ in stream:
            pass
    assert "stalled" in ei.value.message
    await eng.aborted.wait()
    assert _inflight(r) == 0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
async def test_client_disconnect_aborts_engine_and_frees_slot(
    engine_server: EngineServer, start_gateway: StartGateway, stream: bool
) -> None:
    eng = FakeEngine(
        tokens=50, stall_after_tokens=2 if stream else None, hold=None if stream else asyncio.Event()
    )
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    body = orjson.dumps({"model": "tiny", "messages": MSG, "stream": stream})
    async with aiohttp.ClientSession() as s:
        if stream:
            resp = await s.post(r.url + CHAT, data=body)
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")  # first token arrived
            resp.close()  # the client goes away
        else:
            call = asyncio.ensure_future(s.post(r.url + CHAT, data=body))
            await eng.started.wait()  # the engine is working on it
            call.cancel()  # the client goes away before any answer
    await eng.aborted.wait()
    assert eng.running == 0
    assert _inflight(r) == 0


async def test_queued_client_disconnect_leaves_queue(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    hold = asyncio.Event()
    eng = FakeEngine(hold=hold)
    url = await engine_server(eng)
    r = await start_gateway([f"{url},engine=vllm,cap=1"])
    client = r.client()
    first = asyncio.ensure_future(client.chat.completions.create(model="tiny", messages=MSG))
    await eng.started.wait()
    async with aiohttp.ClientSession() as s:
        task = asyncio.ensure_future(
            s.post(r.url + CHAT, data=orjson.dumps({"model": "tiny", "messages": MSG}))
        )
        while r.gw.scheduler.queue_depth(ModelName("tiny")) == 0:
            await asyncio.sleep(0)
        task.cancel()
    while r.gw.driver.waiting:
        await asyncio.sleep(0)
    assert r.gw.scheduler.queue_depth(ModelName("tiny")) == 0
    hold.set()
    await first
    assert len(eng.requests) == 1  # the abandoned request never reached the engine
    assert _inflight(r) == 0


async def test_queue_timeout_503(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    eng = FakeEngine(hold=asyncio.Event())
    url = await engine_server(eng)
    r = await start_gateway(
        [],
        toml=f"[limits]\nmax_queue_wait_s = 0.2\n[upstream]\nmax_retries = 0\n"
        f'[[endpoints]]\nurl = "{url}"\nengine = "vllm"\ncap = 1\n',
    )
    client = r.client()
    first = asyncio.ensure_future(client.chat.completions.create(model="tiny", messages=MSG))
    await eng.started.wait()
    with pytest.raises(openai.InternalServerError) as ei:
        await client.chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.status_code == 503
    assert ei.value.code == "queue_timeout"
    first.cancel()


async def _post_with_id(r: Running, rid: str) -> tuple[int, str]:
    body = orjson.dumps({"model": "tiny", "messages": MSG})
    async with (
        aiohttp.ClientSession() as s,
        s.post(r.url + CHAT, data=body, headers={"X-Request-Id": rid}) as resp,
    ):
        await resp.read()
        return resp.status, resp.headers["X-Request-Id"]


@pytest.mark.parametrize(("cap", "n"), [(2, 2), (1, 3)], ids=["running-together", "queued-together"])
async def test_a_reused_request_id_is_only_echoed(
    engine_server: EngineServer, start_gateway: StartGateway, cap: int, n: int
) -> None:
    """Clients may send the same X-Request-Id twice: berth keys its scheduler by ids of its own, so the
    requests neither share a seat nor overwrite each other's place in the queue."""
    hold = asyncio.Event()
    eng = FakeEngine(hold=hold)
    r = await start_gateway([f"{await engine_server(eng)},engine=vllm,cap={cap}"])
    calls = [asyncio.ensure_future(_post_with_id(r, "same-id")) for _ in range(n)]
    while len(eng.requests) < cap or r.gw.scheduler.queue_depth(ModelName("tiny")) < n - cap:
        await asyncio.sleep(0)
    assert _inflight(r) == cap
    hold.set()
    async with asyncio.timeout(30):  # a guard: with shared keys a waiter is lost and never answered
        results = await asyncio.gather(*calls)
    assert results == [(200, "same-id")] * n
    assert len(eng.requests) == n
    assert _inflight(r) == 0
    assert r.gw.driver.waiting == 0
