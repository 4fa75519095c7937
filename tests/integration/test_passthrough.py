"""The engines' other routes through berth: /tokenize, /version, ... to an endpoint serving the model,
behind berth's auth; an engine's 404 for a route it lacks is the client's."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine

AUTH = '[auth]\nrequired = true\n[[tenants]]\nname = "a"\napi_keys = ["key-a"]\n[aliases]\nsmall = "tiny"\n'
KEY = {"Authorization": "Bearer key-a"}


async def test_tokenize_and_friends(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    engine = FakeEngine(tokenize_count=3)
    url = await engine_server(engine)
    gw = await start_gateway([f"{url},engine=vllm"], toml=AUTH)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            gw.url + "/tokenize", json={"model": "small", "prompt": "hi there"}, headers=KEY
        ) as r:
            assert r.status == 200
            assert (await r.json())["count"] == 3
        assert engine.tokenizes == [{"model": "tiny", "prompt": "hi there"}]  # the alias resolved
        async with http.post(gw.url + "/tokenize", json={"model": "tiny", "prompt": "x"}) as r:
            assert r.status == 401  # vLLM leaves /tokenize open; berth does not
        async with http.post(
            gw.url + "/v1/rerank", json={"model": "tiny", "query": "q", "documents": []}, headers=KEY
        ) as r:
            assert r.status == 404  # the engine has no such route: its 404
        async with http.post(gw.url + "/pooling", json={"model": "nope", "input": "x"}, headers=KEY) as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "model_not_found"
        async with http.post(gw.url + "/score", json={"text_1": "a"}, headers=KEY) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "model"
        async with http.get(gw.url + "/tokenize", headers=KEY) as r:
            assert r.status == 405


@pytest.mark.parametrize("status", [200, 404])
async def test_version(engine_server: EngineServer, start_gateway: StartGateway, status: int) -> None:
    engine = FakeEngine()
    app_url = await engine_server(engine)
    gw = await start_gateway([f"{app_url},engine=vllm"])
    if status == 200:
        engine.version = "0.11.0"
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/version") as r:
        assert r.status == status
        if status == 200:
            assert await r.json() == {"version": "0.11.0"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK's translations.create
async def test_audio_form(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    engine = FakeEngine()
    url = await engine_server(engine)
    gw = await start_gateway([f"{url},engine=vllm"], toml=AUTH)
    client = gw.client(api_key="key-a")
    got = await client.audio.transcriptions.create(
        model="small", file=("a.wav", b"RIFF" + bytes(996)), language="en"
    )
    assert got.text == "1000 bytes heard"
    [sent] = engine.transcriptions
    assert (sent["model"], sent["file"], sent["language"]) == ("tiny", 1000, "en")  # the alias resolved
    with pytest.raises(openai.NotFoundError):  # the engine has no translation route: its 404
        await client.audio.translations.create(model="tiny", file=("a.wav", b"RIFF"))
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await client.audio.transcriptions.create(model="nope", file=("a.wav", b"RIFF"))
