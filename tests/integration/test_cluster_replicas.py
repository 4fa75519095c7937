"""Two and three berth replicas (in-process apps over loopback) sharing one real redis-server, in front of
a fake engine: a tenant's limits hold across them, a task keeps one clock, each sees the others' load,
a replica that stops beating gives its seats back once its lease ran out, the leader is replaced, and Redis
stopped and restarted under load causes no 5xx and leaves no password in any log.

Nothing here hangs on wall-clock time: the replicas share one event loop, and a loaded machine may leave
it off the CPU for a second or more. So a Redis call's timeout and the leases are far longer than any
such pause (a paused replica neither falls back to local limits nor loses its lease); a replica's lease
running out is brought about in Redis (`lapse`) rather than waited for; every wait is on a condition,
checked at each beat, with a generous bound."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio

from gateway import clusterview
from gateway.cluster import Cluster, ClusterMember
from gateway.core.types import EndpointId
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine
from tests.integration.redis_server import RedisServer

CHAT = "/v1/chat/completions"
KEY = "sk-team-a-0123456789"
PASSWORD = "redis-pw-Q7xZ93"
#: Far longer than the test lasts: a live replica's lease never runs out here (see `lapse`).
LEASE_S = 60.0
#: Far longer than a pause of the loop: no call times out unless Redis is down (refused at once).
TIMEOUT_S = 10.0
#: The bound of every wait on a condition (`until`): reached only when the condition never holds.
WAIT_S = 60.0


def _toml(engine: str, redis: str, name: str, prefix: str, *, tenant: str, extra: str = "") -> str:
    return (
        f'[cluster]\nredis = "{redis}"\nname = "{name}"\nkey_prefix = "{prefix}"\n'
        f"lease_s = {LEASE_S}\npublish_interval_s = 0.1\ntimeout_s = {TIMEOUT_S}\n{extra}"
        f'[auth]\nrequired = true\n[[tenants]]\nname = "team-a"\napi_keys = ["{KEY}"]\n{tenant}'
        f'[[endpoints]]\nurl = "{engine}"\nmodels = ["tiny"]\n'
    )


def _body(*, stream: bool = False, max_tokens: int = 5) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "max_tokens": max_tokens,
    }


async def _post(r: Running, headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> int:
    hdrs = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    async with (
        aiohttp.ClientSession() as s,
        s.post(r.url + CHAT, data=orjson.dumps(body or _body()), headers=hdrs) as resp,
    ):
        await resp.read()
        return resp.status


def cluster_of(r: Running) -> Cluster:
    c = r.gw.cluster
    assert c is not None
    return c


async def until(member: ClusterMember, pred: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Wait, beat by beat of `member`'s own loop, until `pred()` holds (bounded by `timeout_s`)."""
    if pred():
        return
    ev = asyncio.Event()
    prev = member.hooks.on_peers

    def hook(loads: Any) -> None:
        prev(loads)
        if pred():
            ev.set()

    member.hooks.on_peers = hook
    try:
        async with asyncio.timeout(timeout_s):
            await ev.wait()
    finally:
        member.hooks.on_peers = prev


async def lapse(r: Running) -> None:
    """Replica `r` dies without a goodbye (as with SIGKILL) and its lease runs out: its beat stops (no
    leave), then its entry among the members and its leadership are given the state Redis holds once the
    lease expired. The others act on it at their next beat, as they would `lease_s` later."""
    m = cluster_of(r).member
    m.abandon()
    await r.gw.supervisor.cancel("cluster-beat")  # no beat of it is under way any more
    redis = m.link.redis
    await redis.zadd(m.link.key("members"), {m.name: 0})  # its lease expired long ago
    leader = await redis.get(m.link.key("leader"))
    if leader is not None and leader.split()[0] == m.name.encode():
        await redis.delete(m.link.key("leader"))  # the leadership key's PX ran out


async def _replicas(
    n: int, start_gateway: StartGateway, engine: str, redis: str, tenant: str, *, extra: str = ""
) -> list[Running]:
    prefix = f"r{uuid.uuid4().hex[:8]}"
    rs = [
        await start_gateway([], toml=_toml(engine, redis, f"r{i}", prefix, tenant=tenant, extra=extra))
        for i in range(n)
    ]
    names = tuple(f"r{i}" for i in range(n))
    for r in rs:
        m = cluster_of(r).member
        await until(m, lambda m=m: m.members == names)  # type: ignore[misc]
    return rs


async def test_requests_per_s_hold_across_three_replicas(
    engine_server: EngineServer, start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    engine = await engine_server(FakeEngine())
    rs = await _replicas(3, start_gateway, engine, redis_server.url, "requests_per_s = 0.01\n")
    # One bucket of one request (a refill takes 100 s) for the tenant, whichever replica the client reaches.
    statuses = [await _post(rs[i % 3]) for i in range(6)]
    assert statuses.count(200) == 1
    assert statuses.count(429) == 5


async def test_max_concurrency_holds_across_replicas_and_a_finish_frees_the_seat(
    engine_server: EngineServer, start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    eng = FakeEngine(hold=asyncio.Event())
    engine = await engine_server(eng)
    r0, r1 = await _replicas(2, start_gateway, engine, redis_server.url, "max_concurrency = 1\n")
    first = asyncio.ensure_future(_post(r0))
    await eng.started.wait()
    assert await _post(r1) == 429
    assert eng.hold is not None
    eng.hold.set()
    assert await first == 200
    limits = cluster_of(r0).limits
    # The client may have its answer before r0 gave the seat back: wait until r0 holds none and has sent
    # its release.
    await until(cluster_of(r0).member, lambda: not limits.held.get("team-a") and limits.pending == 0)
    assert await _post(r1) == 200


async def test_a_replica_that_stops_beating_gives_its_seats_back_once_its_lease_ran_out(
    engine_server: EngineServer, start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    eng = FakeEngine(hold=asyncio.Event())
    engine = await engine_server(eng)
    r0, r1 = await _replicas(2, start_gateway, engine, redis_server.url, "max_concurrency = 1\n")
    held = asyncio.ensure_future(_post(r0))
    await eng.started.wait()
    assert await _post(r1) == 429
    # r0 dies holding its seat (as with SIGKILL: no release, no goodbye): once its lease ran out the seat
    # is r1's to give.
    cluster_of(r0).limits.release = lambda *a: None  # type: ignore[method-assign]
    await lapse(r0)
    m1 = cluster_of(r1).member
    await until(m1, lambda: m1.members == ("r1",))
    eng.hold = None  # the next request is answered at once
    assert await _post(r1) == 200
    assert eng.hold is None
    held.cancel()


async def test_a_tasks_calls_on_different_replicas_keep_one_clock(
    engine_server: EngineServer, start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    engine = await engine_server(FakeEngine())
    rs = await _replicas(3, start_gateway, engine, redis_server.url, "")
    task = {"x-berth-task-id": "job-7", "x-berth-task-sla-ms": "60000"}
    took = []
    for r in rs:
        t0 = r.gw.clock.now()
        assert await _post(r, task) == 200
        took.append(r.gw.clock.now() - t0)
    key = "team-a\x00job-7"
    clocks = [r.gw.services.slo.tasks._tasks[key] for r in rs]
    assert [t.calls for t in clocks] == [1, 2, 3]  # steps 0, 1, 2: one task, not three
    assert {t.sla_s for t in clocks} == {60.0}
    # One start: each replica turns Redis's "started this long ago" into a start on its clock (all three
    # read one clock here) when the answer arrives, so each is late by at most its call's duration.
    starts = [t.start for t in clocks]
    assert max(starts) - min(starts) <= max(took)


async def test_each_replica_places_with_the_others_load(
    engine_server: EngineServer, start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    eng = FakeEngine(hold=asyncio.Event())
    engine = await engine_server(eng)
    r0, r1 = await _replicas(2, start_gateway, engine, redis_server.url, "")
    eid = r1.gw.scheduler.endpoint_ids()[0]
    running = asyncio.ensure_future(_post(r0, body=_body(max_tokens=64)))
    await eng.started.wait()

    def seen() -> int:
        view = r1.gw.scheduler.endpoint_view(EndpointId(eid))
        return 0 if view is None else view.inflight

    await until(cluster_of(r1).member, lambda: seen() == 1)
    assert r1.gw.scheduler.inflight_on(eid) == 0  # r1's own: none; its view holds r0's request
    assert eng.hold is not None
    eng.hold.set()
    assert await running == 200
    await until(cluster_of(r1).member, lambda: seen() == 0)


async def test_the_leader_is_replaced_once_its_lease_ran_out(
    engine_server: EngineServer, start_gateway: StartGateway, redis_server: RedisServer
) -> None:
    engine = await engine_server(FakeEngine())
    rs = await _replicas(3, start_gateway, engine, redis_server.url, "")
    leaders = [r for r in rs if cluster_of(r).member.is_leader]
    assert len(leaders) == 1
    old = cluster_of(leaders[0]).member
    token = old.token
    assert token is not None
    await lapse(leaders[0])  # killed: it never gives the lease up
    others = [cluster_of(r).member for r in rs if r is not leaders[0]]
    await until(others[0], lambda: any(m.is_leader for m in others) and others[0].leader != old.name)
    new = [m for m in others if m.is_leader]
    assert len(new) == 1
    assert (new[0].fencing_token() or 0) > token


async def test_redis_restarted_under_load_no_5xx_fallback_recovery_and_no_password_in_logs(
    engine_server: EngineServer,
    start_gateway: StartGateway,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = RedisServer(tmp_path, password=PASSWORD)
    server.start()
    monkeypatch.setenv("BERTH_TEST_REDIS_PW", PASSWORD)
    try:
        engine = await engine_server(FakeEngine())
        rs = await _replicas(
            2,
            start_gateway,
            engine,
            server.url,
            "requests_per_s = 1000\nmax_concurrency = 50\n",
            extra='password_env = "BERTH_TEST_REDIS_PW"\n',
        )
        statuses: list[int] = []
        stop = asyncio.Event()

        async def load(r: Running) -> None:
            while not stop.is_set():
                statuses.append(await _post(r))

        clients = [asyncio.ensure_future(load(r)) for r in rs for _ in range(2)]
        await until(cluster_of(rs[0]).member, lambda: len(statuses) > 20)
        server.stop()
        for r in rs:
            m = cluster_of(r).member
            await until(m, lambda m=m: not m.link.up)  # type: ignore[misc]
        during = len(statuses)
        await until(cluster_of(rs[0]).member, lambda: len(statuses) > during + 20)
        assert cluster_of(rs[0]).limits.fallback_admits > 0  # the documented fallback: local limits
        assert cluster_of(rs[0]).member.document()["fallback"]["leader"] == "none"
        server.start()
        # Each replica's own beat answered since (an admission may bring the link up first, and the
        # members seen last are the ones from before): then each knows the one leader elected since.
        beats = [cluster_of(r).member.beats for r in rs]
        for r, n in zip(rs, beats, strict=True):
            m = cluster_of(r).member
            await until(m, lambda m=m, n=n: m.link.up and m.beats > n and len(m.members) == 2)  # type: ignore[misc]
        after = len(statuses)
        await until(cluster_of(rs[0]).member, lambda: len(statuses) > after + 20)
        stop.set()
        await asyncio.gather(*clients)
        assert set(statuses) == {200}
        assert sum(1 for r in rs if cluster_of(r).member.is_leader) == 1
        async with aiohttp.ClientSession() as s, s.get(rs[0].url + "/metrics") as resp:
            text = await resp.text()
        assert 'berth_cluster_redis_state_changes_total{state="down"}' in text
        assert "berth_cluster_redis_up 1.0" in text
        out = capsys.readouterr()
        assert "cluster_redis_down" in out.out + out.err
        assert "cluster_redis_up" in out.out + out.err
        assert PASSWORD not in out.out + out.err
        assert PASSWORD not in text
        async with aiohttp.ClientSession() as s, s.get(rs[0].url + "/admin/cluster") as resp:
            doc = await resp.read()
        assert PASSWORD.encode() not in doc
        assert orjson.loads(doc)["cluster"]["redis"] == server.url
    finally:
        server.stop()


async def test_without_cluster_nothing_is_built_or_contacted(
    engine_server: EngineServer, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*a: object, **kw: object) -> None:
        raise AssertionError("a Redis client was made without [cluster]")

    monkeypatch.setattr(redis.asyncio.Redis, "__init__", refuse)
    engine = await engine_server(FakeEngine())
    r = await start_gateway([engine])
    assert r.gw.cluster is None
    assert r.gw.services.tenancy.shared is None
    assert r.gw.services.slo.shared is None
    assert not [n for n in r.gw.supervisor.names if n.startswith("cluster")]
    assert await _post(r) == 200
    async with aiohttp.ClientSession() as s, s.get(r.url + "/admin/cluster") as resp:
        assert orjson.loads(await resp.read()) == {"cluster": None}


async def test_berth_cluster_shows_members_leader_token_and_fallback(
    engine_server: EngineServer,
    start_gateway: StartGateway,
    redis_server: RedisServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = await engine_server(FakeEngine())
    r0, r1 = await _replicas(2, start_gateway, engine, redis_server.url, "max_concurrency = 5\n")
    out = io.StringIO()
    assert await asyncio.to_thread(clusterview.run, [r0.url, r1.url], None, out=out) == 0
    text = out.getvalue()
    leader = cluster_of(r0).member.leader
    token = cluster_of(r0).member.token
    assert text.count("members   r0 r1 (2)") == 2
    assert text.count(f"leader    {leader}  fencing token {token}") == 2
    assert "this replica: leader" in text
    assert "this replica: follower" in text
    assert "fallback  limits=shared  load=shared  leader=elected" in text
    assert f"redis     {redis_server.url}  up  rtt " in text
    js = io.StringIO()
    assert await asyncio.to_thread(clusterview.run, [r0.url], None, as_json=True, out=js) == 0
    assert orjson.loads(js.getvalue())[r0.url]["name"] == "r0"


async def test_berth_cluster_says_when_a_gateway_is_not_in_cluster_mode(
    engine_server: EngineServer, start_gateway: StartGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    r = await start_gateway([await engine_server(FakeEngine())])
    assert await asyncio.to_thread(clusterview.run, [r.url], None, out=io.StringIO()) == 1
    assert "not in cluster mode" in capsys.readouterr().err
