"""What a client learns from an error: the engine's own error detail relayed, the served models named
in an unknown model's 404, and a body that is not JSON refused by its Content-Type."""

from __future__ import annotations

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine

CHAT = "/v1/chat/completions"
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
BODY = orjson.dumps({"model": "tiny", "messages": MSG, "max_tokens": 2})


async def test_the_engines_error_reaches_the_sdk_with_its_param_type_and_code(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    engine_body = {
        "error": {
            "message": "This model's maximum context length is 4608 tokens",
            "type": "BadRequestError",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    eng = FakeEngine(fail_status=400, fail_body=orjson.dumps(engine_body))
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    with pytest.raises(openai.BadRequestError) as ei:
        await r.client().chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.body == engine_body["error"]  # the SDK's view: nothing lost, nothing escaped
    assert ei.value.code == "context_length_exceeded"
    assert ei.value.param == "messages"


async def test_a_validation_error_of_the_engine_becomes_a_message_not_escaped_json(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    detail = {"detail": [{"loc": ["body", "n"], "msg": "must be positive", "type": "value_error"}]}
    eng = FakeEngine(fail_status=422, fail_body=orjson.dumps(detail))
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    with pytest.raises(openai.UnprocessableEntityError) as ei:
        await r.client().chat.completions.create(model="tiny", messages=MSG)
    assert ei.value.body == {
        "message": "body.n: must be positive",
        "type": "invalid_request_error",
        "param": "body.n",
        "code": "engine_rejected",
    }


async def test_an_unknown_models_404_names_the_served_models_and_aliases(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    url = await engine_server(FakeEngine())
    r = await start_gateway(
        [], toml=f'[aliases]\n"gpt-4o-mini" = "tiny"\n[[endpoints]]\nurl = "{url}"\nengine = "vllm"\n'
    )
    with pytest.raises(openai.NotFoundError) as ei:
        await r.client().chat.completions.create(model="tiny-llama", messages=MSG)
    assert ei.value.code == "model_not_found"
    assert ei.value.param == "model"
    assert isinstance(ei.value.body, dict)
    assert (
        ei.value.body["message"] == "The model 'tiny-llama' does not exist; served models: gpt-4o-mini, tiny"
    )


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",  # what some SDKs and browsers send
        "Application/JSON",
        "application/vnd.api+json",
        "application/octet-stream",  # aiohttp's default for a body given as bytes
        None,  # requests' data= sends no Content-Type
    ],
)
async def test_json_bodies_are_served_whatever_json_type_they_declare(
    engine_server: EngineServer, start_gateway: StartGateway, content_type: str | None
) -> None:
    eng = FakeEngine()
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    headers = {} if content_type is None else {"Content-Type": content_type}
    # skip_auto_headers: without a Content-Type aiohttp would add application/octet-stream itself
    async with (
        aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as s,
        s.post(r.url + CHAT, data=BODY, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
    assert len(eng.requests) == 1


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/json"],
)
async def test_other_bodies_get_415(
    engine_server: EngineServer, start_gateway: StartGateway, content_type: str
) -> None:
    eng = FakeEngine()
    r = await start_gateway([await engine_server(eng) + ",engine=vllm"])
    async with (
        aiohttp.ClientSession() as s,
        s.post(r.url + CHAT, data=BODY, headers={"Content-Type": content_type}) as resp,
    ):
        assert resp.status == 415
        body = orjson.loads(await resp.read())
    assert body["error"]["code"] == "unsupported_media_type"
    assert body["error"]["type"] == "invalid_request_error"
    assert content_type in body["error"]["message"]
    assert eng.requests == []
