"""Leased slices of large tenant limits (gateway.cluster.slices) against a real redis-server: admission
on a replica's slice without a call per request, the limits held across replicas (never more than the
limit; less by at most the slices others hold), idle slices given back at the beat, a slice spent while
Redis hangs, and a random walk of admissions and releases that never over-admits."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.admission.limits import Limit, Refusal, Seat, TenantLimits
from gateway.cluster import Cluster
from gateway.cluster.exporter import ClusterCollector
from gateway.cluster.link import text
from gateway.cluster.slices import slice_of
from gateway.config.cluster import ClusterConfig, ClusterSetup
from tests.integration.redis_server import RedisServer

MakeCluster = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def make_cluster(redis_server: RedisServer) -> AsyncIterator[MakeCluster]:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    made: list[Cluster] = []

    async def make(name: str, *, share: float = 0.05, url: str | None = None, **kw: object) -> Cluster:
        # A lease and a call's timeout far longer than a pause of the loop on a loaded machine: a replica
        # that beats seldom keeps its seats, a call is answered (tests of a hung Redis set their own).
        kw = {"lease_s": 60.0, "timeout_s": 10.0, "publish_interval_s": 0.1, **kw}
        cfg = ClusterConfig(
            redis=url or redis_server.url,
            name=name,
            key_prefix=prefix,
            slice_share=share,
            **kw,  # type: ignore[arg-type]
        )
        c = Cluster(ClusterSetup(config=cfg, name=name))
        made.append(c)
        return c

    yield make
    for c in made:
        await c.close()


async def seats_in_redis(c: Cluster, tenant: str) -> dict[str, int]:
    h = await c.link.redis.hgetall(c.link.key("tenant", tenant))
    fields = {text(k): int(v) for k, v in h.items()}
    return {k[2:]: n for k, n in fields.items() if k.startswith("s:")}


async def admit(c: Cluster, lim: TenantLimits, tokens: int = 10) -> Seat | Refusal:
    return await c.limits.admit("t", lim, tokens, 0.0)


def test_which_limits_are_sliced() -> None:
    assert slice_of(TenantLimits(max_concurrency=100), 0.02) is not None  # a slice of 2 seats
    assert slice_of(TenantLimits(max_concurrency=99), 0.02) is None  # 1 seat: exact
    assert slice_of(TenantLimits(requests_per_s=4.0), 0.05) is None
    assert slice_of(TenantLimits(tokens_per_min=600), 0.25) is None  # a slice below a few requests' charge
    big = slice_of(TenantLimits(requests_per_s=1000.0, tokens_per_min=10**7, max_concurrency=500), 0.02)
    assert big is not None
    assert (big.sr, big.st, big.ss) == (20, 200_000, 10)
    assert slice_of(TenantLimits(max_concurrency=10**6), 0.0) is None  # slices off


async def test_seats_hold_across_replicas_with_few_calls(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a"), await make_cluster("b")
    lim = TenantLimits(max_concurrency=40)  # slices of 2 seats
    for c in (a, b):
        c.limits.configure({"t": lim}, 0.0)
        await c.member.beat()
    mine: dict[str, list[Seat]] = {"a": [], "b": []}
    for c in (a, b):
        while isinstance(got := await admit(c, lim), Seat):
            mine[c.member.name].append(got)
        assert got.limit is Limit.CONCURRENCY
    n = len(mine["a"]) + len(mine["b"])
    # Never more than the limit; less by at most the two slices the other replica may hold spare.
    assert 40 - 2 * 2 <= n <= 40
    held = await seats_in_redis(a, "t")
    assert sum(held.values()) <= 40
    assert held["a"] >= len(mine["a"])
    assert held["b"] >= len(mine["b"])
    assert a.limits.slices.calls < len(mine["a"])  # a call per slice, not per request
    metrics = {m.name: m.samples[0].value for m in ClusterCollector(a).collect() if m.samples}
    assert metrics["berth_cluster_limit_slice_admissions"] == len(mine["a"])
    assert metrics["berth_cluster_limit_slice_calls"] == a.limits.slices.calls
    # a's requests finish: what it holds above two slices goes back; b gets the seats.
    for seat in mine["a"]:
        a.limits.release(seat, None, 0.0)
    assert await a.limits.flush()
    assert (await seats_in_redis(a, "t"))["a"] <= 2 * 2
    assert isinstance(await admit(b, lim), Seat)


async def test_requests_per_s_hold_across_replicas(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a"), await make_cluster("b")
    lim = TenantLimits(requests_per_s=200.0)  # a bucket of 200, slices of 10
    for c in (a, b):
        c.limits.configure({"t": lim}, 0.0)
    t0 = time.monotonic()
    got = [await admit(c, lim) for _ in range(150) for c in (a, b)]
    elapsed = time.monotonic() - t0
    admitted = sum(isinstance(g, Seat) for g in got)
    refused = [g for g in got if isinstance(g, Refusal)]
    # The bucket and what it refilled meanwhile, never more; less by at most the slices held spare.
    assert 200 - 2 * 2 * 10 <= admitted <= 200 + 200 * elapsed + 1
    assert refused
    assert all(r.limit is Limit.REQUESTS and r.retry_after_s is not None for r in refused)


async def test_an_idle_slice_is_given_back_at_the_beat(make_cluster: MakeCluster) -> None:
    a = await make_cluster("a")
    lim = TenantLimits(max_concurrency=200)  # slices of 10
    a.limits.configure({"t": lim}, 0.0)
    await a.member.beat()
    seat = await admit(a, lim)
    assert isinstance(seat, Seat)
    assert (await seats_in_redis(a, "t"))["a"] == 10  # one slice taken
    a.limits.release(seat, None, 0.0)
    await a.member.beat()  # the tenant was busy in this beat: it keeps its slice
    assert await a.limits.flush()
    assert (await seats_in_redis(a, "t"))["a"] == 10
    await a.member.beat()  # idle for a whole beat: all of it goes back
    assert await a.limits.flush()
    assert (await seats_in_redis(a, "t"))["a"] == 0


async def test_a_slice_is_spent_while_redis_hangs(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        cfg = ClusterConfig(redis=server.url, name="a", key_prefix="p", timeout_s=0.2, slice_share=0.05)
        c = Cluster(ClusterSetup(config=cfg, name="a"))
        lim = TenantLimits(requests_per_s=100.0)  # slices of 5 requests
        c.limits.configure({"t": lim}, 0.0)
        assert isinstance(await admit(c, lim), Seat)
        server.pause()
        async with asyncio.timeout(0.1):  # no call: the slice holds them
            got = [await admit(c, lim) for _ in range(4)]
        assert all(isinstance(g, Seat) and g.remote for g in got)
        async with asyncio.timeout(2.0):  # the slice is spent: one timeout, then the local fallback
            after = await admit(c, lim)
        assert isinstance(after, Seat)
        assert not after.remote
        server.resume()
        await c.close()
    finally:
        server.resume()
        server.stop()


async def test_a_random_walk_never_over_admits(make_cluster: MakeCluster) -> None:
    """Admissions, releases, top-ups, beats and reconciles in a random order on three replicas: the
    seats in use never exceed the limit, and Redis never counts fewer seats than a replica uses."""
    rs = [await make_cluster(n, share=0.1) for n in ("a", "b", "c")]
    lim = TenantLimits(max_concurrency=30)  # slices of 3
    for c in rs:
        c.limits.configure({"t": lim}, 0.0)
        await c.member.beat()
    rng = random.Random(7)
    used: dict[str, list[Seat]] = {c.member.name: [] for c in rs}
    for _ in range(400):
        c = rng.choice(rs)
        name = c.member.name
        op = rng.random()
        if op < 0.5:
            got = await admit(c, lim)
            if isinstance(got, Seat):
                used[name].append(got)
        elif op < 0.85 and used[name]:
            c.limits.release(used[name].pop(rng.randrange(len(used[name]))), None, 0.0)
        elif op < 0.95:
            assert await c.limits.flush()
        else:
            c.limits.reconcile_due = True  # each beat of the walk writes the replica's true count
            await c.member.beat()
        assert sum(len(v) for v in used.values()) <= 30
        held = await seats_in_redis(c, "t")
        assert held.get(name, 0) >= len(used[name])
