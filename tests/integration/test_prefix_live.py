"""The prefix index in the live daemon over loopback: a conversation's second turn is predicted cached on
the endpoint that served the first (its prompt and the answer streamed back), and /admin/fleet and
/metrics show the endpoint's index and the engine's own hit rate."""

from __future__ import annotations

import aiohttp
import orjson
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine

SYSTEM = "You are a careful assistant for the berth repository. " * 40  # ~2,200 characters


async def test_a_second_turn_is_predicted_cached_where_the_first_ran(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokens=8, token_pad=6, prefix_hits=0.0, prefix_queries=0.0)
    r = await start_gateway([await engine_server(eng) + ",engine=vllm,id=e0"])
    await r.scrape()  # the counters' first reading
    turn1: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "what is a block?"},
    ]
    answer = ""
    async with r.client() as client:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=turn1,
            stream=True,
            max_tokens=8,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                answer += chunk.choices[0].delta.content
        turn2: list[ChatCompletionMessageParam] = [
            *turn1,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "and a key?"},
        ]
        await client.chat.completions.create(model="tiny", messages=turn2, max_tokens=4)
    eng.prefix_queries, eng.prefix_hits = 1200.0, 540.0
    await r.scrape()
    r.gw.telemetry.refresh()
    async with aiohttp.ClientSession() as s:
        async with s.get(r.url + "/admin/fleet") as resp:
            doc = orjson.loads(await resp.read())
        async with s.get(r.url + "/metrics") as resp:
            metrics = await resp.text()
    [ep] = doc["endpoints"]
    prefix = ep["prefix"]
    assert prefix["source"] == "approximate"
    assert prefix["cached_blocks"] > 0
    # the second turn: the whole first turn and its answer predicted cached (most of its prompt)
    assert prefix["predicted_hit_rate"] > 0.4
    assert prefix["engine_hit_rate"] == 0.45
    assert prefix["event_lag_s"] is None
    assert 'berth_prefix_cached_blocks{endpoint="e0"}' in metrics
    assert 'berth_prefix_source_info{endpoint="e0",source="approximate"} 1.0' in metrics
    assert 'berth_prefix_engine_hit_ratio{endpoint="e0"} 0.45' in metrics
