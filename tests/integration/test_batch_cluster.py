"""Files and batches in cluster mode: two berth replicas (in-process apps over loopback) sharing one real
redis-server, each with its own batch directory, in front of a fake engine. Any replica answers for any
file or batch (the one that holds it answers through the other), lists merge both, a batch is created
where its input file is, a holder that is down gives 503 (never 404) and its batches resume when it is
back, and another tenant still gets 404."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import openai
import orjson
import pytest

from gateway.batch.model import replica_tag, tag_of
from gateway.cluster.directory import ReplicaDirectory
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine
from tests.integration.redis_server import RedisServer, free_port

CHAT: Final = "/v1/chat/completions"
KEY_A: Final = "sk-team-a-0123456789"
KEY_B: Final = "sk-team-b-0123456789"


def _toml(engine: str, redis: str, name: str, prefix: str, *, port: int, batch_dir: Path) -> str:
    return (
        f'[cluster]\nredis = "{redis}"\nname = "{name}"\nkey_prefix = "{prefix}"\n'
        f'lease_s = 1.0\npublish_interval_s = 0.1\ntimeout_s = 5.0\nadvertise_url = "http://127.0.0.1:{port}"\n'
        f'[server]\ndrain_timeout_s = 0.2\n[batch]\ndir = "{batch_dir}"\nmax_lines_in_flight = 3\n'
        f'[auth]\nrequired = true\n[[tenants]]\nname = "team-a"\napi_keys = ["{KEY_A}"]\n'
        f'[[tenants]]\nname = "team-b"\napi_keys = ["{KEY_B}"]\n'
        f'[[endpoints]]\nurl = "{engine}"\nmodels = ["tiny"]\n'
    )


def jsonl(n: int) -> bytes:
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": "tiny", "messages": [{"role": "user", "content": f"line {i}"}]},
            }
        )
        + b"\n"
        for i in range(n)
    )


def client(r: Running, key: str = KEY_A) -> openai.AsyncOpenAI:
    return r.client(api_key=key)


def directory(r: Running) -> ReplicaDirectory:
    d = r.gw.directory
    assert d is not None
    return d


async def beats_until(r: Running, pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait, beat by beat of `r`'s own membership loop, until `pred()` holds (bounded by `timeout_s`)."""
    if pred():
        return
    assert r.gw.cluster is not None
    hooks = r.gw.cluster.member.hooks
    ev = asyncio.Event()
    prev = hooks.on_peers

    def hook(loads: Any) -> None:
        prev(loads)
        if pred():
            ev.set()

    hooks.on_peers = hook
    try:
        async with asyncio.timeout(timeout_s):
            await ev.wait()
    finally:
        hooks.on_peers = prev


class Pair:
    """Two replicas r0 and r1 (names, ports and batch directories fixed: r0 may be started again)."""

    def __init__(self, start: StartGateway, engine: str, redis: str, tmp: Path) -> None:
        self.start_gateway = start
        self.engine = engine
        self.redis = redis
        self.tmp = tmp
        self.prefix = f"b{uuid.uuid4().hex[:8]}"
        self.r: list[Running] = []

    async def start(self, i: int) -> Running:
        port = free_port()
        toml = _toml(
            self.engine, self.redis, f"r{i}", self.prefix, port=port, batch_dir=self.tmp / f"batch-r{i}"
        )
        return await self.start_gateway([], toml=toml, port=port)

    async def up(self) -> list[Running]:
        self.r = [await self.start(0), await self.start(1)]
        await self.settled()
        return self.r

    async def settled(self) -> None:
        """Every replica sees every other as a member, at the address it runs at now."""
        names = {f"r{i}" for i in range(len(self.r))}
        for r in self.r:
            await beats_until(r, lambda r=r: set(directory(r).live()) == names)  # type: ignore[misc]
        for r in [*self.r, self.r[0]]:  # each writes its address; the first reads the last one's
            assert await directory(r).refresh()
        urls = {f"r{i}": r.url for i, r in enumerate(self.r)}
        assert all(dict(directory(r).urls()) == urls for r in self.r)


@pytest.fixture
async def pair(
    engine_server: EngineServer, start_gateway: StartGateway, redis_server: RedisServer, tmp_path: Path
) -> Callable[[FakeEngine], Any]:
    async def make(engine: FakeEngine) -> Pair:
        url = await engine_server(engine)
        p = Pair(start_gateway, url, redis_server.url, tmp_path)
        async with asyncio.timeout(15):
            await p.up()
        return p

    return make


async def test_upload_on_one_create_on_the_other_and_read_anywhere(pair: Any) -> None:
    p: Pair = await pair(FakeEngine(tokens=3))
    r0, r1 = p.r
    a0, a1 = client(r0), client(r1)
    f = await a0.files.create(file=("in.jsonl", io.BytesIO(jsonl(4))), purpose="batch")
    assert tag_of(f.id) == replica_tag("r0")
    assert (await a1.files.retrieve(f.id)).id == f.id
    assert (await a1.files.content(f.id)).content == jsonl(4)

    batch = await a1.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    assert tag_of(batch.id) == replica_tag("r0")  # created where its input file is
    assert batch.status == "in_progress"
    await r0.gw.batch.wait_ended(batch.id)
    for c in (a0, a1):
        done = await c.batches.retrieve(batch.id)
        assert done.status == "completed"
        assert [b.id for b in (await c.batches.list()).data] == [batch.id]
    assert done.output_file_id is not None
    assert tag_of(done.output_file_id) == replica_tag("r0")
    out = (await a1.files.content(done.output_file_id)).content
    assert [orjson.loads(x)["custom_id"] for x in out.splitlines()] == [f"req-{i}" for i in range(4)]
    ids = {x.id for x in (await a1.files.list()).data}
    assert ids == {f.id, done.output_file_id}

    # Another tenant: 404 on both replicas, and empty lists.
    for r in (r0, r1):
        b = client(r, KEY_B)
        with pytest.raises(openai.NotFoundError):
            await b.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            await b.files.content(done.output_file_id)
        with pytest.raises(openai.NotFoundError):
            await b.batches.cancel(batch.id)
        with pytest.raises(openai.NotFoundError):
            await b.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        assert (await b.batches.list()).data == []
        assert (await b.files.list()).data == []

    deleted = await a1.files.delete(f.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await a0.files.retrieve(f.id)


async def test_lists_merge_both_replicas_page_by_page(pair: Any) -> None:
    p: Pair = await pair(FakeEngine(tokens=1))
    r0, r1 = p.r
    made: list[str] = []
    for r in (r0, r1, r0, r1, r1):
        c = client(r)
        f = await c.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
        b = await c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        made.append(b.id)
    for r in (r0, r1):
        c = client(r)
        full = (await c.batches.list(limit=100)).data
        assert sorted(b.id for b in full) == sorted(made)
        keys = [(b.created_at, b.id) for b in full]
        assert keys == sorted(keys, reverse=True)
        paged = [b.id async for b in c.batches.list(limit=2)]  # the SDK follows `after`
        assert paged == [b.id for b in full]
        files = [f.id async for f in c.files.list(limit=3, order="asc")]
        assert len(files) == len(set(files)) >= 5


async def test_cancel_on_the_other_replica(pair: Any) -> None:
    engine = FakeEngine(tokens=2, hold=asyncio.Event())
    p: Pair = await pair(engine)
    r0, r1 = p.r
    f = await client(r1).files.create(file=("in.jsonl", io.BytesIO(jsonl(6))), purpose="batch")
    batch = await client(r1).batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    await engine.started.wait()
    cancelled = await client(r0).batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    await r1.gw.batch.wait_ended(batch.id)
    assert (await client(r0).batches.retrieve(batch.id)).status == "cancelled"


async def test_a_holder_that_is_down_answers_503_and_its_batches_resume_when_it_is_back(pair: Any) -> None:
    engine = FakeEngine(tokens=2, hold=asyncio.Event())
    p: Pair = await pair(engine)
    r0, r1 = p.r
    a1 = client(r1)
    async with client(r0) as a0:
        f = await a0.files.create(file=("in.jsonl", io.BytesIO(jsonl(5))), purpose="batch")
    batch = await a1.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    await engine.started.wait()
    # r0 stops (its lease is given up: it is no member any more); its batch is unfinished on its disk.
    await r0.server.close()
    await beats_until(r1, lambda: "r0" not in directory(r1).live())
    for call in (
        lambda: a1.batches.retrieve(batch.id),
        lambda: a1.files.content(f.id),
        lambda: a1.batches.cancel(batch.id),
        lambda: a1.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h"),
    ):
        with pytest.raises(openai.InternalServerError) as e:
            await call()
        assert e.value.status_code == 503
        assert e.value.code == "replica_unavailable"
    listed = await a1.batches.with_raw_response.list()
    assert listed.headers["x-berth-replicas-missing"] == "r0"
    assert listed.parse().data == []
    async with client(r1, KEY_B) as b1:
        with pytest.raises(openai.NotFoundError):  # an id of no replica: no peer is asked
            await b1.batches.retrieve("batch_" + "0" * 32)

    # r0 starts again (same name and directory, a new port): the batch resumes and r1 reaches it there.
    assert engine.hold is not None
    engine.hold.set()
    r0 = await p.start(0)
    p.r = [r0, r1]
    await p.settled()
    await r0.gw.batch.wait_ended(batch.id)
    done = await a1.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert done.request_counts.completed == 5
    await a1.close()


async def test_a_holder_killed_without_leaving_answers_503_at_once(pair: Any) -> None:
    p: Pair = await pair(FakeEngine(tokens=1))
    r0, r1 = p.r
    f = await client(r0).files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
    # r0 dies without a goodbye: within its lease it is still a member, but nothing listens.
    assert r0.gw.cluster is not None
    r0.gw.cluster.member.abandon()
    await r0.server.close()
    assert "r0" in directory(r1).live()
    with pytest.raises(openai.InternalServerError) as e:
        await client(r1).files.retrieve(f.id)
    assert e.value.status_code == 503
