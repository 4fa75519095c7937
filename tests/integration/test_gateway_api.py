"""The OpenAI API through berth, with the official openai SDK, in front of fake engines over loopback."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine


async def test_chat_non_streaming_and_request_id(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine()
    gw = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    client = gw.client()
    raw = await client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_headers={"x-request-id": "req-abc"},
    )
    resp = raw.parse()
    assert resp.choices[0].message.content == " t0 t1 t2"
    assert resp.model == "tiny"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 3
    assert raw.headers["x-request-id"] == "req-abc"
    assert raw.headers["x-berth-endpoint"]
    # the engine got the body berth forwarded, including fields berth does not know
    assert eng.requests[-1]["max_tokens"] == 3
    # berth relays bodies as they come, so it asks the engine for no compression; and it keys the
    # engine call by an id of its own (the client's is only echoed)
    sent = eng.request_headers[-1]
    assert sent["accept-encoding"] == "identity"
    assert sent["x-request-id"] != "req-abc"


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage", "no-usage"])
async def test_chat_streaming_usage_only_when_asked(
    engine_server: EngineServer, start_gateway: StartGateway, include_usage: bool
) -> None:
    eng = FakeEngine(tokens=4)
    gw = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    stream = await gw.client().chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True} if include_usage else None,
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == " t0 t1 t2 t3"
    assert (usage is not None) == include_usage
    # berth always asked the engine for usage, so it can count tokens either way
    assert eng.requests[-1]["stream_options"] == {"include_usage": True}
    metrics = await _get_text(gw.url + "/metrics")
    assert 'berth_output_tokens_total{model="tiny"} 4.0' in metrics


async def test_a_stream_reaches_the_engine_as_the_client_wrote_it(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    """berth adds its usage request in front of the client's bytes; it does not serialise the body again
    (which would, e.g., turn 7e-1 into 0.7 and drop the client's spacing)."""
    eng = FakeEngine(tokens=2)
    gw = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    raw = (
        b'{"model": "tiny", "stream": true, "temperature": 7e-1,\n'
        b' "messages": [{"role": "user", "content": "h\\u00e9"}]}'
    )
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}) as r,
    ):
        assert r.status == 200
        events = (await r.read()).split(b"\n\n")
    assert b"data: [DONE]" in events
    assert eng.raw_requests[-1] == b'{"stream_options":{"include_usage":true},' + raw[1:]


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(FakeEngine(tokens=2, pause_after_tokens=0), id="engine-headers-alone"),
        pytest.param(FakeEngine(tokens=2, role_chunk=True, split_role_chunk=True), id="half-an-event"),
    ],
)
async def test_a_stream_has_its_headers_before_its_first_event(
    engine_server: EngineServer, start_gateway: StartGateway, engine: FakeEngine
) -> None:
    """berth sends a stream's headers with its first event when that event came with the engine's
    headers; when it did not (the engine sent its headers alone, or only part of an event), the client
    gets its headers at once, without waiting for the event."""
    gw = await start_gateway([await engine_server(engine) + ",engine=vllm"])
    body = orjson.dumps({"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(30):  # a guard: headers held for an event that is not coming hang here
            r = await s.post(gw.url + "/v1/chat/completions", data=body)
        async with r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/event-stream"
            assert engine.paused.is_set()
            assert not engine.unpause.is_set()
            engine.unpause.set()
            events = [e for e in (await r.read()).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    pieces = [orjson.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert "".join(p or "" for p in pieces) == " t0 t1"


async def test_completions_stream_and_not(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    eng = FakeEngine(tokens=3)
    gw = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    client = gw.client()
    full = await client.completions.create(model="tiny", prompt="abc")
    assert full.choices[0].text == " t0 t1 t2"
    stream = await client.completions.create(model="tiny", prompt="abc", stream=True)
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == " t0 t1 t2"


async def test_embeddings_pass_through(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    gw = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    emb = await gw.client().embeddings.create(model="tiny", input="hello")
    assert emb.data[0].embedding == [0.1, 0.2]


async def test_models_and_alias(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    url = await engine_server(FakeEngine())
    gw = await start_gateway(
        [], toml=f'[aliases]\n"gpt-4o-mini" = "tiny"\n[[endpoints]]\nurl = "{url}"\nengine = "vllm"\n'
    )
    client = gw.client()
    listed = sorted(m.id for m in (await client.models.list()).data)
    assert listed == ["gpt-4o-mini", "tiny"]
    resp = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
    )
    assert resp.model == "gpt-4o-mini"
    stream = await client.chat.completions.create(
        model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "x"}]
    )
    models = {c.model async for c in stream}
    assert models == {"gpt-4o-mini"}


async def test_health_ready_and_metrics(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    gw = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    async with aiohttp.ClientSession() as s:
        for path in ("/healthz", "/readyz"):
            async with s.get(gw.url + path) as r:
                assert r.status == 200, path
    metrics = await _get_text(gw.url + "/metrics")
    eid = gw.gw.scheduler.endpoint_ids()[0]
    assert f'berth_endpoint_up{{endpoint="{eid}"}} 1.0' in metrics
    assert f'berth_endpoint_inflight_requests{{endpoint="{eid}"}} 0.0' in metrics
    assert f'berth_endpoint_cap_requests{{endpoint="{eid}"}} 64.0' in metrics
    labels = f'endpoint="{eid}",instance_class="mixed"'
    assert f'berth_endpoint_running_requests{{{labels},kind="interactive"}} 0.0' in metrics
    assert f'berth_endpoint_running_requests{{{labels},kind="batch"}} 0.0' in metrics


async def _get_text(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


async def _post(url: str, body: bytes, **headers: str) -> tuple[int, dict[str, str], dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
        return r.status, dict(r.headers), orjson.loads(await r.read())
