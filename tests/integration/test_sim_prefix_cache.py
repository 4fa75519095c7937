"""A simulated endpoint with prefix caching over loopback: /tokenize and /detokenize in vLLM's shape, hits
on shared prefixes (text, chat and token-id prompts) in the engines' own metrics, and KV events on a
real pyzmq SUB socket and the replay socket, in both encodings. No sleeps: bounded polls only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from gateway.telemetry.promtext import parse
from loadgen.engine_sim import EndpointSpec
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.server import SimEndpoint, serve_endpoint
from loadgen.engine_sim.tokens import encode
from loadgen.prompts import prompt_text

BS = 4
FAST: dict[str, Any] = {
    "profile": "test-fast",
    "output_len": LengthDist("fixed", 2.0),
    "load_time_s": 0.0,
    "prefix_cache": True,
    "block_size": BS,
}
POLL_MS = 5000


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def complete(http: aiohttp.ClientSession, ep: SimEndpoint, prompt: Any) -> dict[str, Any]:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{ep.url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        out: dict[str, Any] = await resp.json()
        return out


async def metric(http: aiohttp.ClientSession, ep: SimEndpoint, name: str) -> float:
    async with http.get(f"{ep.url}/metrics") as resp:
        value = parse(await resp.text()).value(name)
    assert value is not None, name
    return value


async def test_tokenize_answers_vllms_shape_with_the_ids_the_engine_counts(
    http: aiohttp.ClientSession,
) -> None:
    async with serve_endpoint(EndpointSpec(**FAST)) as ep:
        text = prompt_text(50, salt=3)
        async with http.post(f"{ep.url}/tokenize", json={"model": "sim-model", "prompt": text}) as resp:
            body = await resp.json()
        assert body["count"] == 50
        assert body["tokens"] == encode(text).tolist()
        assert body["max_model_len"] == ep.resolved.max_model_len
        assert body["token_strs"] is None
        async with http.post(f"{ep.url}/detokenize", json={"tokens": body["tokens"]}) as resp:
            assert (await resp.json())["prompt"] == text
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
        async with http.post(f"{ep.url}/tokenize", json={"messages": messages}) as resp:
            counted = (await resp.json())["count"]
        chat = {"model": "sim-model", "messages": messages, "max_tokens": 2}
        async with http.post(f"{ep.url}/v1/chat/completions", json=chat) as resp:
            assert (await resp.json())["usage"]["prompt_tokens"] == counted
        async with http.post(f"{ep.url}/tokenize", json={"model": "other", "prompt": "x"}) as resp:
            assert resp.status == 404
            assert "error" in await resp.json()


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_shared_prefixes_hit_for_text_and_token_id_prompts(
    http: aiohttp.ClientSession, flavor: str
) -> None:
    async with serve_endpoint(EndpointSpec(flavor=flavor, **FAST)) as ep:  # type: ignore[arg-type]
        prefix = prompt_text(40, salt=7)
        await complete(http, ep, prefix + "one two")
        await complete(http, ep, prefix + "six ten")
        cache = ep.engine.prefix_cache
        assert cache is not None
        assert cache.hits == 40
        ids = encode(prefix + "zzzz").tolist()  # the same prefix as token ids: the same blocks
        await complete(http, ep, ids)
        assert cache.hits == 80
        async with http.get(f"{ep.url}/sim/state") as resp:
            state = (await resp.json())["prefix_cache"]
        assert state["hits_tokens"] == 80
        assert state["block_size"] == BS
        if flavor == "vllm":
            assert await metric(http, ep, "vllm:prefix_cache_hits_total") == 80
            assert await metric(http, ep, "vllm:prefix_cache_queries_total") == cache.queries
            async with http.get(f"{ep.url}/metrics") as resp:
                [info] = parse(await resp.text()).series("vllm:cache_config_info")
            assert info.labels["enable_prefix_caching"] == "True"
            assert info.labels["block_size"] == str(BS)
            assert int(info.labels["num_gpu_blocks"]) * BS == ep.resolved.engine.kv_capacity_tokens
        else:
            assert await metric(http, ep, "sglang:cache_hit_rate") == pytest.approx(40 / 41)


async def next_message(sock: zmq.asyncio.Socket) -> list[bytes]:
    assert await sock.poll(POLL_MS), "no KV event within the poll timeout"
    frames: list[bytes] = await sock.recv_multipart()
    return frames


def events_of(payload: bytes, fmt: str) -> list[tuple[str, dict[str, Any]]]:
    """(type, fields) of each event, from either encoding."""
    ts, events, rank = msgspec.msgpack.decode(payload)  # the batch is an array in both
    assert isinstance(ts, float)
    assert rank == 0
    if fmt == "map":
        return [(e["type"], e) for e in events]
    out = []
    for e in events:
        if e[0] == "BlockStored":
            keys = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
            out.append((e[0], dict(zip(keys, e[1:], strict=True))))
        elif e[0] == "BlockRemoved":
            out.append((e[0], {"block_hashes": e[1], "medium": e[2]}))
        else:
            out.append((e[0], {}))
    return out


@pytest.mark.parametrize("fmt", ["map", "array"])
async def test_kv_events_reach_a_subscriber_and_the_replay_socket(
    http: aiohttp.ClientSession, fmt: str
) -> None:
    spec = EndpointSpec(
        kv_events="tcp://127.0.0.1:0",
        kv_events_replay="tcp://127.0.0.1:0",
        kv_events_format=fmt,  # type: ignore[arg-type]
        kv_capacity_tokens=400,
        max_model_len=300,
        **FAST,
    )
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    dealer = ctx.socket(zmq.DEALER)
    try:
        async with serve_endpoint(spec) as ep:
            pub = ep.kv_events
            assert pub is not None
            assert pub.replay_endpoint is not None
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub.endpoint)
            # the subscription becomes live asynchronously: send fresh prompts until one is seen
            for salt in range(100):
                await complete(http, ep, prompt_text(8, salt=1000 + salt))
                if await sub.poll(50):
                    break
            else:
                raise AssertionError("the subscriber never saw an event")
            await sub.recv_multipart()
            text = prompt_text(150, salt=11)
            await complete(http, ep, text + "ab")
            topic, seq, payload = await next_message(sub)
            assert topic == b""
            assert len(seq) == 8
            [(kind, stored)] = events_of(payload, fmt)
            assert kind == "BlockStored"
            assert stored["block_size"] == BS
            assert stored["medium"] == "GPU"
            # 151 tokens: 37 full blocks are stored, the partial last block is not
            assert stored["token_ids"] == encode(text + "ab").tolist()[: 37 * BS]
            assert len(stored["block_hashes"]) == 37
            assert all(isinstance(h, int) and 0 <= h < 2**64 for h in stored["block_hashes"])
            assert stored["parent_block_hash"] is None
            # a second long prompt needs the room: the first one's free blocks are evicted
            await complete(http, ep, prompt_text(250, salt=12))
            kinds: list[str] = []
            while "BlockRemoved" not in kinds:
                _, _, payload = await next_message(sub)
                kinds += [k for k, _ in events_of(payload, fmt)]
            # a restart clears every block
            await ep.restart()
            _, last_seq, payload = await next_message(sub)
            assert [k for k, _ in events_of(payload, fmt)] == ["AllBlocksCleared"]
            # replay: everything from the first message on, then the end marker
            dealer.connect(pub.replay_endpoint)
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            seqs: list[int] = []
            while True:
                assert await dealer.poll(POLL_MS)
                frames = await dealer.recv_multipart()
                assert frames[0] == b""
                if fmt == "map":  # current vLLM replays the topic too
                    assert frames[1] == b""
                assert len(frames) == (4 if fmt == "map" else 3)
                seq_bytes, body = frames[-2:]
                number = int.from_bytes(seq_bytes, "big", signed=True)
                if number == -1:
                    assert body == b""
                    break
                seqs.append(number)
            assert seqs == list(range(int.from_bytes(last_seq, "big") + 1))
    finally:
        sub.close(linger=0)
        dealer.close(linger=0)


def test_kv_events_need_the_prefix_cache_and_a_tcp_endpoint() -> None:
    with pytest.raises(ValueError, match="prefix cache"):
        EndpointSpec(profile="test-fast", kv_events="tcp://127.0.0.1:5557")
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        EndpointSpec(profile="test-fast", prefix_cache=True, kv_events="ipc:///tmp/x")
