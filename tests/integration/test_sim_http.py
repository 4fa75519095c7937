"""Simulated endpoints over loopback HTTP: OpenAI formats (checked with the official SDK too), health,
models, metrics, client disconnects and every fault. No sleeps: tests await responses or events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from gateway.telemetry.engine_metrics import SGLANG_METRICS, VLLM_METRICS
from gateway.telemetry.promtext import parse
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.harness import start_engine_sim

FAST = {"profile": "test-fast", "output_len": LengthDist("fixed", 5.0), "load_time_s": 0.0}


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    specs = [
        EndpointSpec(flavor="vllm", models=("m", "m-alias"), **FAST),  # type: ignore[arg-type]
        EndpointSpec(flavor="sglang", models=("s",), **FAST),  # type: ignore[arg-type]
    ]
    async with SimFleet(specs) as f:
        yield f


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def sse_events(resp: aiohttp.ClientResponse) -> list[Any]:
    events: list[Any] = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            payload = line[6:].strip()
            events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return events


async def data_lines(resp: aiohttp.ClientResponse, into: list[bytes]) -> None:
    async for line in resp.content:
        if line.startswith(b"data: "):
            into.append(line)


async def stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    async with http.post(url, json=body) as resp:
        return await sse_events(resp)


def chat_body(model: str = "m", n: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello " * 10}],
        "max_tokens": n,
        "min_tokens": n,
        **extra,
    }


async def test_chat_stream_has_the_vllm_chunk_sequence(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True})
    async with http.post(fleet.urls[0] + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-1]
    assert [c["choices"][0]["delta"]["content"] for c in tokens] == [" tok"] * 4
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, None, "length"]
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 4


async def test_completion_without_pinned_length_draws_from_the_distribution(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    body = {"model": "m-alias", "prompt": "x" * 40, "max_tokens": 50}
    async with http.post(fleet.urls[0] + "/v1/completions", json=body) as resp:
        data = await resp.json()
    assert data["object"] == "text_completion"
    assert data["model"] == "m-alias"
    assert data["choices"][0]["text"] == " tok" * 5
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    body["max_tokens"] = 3  # the cap wins over the draw
    async with http.post(fleet.urls[0] + "/v1/completions", json=body) as resp:
        data = await resp.json()
    assert data["usage"]["completion_tokens"] == 3
    assert data["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("which", [0, 1], ids=["vllm", "sglang"])
async def test_the_openai_sdk_reads_both_flavours(fleet: SimFleet, which: int) -> None:
    model = ("m", "s")[which]
    client = openai.AsyncOpenAI(base_url=fleet.urls[which] + "/v1", api_key="x", max_retries=0)
    try:
        models = await client.models.list()
        assert models.data[0].id == model
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
        assert text == " tok" * 6
        assert usage is not None
        assert usage.completion_tokens == 6
        done = await client.completions.create(
            model=model, prompt="abc", max_tokens=2, extra_body={"min_tokens": 2}
        )
        assert done.choices[0].text == " tok tok"
        assert done.usage is not None
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    finally:
        await client.close()


async def test_errors_models_and_version(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    url = fleet.urls[0]
    async with http.post(url + "/v1/completions", data=b"{not json") as resp:
        assert resp.status == 400
        err = (await resp.json())["error"]
        assert err["type"] == "BadRequestError"
        assert err["code"] == 400
    async with http.post(url + "/v1/chat/completions", json=chat_body(model="zzz")) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["message"] == "The model `zzz` does not exist."
    async with http.get(url + "/v1/models") as resp:
        data = await resp.json()
    assert [m["id"] for m in data["data"]] == ["m", "m-alias"]
    assert data["data"][0]["owned_by"] == "vllm"
    assert data["data"][0]["max_model_len"] > 0
    async with http.get(url + "/version") as resp:
        assert resp.status == 200
    async with http.get(fleet.urls[1] + "/get_model_info") as resp:
        assert (await resp.json())["model_path"] == "s"


async def test_health_is_503_while_loading(http: aiohttp.ClientSession) -> None:
    spec = EndpointSpec(profile="test-fast", load_time_s=3600.0, speed=1.0)
    async with SimFleet([spec]) as fleet:
        async with http.get(fleet.urls[0] + "/health") as resp:
            assert resp.status == 503
        async with http.post(
            fleet.urls[0] + "/v1/chat/completions", json=chat_body(model="sim-model")
        ) as resp:
            assert resp.status == 503
    spec = EndpointSpec(profile="test-fast", load_time_s=3600.0, speed=1e9)  # speed shortens loading too
    async with SimFleet([spec]) as fleet, http.get(fleet.urls[0] + "/health") as resp:
        assert resp.status == 200


async def test_client_disconnect_aborts_the_request(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    ep = fleet.endpoint(0)
    body = chat_body(n=2000, stream=True)
    resp = await http.post(fleet.urls[0] + "/v1/chat/completions", json=body)
    await resp.content.readline()  # the first chunk arrived: the request runs in the batch
    assert ep.engine.num_running == 1
    assert ep.engine.kv_used > 0
    resp.close()  # drop the connection mid-stream
    await ep.wait_idle()
    assert ep.engine.num_running == 0
    assert ep.engine.num_waiting == 0
    assert ep.engine.kv_used == 0
    assert ep.engine.stats.requests_aborted == 1
    async with http.get(fleet.urls[0] + "/metrics") as r:
        expo = parse(await r.text())
    assert expo.value("vllm:request_success_total", finished_reason="abort") == 1


async def test_sglang_abort_request_ends_the_stream(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    ep = fleet.endpoint(1)
    body = chat_body(model="s", n=2000, stream=True, rid="my-request-1")
    async with http.post(ep.url + "/v1/chat/completions", json=body) as resp:
        first = await resp.content.readline()
        assert b"my-request-1" in first  # SGLang answers with the caller's id
        async with http.post(ep.url + "/abort_request", json={"rid": "my-request-1"}) as r:
            assert r.status == 200
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "abort"
    assert ep.engine.num_running == 0
    assert ep.engine.kv_used == 0
    async with http.post(ep.url + "/abort_request", json={"rid": "unknown"}) as r:
        assert r.status == 200


async def test_fail_fraction_and_admin_endpoints(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    url = fleet.urls[0]
    async with http.post(url + "/sim/faults", json={"fail_fraction": 1.0}) as resp:
        assert resp.status == 200
        assert (await resp.json())["fail_fraction"] == 1.0
    async with http.post(url + "/v1/chat/completions", json=chat_body()) as resp:
        assert resp.status == 500
        assert (await resp.json())["error"]["type"] == "InternalServerError"
    async with http.get(url + "/sim/state") as resp:
        state = await resp.json()
    assert state["faults"]["fail_fraction"] == 1.0
    assert state["flavor"] == "vllm"
    assert state["loaded"]
    async with http.post(url + "/sim/faults", json={"fail_fractoin": 1.0}) as resp:
        assert resp.status == 400
    async with http.post(url + "/sim/faults", json={"reset": True, "health_503": True}) as resp:
        assert (await resp.json())["fail_fraction"] == 0.0
    async with http.get(url + "/health") as resp:
        assert resp.status == 503
    async with http.post(url + "/v1/chat/completions", json=chat_body()) as resp:
        assert resp.status == 200  # health_503 affects health only


async def test_metrics_faults(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    ep = fleet.endpoint(1)
    async with http.post(ep.url + "/v1/chat/completions", json=chat_body(model="s")) as resp:
        assert resp.status == 200
    async with http.get(ep.url + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        expo = parse(await resp.text())
    assert SGLANG_METRICS.generation_tokens_total(expo) == 4
    assert SGLANG_METRICS.gauges(expo).running == 0
    ep.set_faults(metrics_garbage=True)
    async with http.get(ep.url + "/metrics") as resp:
        assert resp.status == 200
        assert SGLANG_METRICS.gauges(parse(await resp.text())).running is None
    ep.set_faults(metrics_garbage=False, metrics_delay_s=30.0)
    with pytest.raises(TimeoutError):
        async with http.get(ep.url + "/metrics", timeout=aiohttp.ClientTimeout(total=0.2)):
            pass


async def test_stall_keeps_the_connection_open(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    ep = fleet.endpoint(0)
    ep.set_faults(stall_after_tokens=2)
    body = chat_body(n=10, stream=True)
    resp = await http.post(
        ep.url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(sock_read=0.3)
    )
    got: list[bytes] = []
    with pytest.raises(TimeoutError):
        await data_lines(resp, got)
    assert len(got) == 3  # the role chunk and two tokens, then nothing (and no [DONE])
    resp.close()
    await ep.wait_idle()
    assert ep.live_requests == 0


async def test_die_after_tokens_resets_connections_and_stops_listening(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    ep, other = fleet.endpoint(0), fleet.endpoint(1)
    ep.set_faults(die_after_tokens=3)
    body = chat_body(n=50, stream=True)
    with pytest.raises(aiohttp.ClientError):
        await stream(http, ep.url + "/v1/chat/completions", body)
    assert not ep.alive
    with pytest.raises(aiohttp.ClientConnectorError):
        async with http.get(ep.url + "/health"):
            pass
    async with http.post(other.url + "/v1/chat/completions", json=chat_body(model="s")) as resp:
        assert resp.status == 200  # the rest of the fleet lives on
    await ep.restart()
    ep.set_faults(reset=True)
    async with http.post(ep.url + "/v1/chat/completions", json=chat_body()) as resp:
        assert resp.status == 200
        assert (await resp.json())["usage"]["completion_tokens"] == 4


async def test_vllm_metrics_after_traffic(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    url = fleet.urls[0]
    await asyncio.gather(*(http.post(url + "/v1/chat/completions", json=chat_body(n=3)) for _ in range(5)))
    async with http.get(url + "/metrics") as resp:
        expo = parse(await resp.text())
    assert VLLM_METRICS.generation_tokens_total(expo) == 15
    ttft = VLLM_METRICS.ttft_histogram(expo)
    assert ttft is not None
    assert ttft.count == 5
    assert VLLM_METRICS.gauges(expo).kv_usage == 0.0


async def test_standalone_simulator_exits_when_it_dies(tmp_path: Path) -> None:
    args = ["--port", "0", "--profile", "test-fast", "--load-time-s", "0", "--die-after-tokens", "2"]
    proc, (url,) = await asyncio.to_thread(start_engine_sim, args, tmp_path / "sim.log", timeout_s=20)
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.post(url + "/v1/chat/completions", json=chat_body("sim-model", n=20)) as resp:
                    await resp.json()
        assert await asyncio.to_thread(proc.wait, 20) == 1
    finally:
        await asyncio.to_thread(proc.stop)
