"""KV events from two real vLLM engines (CPU, prefix caching on, `--kv-events-config` with a ZMQ
publisher and a replay socket), with berth in front subscribed to both (`kv_events=` per endpoint).

What this side checks: the events arrive (berth's own stores go live and count blocks, and a store of
the test's, on the same publishers, decodes every batch); the store of the engine that served a long
prompt holds exactly that prompt's full-block keys and the other engine's holds none of them; a
request sharing the prefix, sent to the holder, raises the holder's `vllm:prefix_cache_hits_total`.
Placement by prefix (berth sending the sharers to the holder on its own) is marked xfail (not strict)
until it is confirmed on this tier.

`BERTH_RECORD_KV_EVENTS=PATH` writes the first engine's raw frames (msgpack `[[seq, payload], ...]`)
to PATH: `tests/unit/data/kv_events_vllm.msgpack` was recorded so.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import openai
import pytest
import zmq
import zmq.asyncio

from gateway.core.blockhash import token_chain
from gateway.core.clock import SystemClock
from gateway.telemetry.prefix_precise import SourceState
from gateway.upstream.kv_events import KvEventsTarget, KvEventSubscriber
from loadgen.harness import ServerStartError, free_port, start_berth
from loadgen.vllm_server import start_vllm
from tests.engine.conftest import IGNORE_EOS, MODEL_NAME, RunningServer
from tests.engine.promtext import total
from tests.kv_watch import WatchedStore

PROMPT_TOKENS = 1_100  # several full blocks at vLLM's CPU block size
WAIT_S = 60.0


@dataclass
class Engine:
    server: RunningServer
    pub: str  # as berth reaches it
    replay: str

    @property
    def endpoint_id(self) -> str:
        return self.server.base_url.removeprefix("http://")

    def hits(self) -> float:
        return total(self.server.metrics(), "vllm:prefix_cache_hits_total")


def _start_engine(engine_python: Path, model_dir: Path, log: Path) -> Engine:
    pub_port, replay_port = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # vLLM binds only a wildcard address (any other it connects to); the replay socket it binds as given.
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": "kv",
    }
    try:
        server = start_vllm(
            engine_python,
            model_dir,
            log,
            extra_args=["--enable-prefix-caching", "--kv-events-config", json.dumps(config)],
        )
    except ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    return Engine(server, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")


@pytest.fixture(scope="module")
def engines(engine_python: Path, tiny_model_dir: Path, engine_logs: Path) -> Iterator[list[Engine]]:
    started: list[Engine] = []
    try:
        for i in range(2):
            started.append(_start_engine(engine_python, tiny_model_dir, engine_logs / f"vllm-kv-{i}.log"))
        yield started
    finally:
        for e in started:
            e.server.process.stop()


@pytest.fixture(scope="module")
def precise_berth(engines: list[Engine], engine_logs: Path) -> Iterator[RunningServer]:
    flags = [
        f"{e.server.base_url},engine=vllm,kv_events={e.pub},kv_events_replay={e.replay},kv_events_topic=kv"
        for e in engines
    ]
    try:
        server = start_berth(flags[0], engine_logs / "berth-kv.log", extra_args=["--endpoint", flags[1]])
    except ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    yield server
    server.process.stop()


@dataclass
class Watch:
    stores: list[WatchedStore]
    frames: list[tuple[bytes, bytes]]  # the first engine's raw frames, for the decoder fixture


@pytest.fixture
async def watch(engines: list[Engine]) -> AsyncIterator[Watch]:
    """The test's own subscribers on both publishers (a second SUB on a PUB is fine), and a raw recorder."""
    ctx = zmq.asyncio.Context()
    stores = [WatchedStore(e.endpoint_id) for e in engines]
    subs = [
        KvEventSubscriber(e.endpoint_id, KvEventsTarget(e.pub, e.replay, "kv"), s, SystemClock(), context=ctx)
        for e, s in zip(engines, stores, strict=True)
    ]
    frames: list[tuple[bytes, bytes]] = []
    raw = ctx.socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"kv")
    raw.connect(engines[0].pub)

    async def record() -> None:
        while True:
            _topic, seq, payload = await raw.recv_multipart()
            frames.append((seq, payload))

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(s.run()) for s in subs] + [loop.create_task(record())]
    for store in stores:
        await _until_live(store)
    yield Watch(stores, frames)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    raw.close(linger=0)
    ctx.term()
    out = os.environ.get("BERTH_RECORD_KV_EVENTS")
    if out and frames:
        await asyncio.to_thread(Path(out).write_bytes, msgspec.msgpack.encode([list(f) for f in frames[:40]]))


async def _until_live(store: WatchedStore) -> None:
    await store.until(lambda: store.state is SourceState.LIVE, WAIT_S)


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 500) for _ in range(n)]


PREFIX = _prompt(1, PROMPT_TOKENS)


async def _complete(base_url: str, prompt: list[int]) -> str:
    """Send a completion; the endpoint berth ran it on (X-Berth-Endpoint), '' when sent to an engine."""
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="test", max_retries=0, timeout=120) as c:
        raw = await c.completions.with_raw_response.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0, extra_body=IGNORE_EOS
        )
        return raw.headers.get("x-berth-endpoint", "")


async def _berth_blocks(berth: RunningServer, eid: str) -> tuple[float, float]:
    """berth's own store for `eid`: (blocks, 1 when live)."""
    text = await asyncio.to_thread(berth.metrics)
    blocks = total(text, "berth_kv_events_blocks", endpoint=eid)
    live = total(text, "berth_kv_events_source_state", endpoint=eid, state="live")
    return blocks, live


async def test_events_reach_the_stores_and_match_the_serving_endpoint(
    engines: list[Engine], precise_berth: RunningServer, watch: Watch
) -> None:
    served = await _complete(precise_berth.base_url, PREFIX)
    holder = next(i for i, e in enumerate(engines) if e.endpoint_id == served)
    mine = watch.stores[holder]
    other = watch.stores[1 - holder]
    # block size is the engine's, learned from its first event
    await mine.until(lambda: mine.cached_blocks() >= PROMPT_TOKENS // mine.block_tokens, WAIT_S)
    keys = token_chain(PREFIX, mine.block_tokens)
    assert mine.matched(keys) == len(keys) > 1
    assert other.matched(keys) == 0
    assert mine.status(0).orphans == 0
    # berth's own subscriber for that endpoint got the same blocks (its metrics, read until they show)
    async with asyncio.timeout(WAIT_S):
        while (await _berth_blocks(precise_berth, served))[0] < len(keys):
            await asyncio.sleep(0.2)  # another process: its metrics are polled
    for e in engines:
        assert (await _berth_blocks(precise_berth, e.endpoint_id))[1] == 1.0


async def test_a_prefix_sharer_hits_the_holders_cache(engines: list[Engine], watch: Watch) -> None:
    holder = engines[0]
    store = watch.stores[0]
    await _complete(holder.server.base_url, PREFIX)
    await store.until(lambda: store.cached_blocks() >= PROMPT_TOKENS // store.block_tokens, WAIT_S)
    before = await asyncio.to_thread(holder.hits)
    sharer = [*PREFIX, *_prompt(2, 200)]
    await _complete(holder.server.base_url, sharer)
    prefix_blocks = len(token_chain(PREFIX, store.block_tokens))
    assert await asyncio.to_thread(holder.hits) - before >= prefix_blocks * store.block_tokens
    keys = token_chain(sharer, store.block_tokens)
    await store.until(lambda: store.matched(keys) == len(keys), WAIT_S)


@pytest.mark.xfail(
    reason="not yet confirmed on this tier: placement weighs the predicted prefill saved against load, "
    "which on two idle CPU engines serving a tiny model may not favour the holder",
    strict=False,
)
async def test_prefix_sharers_go_to_the_holder(engines: list[Engine], precise_berth: RunningServer) -> None:
    """Each engine gets a long prompt of its own directly; then berth gets two requests sharing each
    prefix, A's first: every one must go to the engine holding its prefix. A deterministic tie-break
    or round robin cannot do that (they send A, A, B, B to one engine or alternate)."""
    bases = [_prompt(3, PROMPT_TOKENS), _prompt(4, PROMPT_TOKENS)]
    for engine, base in zip(engines, bases, strict=True):
        await _complete(engine.server.base_url, base)
    before = [await asyncio.to_thread(e.hits) for e in engines]
    places = [
        await _complete(precise_berth.base_url, [*base, *_prompt(10 + 2 * i + j, 64)])
        for i, base in enumerate(bases)
        for j in range(2)
    ]
    assert places == [engines[0].endpoint_id] * 2 + [engines[1].endpoint_id] * 2
    for engine, was in zip(engines, before, strict=True):
        # each sharer finds its base's full blocks cached (a block is at most 128 tokens on CPU)
        assert await asyncio.to_thread(engine.hits) - was >= 2 * (PROMPT_TOKENS - 128)
