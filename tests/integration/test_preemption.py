"""Preemption over loopback HTTP: an interactive request takes a running batch request's seat; the batch
request's engine call is aborted, it waits in the queue with what it produced, and is resumed with a
call that continues its text, while its client sees one unbroken stream (or one ordinary answer)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine
from tests.preempt_policy import BATCH_HEADERS as BATCH
from tests.preempt_policy import POLICY

TOKENS = 10
PAUSE_AT = 4
CHAT_BODY: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


async def _gateway(
    tmp_path: Any, engine_server: EngineServer, start_gateway: StartGateway
) -> tuple[Running, FakeEngine]:
    engine = FakeEngine(tokens=TOKENS, pause_after_tokens=PAUSE_AT, role_chunk=True)
    url = await engine_server(engine)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    gw = await start_gateway([f"{url},engine=vllm,class=mixed,cap=1"], toml=f'[policy]\nfile = "{policy}"\n')
    return gw, engine


async def _interactive(gw: Running) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 3}) as r,
    ):
        assert r.status == 200
        doc: dict[str, Any] = await r.json()
        return doc


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(orjson.loads(event[6:]))
    return out


async def _metric(gw: Running, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.parametrize("api", ["chat", "completion"])
async def test_a_preempted_stream_is_resumed_as_one_stream(
    api: str, tmp_path: Any, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    gw, engine = await _gateway(tmp_path, engine_server, start_gateway)
    if api == "chat":
        path, body = "/v1/chat/completions", {**CHAT_BODY}
    else:
        path, body = "/v1/completions", {"model": "tiny", "prompt": "Once upon"}
    body.update(stream=True, max_tokens=TOKENS, stream_options={"include_usage": True})
    async with aiohttp.ClientSession() as s, s.post(gw.url + path, json=body, headers=BATCH) as r:
        assert r.status == 200
        await engine.paused.wait()  # the batch stream has produced PAUSE_AT tokens
        answer = await _interactive(gw)  # takes the only seat: the batch request is preempted
        raw = await r.read()
    assert answer["choices"][0]["message"]["content"] == " t0 t1 t2"
    events = _events(raw)
    assert {e["id"] for e in events} == {"chatcmpl-1" if api == "chat" else "cmpl-1"}
    pieces = [
        c["delta"].get("content") or "" if api == "chat" else c["text"] for e in events for c in e["choices"]
    ]
    assert "".join(pieces) == "".join(f" t{i}" for i in range(TOKENS))
    if api == "chat":
        assert sum(1 for e in events for c in e["choices"] if "role" in c["delta"]) == 1
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage == [{"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": 3 + TOKENS}]
    # The engine saw the batch request, the interactive one, then the continuation.
    resumed = engine.requests[-1]
    assert resumed["max_tokens"] == TOKENS - PAUSE_AT
    if api == "chat":
        assert resumed["messages"][-1] == {"role": "assistant", "content": " t0 t1 t2 t3"}
        assert resumed["continue_final_message"] is True
        assert resumed["add_generation_prompt"] is False
    else:
        assert resumed["prompt"] == "Once upon t0 t1 t2 t3"
    assert engine.aborts == 1
    assert await _metric(gw, "berth_preemptions_total") == 1
    assert await _metric(gw, 'berth_resumes_total{model="tiny",outcome="ok"}') == 1
    assert await _metric(gw, "berth_recomputed_tokens_total") == PAUSE_AT
    assert gw.gw.scheduler.inflight_on(gw.gw.scheduler.endpoint_ids()[0]) == 0
    assert gw.gw.scheduler.queue_depth("tiny") == 0  # type: ignore[arg-type]


async def test_a_preempted_non_streamed_batch_request_gets_one_answer(
    tmp_path: Any, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    gw, engine = await _gateway(tmp_path, engine_server, start_gateway)
    client = gw.client()
    batch = asyncio.get_running_loop().create_task(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=TOKENS, extra_headers=BATCH
        )
    )
    await engine.paused.wait()
    answer = await _interactive(gw)
    assert answer["choices"][0]["message"]["content"] == " t0 t1 t2"
    resp = await batch
    assert resp.choices[0].message.content == "".join(f" t{i}" for i in range(TOKENS))
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (3, TOKENS)
    assert resp.object == "chat.completion"
    assert engine.requests[0]["stream"] is True  # berth streamed it from the engine, to be able to resume it
    assert await _metric(gw, "berth_preemptions_total") == 1


async def test_a_client_that_leaves_while_preempted_leaves_nothing_behind(
    tmp_path: Any, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    gw, engine = await _gateway(tmp_path, engine_server, start_gateway)
    body = {**CHAT_BODY, "stream": True, "max_tokens": TOKENS}
    async with aiohttp.ClientSession() as s:
        r = await s.post(gw.url + "/v1/chat/completions", json=body, headers=BATCH)
        await engine.paused.wait()
        engine.hold = hold = asyncio.Event()  # the interactive request keeps the seat until let go
        interactive = asyncio.get_running_loop().create_task(_interactive(gw))
        await engine.aborted.wait()  # the batch request's engine call was aborted: it waits in the queue
        sched = gw.gw.scheduler
        assert sched.queue_depth("tiny") == 1  # type: ignore[arg-type]
        r.close()  # the batch client goes away while its request waits to be resumed
        await _until(lambda: sched.queue_depth("tiny") == 0)  # type: ignore[arg-type]
        hold.set()
        await interactive
    eid = sched.endpoint_ids()[0]
    await _until(lambda: sched.inflight_on(eid) == 0)
    assert gw.gw.driver.waiting == 0


async def _until(cond: Any) -> None:
    """Yield to the loop until `cond()` holds (each step lets the gateway's tasks run)."""
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_a_stream_that_produced_reasoning_is_never_preempted(
    tmp_path: Any, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    gw, engine = await _gateway(tmp_path, engine_server, start_gateway)
    engine.reasoning = True  # a continuation from text would lose the thinking the client has
    body = {**CHAT_BODY, "stream": True, "max_tokens": TOKENS}
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/chat/completions", json=body, headers=BATCH) as r,
    ):
        await engine.paused.wait()
        interactive = asyncio.get_running_loop().create_task(_interactive(gw))
        await _until(lambda: gw.gw.scheduler.queue_depth("tiny") == 1)  # type: ignore[arg-type]
        assert engine.aborts == 0  # it waits for the seat instead
        engine.unpause.set()
        raw = await r.read()
        await interactive
    thoughts = [c["delta"].get("reasoning_content") for e in _events(raw) for c in e["choices"]]
    assert "".join(t or "" for t in thoughts) == "".join(f" t{i}" for i in range(TOKENS))
    assert engine.aborts == 0
    assert await _metric(gw, "berth_preemptions_total") == 0
