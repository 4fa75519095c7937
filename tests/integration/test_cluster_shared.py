"""The cluster's shared pieces against a real redis-server: tenant limits held across replicas, seats of a
dead replica returned within its lease, the shared task clock, the leader lease and its fencing token,
and the fallbacks while Redis does not answer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.admission.limits import Limit, Refusal, Seat, TenantLimits
from gateway.cluster import Cluster, ClusterMember
from gateway.cluster.link import text
from gateway.config.cluster import ClusterConfig, ClusterSecret, ClusterSetup
from gateway.core.errors import BerthError
from gateway.core.types import EndpointId
from gateway.sched.types import PeerLoad
from tests.integration.redis_server import RedisServer, free_port

MakeCluster = Callable[..., Awaitable[Cluster]]


def setup_of(url: str, name: str, prefix: str, **kw: object) -> ClusterSetup:
    password = kw.pop("password", None)
    cfg = ClusterConfig(redis=url, name=name, key_prefix=prefix, **kw)  # type: ignore[arg-type]
    return ClusterSetup(
        config=cfg, name=name, password=None if password is None else ClusterSecret(str(password))
    )


@pytest.fixture
async def make_cluster(redis_server: RedisServer) -> AsyncIterator[MakeCluster]:
    """Replicas of one cluster (a fresh key prefix per test) on the session's redis-server."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    made: list[Cluster] = []

    async def make(name: str, *, url: str | None = None, **kw: object) -> Cluster:
        # A lease and a call's timeout far longer than a pause of the loop on a loaded machine (tests of a
        # lease running out or of Redis down set their own).
        kw.setdefault("lease_s", 60.0)
        kw.setdefault("timeout_s", 10.0)
        kw.setdefault("publish_interval_s", 0.1)
        c = Cluster(setup_of(url or redis_server.url, name, prefix, **kw))
        made.append(c)
        return c

    yield make
    for c in made:
        await c.close()


async def beat_until(member: ClusterMember, pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Beat at the member's own interval until `pred()` holds (a lease runs out in time, not in events);
    bounded by `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while True:
            await member.beat()
            if pred():
                return
            await asyncio.sleep(member.interval_s)


async def admit(c: Cluster, tenant: str, limits: TenantLimits, tokens: int = 10) -> Seat | Refusal:
    return await c.limits.admit(tenant, limits, tokens, 0.0)


async def test_requests_per_s_hold_across_replicas(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a"), await make_cluster("b")
    lim = TenantLimits(requests_per_s=4.0)
    for c in (a, b):
        c.limits.configure({"t": lim}, 0.0)
    got = [await admit(c, "t", lim) for c in (a, b, a, b, a, b)]
    seats = [g for g in got if isinstance(g, Seat)]
    refused = [g for g in got if isinstance(g, Refusal)]
    # One bucket of 4 for the tenant, whichever replica asks (a refill during the test may add one).
    assert 4 <= len(seats) <= 5
    assert refused
    assert all(r.limit is Limit.REQUESTS and r.retry_after_s for r in refused)
    assert all(s.remote for s in seats)


async def test_tokens_per_min_hold_and_are_corrected_at_finish(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a"), await make_cluster("b")
    lim = TenantLimits(tokens_per_min=600)
    for c in (a, b):
        c.limits.configure({"t": lim}, 0.0)
    first = await admit(a, "t", lim, 400)
    assert isinstance(first, Seat)
    assert first.charged_tokens == 400
    over = await admit(b, "t", lim, 400)
    assert isinstance(over, Refusal)
    assert over.limit is Limit.TOKENS
    # The first request used only 100 of its 400: 300 come back to the shared bucket.
    a.limits.release(first, 100, 0.0)
    assert await a.limits.flush()
    again = await admit(b, "t", lim, 400)
    assert isinstance(again, Seat)


async def test_max_concurrency_holds_across_replicas_and_release_frees_a_seat(
    make_cluster: MakeCluster,
) -> None:
    a, b, c = await make_cluster("a"), await make_cluster("b"), await make_cluster("c")
    lim = TenantLimits(max_concurrency=3)
    for r in (a, b, c):
        r.limits.configure({"t": lim}, 0.0)
        await r.member.beat()
    seats = [await admit(r, "t", lim) for r in (a, b, c)]
    assert all(isinstance(s, Seat) for s in seats)
    refused = await admit(b, "t", lim)
    assert isinstance(refused, Refusal)
    assert refused.limit is Limit.CONCURRENCY
    assert refused.retry_after_s is None
    s0 = seats[0]
    assert isinstance(s0, Seat)
    a.limits.release(s0, None, 0.0)
    assert await a.limits.flush()
    assert isinstance(await admit(b, "t", lim), Seat)


async def test_a_dead_replicas_seats_return_within_its_lease(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a", lease_s=0.5), await make_cluster("b", lease_s=0.5)
    lim = TenantLimits(max_concurrency=2)
    for r in (a, b):
        r.limits.configure({"t": lim}, 0.0)
        await r.member.beat()
    assert isinstance(await admit(a, "t", lim), Seat)
    assert isinstance(await admit(a, "t", lim), Seat)
    assert isinstance(await admit(b, "t", lim), Refusal)
    # Replica a dies (no release, no more beats): once its lease ran out its seats are dropped.
    a.member.abandon()
    await beat_until(b.member, lambda: b.member.members == ("b",))
    assert isinstance(await admit(b, "t", lim), Seat)


async def test_reconcile_writes_the_seats_a_replica_really_holds(make_cluster: MakeCluster) -> None:
    a = await make_cluster("a")
    lim = TenantLimits(max_concurrency=1)
    a.limits.configure({"t": lim}, 0.0)
    await a.member.beat()  # the first beat writes the true counts (0)
    seat = await admit(a, "t", lim)
    assert isinstance(seat, Seat)
    # The release is lost (Redis down at the time, say): the next reconcile still frees the seat.
    a.limits.held["t"] = 0
    a.limits.reconcile_due = True
    await a.member.beat()
    assert isinstance(await admit(a, "t", lim), Seat)


async def seats_in_redis(c: Cluster, tenant: str) -> dict[str, int]:
    h = await c.link.redis.hgetall(c.link.key("tenant", tenant))
    return {text(k)[2:]: int(v) for k, v in h.items() if text(k).startswith("s:")}


async def beating_pair(make_cluster: MakeCluster, lim: TenantLimits) -> tuple[Cluster, Cluster]:
    """Replicas a and b with tenant "t" under `lim`, each having beaten once (members of each other)."""
    a, b = await make_cluster("a"), await make_cluster("b")
    for c in (a, b):
        c.limits.configure({"t": lim}, 0.0)
    for c in (a, b):
        await c.member.beat()
    return a, b


async def test_a_reconcile_waits_for_an_admission_under_way_and_writes_no_seat_it_was_refused(
    make_cluster: MakeCluster,
) -> None:
    lim = TenantLimits(max_concurrency=1)
    a, b = await beating_pair(make_cluster, lim)
    assert isinstance(await admit(a, "t", lim), Seat)
    asking = asyncio.ensure_future(admit(b, "t", lim))
    for _ in range(100):  # until b's admission is sent (a few turns of the loop)
        if b.limits.order.under_way:
            break
        await asyncio.sleep(0)
    assert b.limits.order.under_way == 1
    b.limits.reconcile_due = True
    reconciling = asyncio.ensure_future(b.limits.reconcile())
    assert isinstance(await asking, Refusal)
    assert await reconciling
    # b's count is written once its admission was answered: 0, not a seat too many until the next beat.
    assert (await seats_in_redis(b, "t"))["b"] == 0
    assert (await seats_in_redis(a, "t"))["a"] == 1


async def test_seat_changes_sent_during_a_reconcile_land_after_its_count(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    lim = TenantLimits(max_concurrency=2)
    a, b = await beating_pair(make_cluster, lim)
    seat = await admit(a, "t", lim)
    assert isinstance(seat, Seat)
    # The reconcile's write is held on its way to Redis until `go` is set.
    go = asyncio.Event()
    write = a.limits._seats

    async def held_write(**kw: Any) -> Any:
        await go.wait()
        return await write(**kw)

    monkeypatch.setattr(a.limits, "_seats", held_write)
    a.limits.reconcile_due = True
    reconciling = asyncio.ensure_future(a.limits.reconcile())
    await asyncio.sleep(0)
    assert not a.limits.reconcile_due  # counted: 1 seat
    # A release and an admission asked for meanwhile wait for the count to be written, then
    # change it: neither is overwritten by it (a seat leaked, or one too few).
    a.limits.release(seat, None, 0.0)
    flushing = asyncio.ensure_future(a.limits.flush())
    asking = asyncio.ensure_future(admit(a, "t", lim))
    for _ in range(100):  # until both are held back (a few turns of the loop)
        if a.limits.order.held_back == 2:
            break
        await asyncio.sleep(0)
    assert a.limits.order.held_back == 2
    go.set()
    assert await reconciling
    assert await flushing
    assert isinstance(await asking, Seat)
    assert (await seats_in_redis(a, "t"))["a"] == 1
    assert isinstance(await admit(b, "t", lim), Seat)
    assert isinstance(await admit(b, "t", lim), Refusal)


async def test_redis_down_falls_back_to_the_replicas_share(make_cluster: MakeCluster) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    c = await make_cluster("a", url=dead, timeout_s=0.2)
    lim = TenantLimits(requests_per_s=4.0, max_concurrency=4)
    c.limits.configure({"t": lim}, 0.0)
    c.limits.set_replicas(2, 0.0)  # two replicas were seen last: this one may use half
    got = [await c.limits.admit("t", lim, 1, 0.0) for _ in range(4)]
    assert [isinstance(g, Seat) for g in got] == [True, True, False, False]
    assert all(isinstance(g, Seat) and not g.remote for g in got[:2])
    assert not c.link.up
    assert c.member.document()["fallback"] == {"limits": "local", "load": "local", "leader": "none"}


async def test_redis_down_refuses_when_configured(make_cluster: MakeCluster) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    c = await make_cluster("a", url=dead, timeout_s=0.2, on_redis_down="refuse")
    lim = TenantLimits(requests_per_s=4.0)
    c.limits.configure({"t": lim}, 0.0)
    with pytest.raises(BerthError) as e:
        await c.limits.admit("t", lim, 1, 0.0)
    assert e.value.status == 503
    assert e.value.code == "limits_unavailable"


async def test_task_calls_on_different_replicas_share_one_clock(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a"), await make_cluster("b")
    first = await a.tasks.call("tenant\x00task-1", "coding", 10.0, 600.0)
    second = await b.tasks.call("tenant\x00task-1", "chat", None, 600.0)
    third = await a.tasks.call("tenant\x00task-1", "chat", None, 600.0)
    assert first is not None
    assert second is not None
    assert third is not None
    assert first[3] == 0
    assert second[3] == 1
    assert third[3] == 2
    # The first call's type and SLA are the task's; the task started before the second call.
    assert second[1] == "coding"
    assert second[2] == 10.0
    assert second[0] >= 0.0
    # A call that never ran gives its step back: the retry is the same step.
    b.tasks.abandon("tenant\x00task-1", 2)
    await b.tasks.flush()
    retry = await b.tasks.call("tenant\x00task-1", "chat", None, 600.0)
    assert retry is not None
    assert retry[3] == 2


async def test_one_leader_with_a_fencing_token_and_a_takeover(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a", lease_s=0.5), await make_cluster("b", lease_s=0.5)
    await a.member.beat()
    await b.member.beat()
    assert a.member.is_leader
    assert not b.member.is_leader
    assert a.member.leader == b.member.leader == "a"
    t1 = a.member.fencing_token()
    assert t1 is not None
    assert b.member.fencing_token() is None
    # The leader stops beating (killed): b takes over once the lease ran out, with a higher token.
    a.member.abandon()
    await beat_until(b.member, lambda: b.member.is_leader)
    t2 = b.member.fencing_token()
    assert t2 is not None
    assert t2 > t1


async def test_the_leader_leaves_at_shutdown(make_cluster: MakeCluster) -> None:
    a, b = (
        await make_cluster("a", lease_s=30.0, publish_interval_s=0.1),
        await make_cluster("b", lease_s=30.0),
    )
    await a.member.beat()
    assert a.member.is_leader
    await a.member.leave()
    await b.member.beat()
    assert b.member.is_leader  # at once, not after the 30 s lease


async def test_endpoint_load_published_and_summed_over_peers(make_cluster: MakeCluster) -> None:
    a, b, c = await make_cluster("a"), await make_cluster("b"), await make_cluster("c")
    e1 = EndpointId("e1")
    a.member.hooks.own_load = lambda: {e1: PeerLoad(3, 300, 30.0)}
    b.member.hooks.own_load = lambda: {e1: PeerLoad(2, 200, 20.0)}
    seen: list[dict[EndpointId, PeerLoad]] = []
    c.member.hooks.on_peers = lambda loads: seen.append(dict(loads))
    await a.member.beat()
    await b.member.beat()
    await c.member.beat()
    assert seen[-1] == {e1: PeerLoad(5, 500, 50.0)}
    assert c.member.members == ("a", "b", "c")


async def test_followers_forward_cold_starts_to_the_leader(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a"), await make_cluster("b")
    asked: list[list[str]] = []
    a.member.hooks.on_cold = asked.append
    await a.member.beat()
    b.member.forward_cold(["m1"])
    await b.member.beat()
    await a.member.beat()
    assert asked == [["m1"]]


async def test_the_leaders_failed_cold_start_reaches_the_followers(make_cluster: MakeCluster) -> None:
    a, b = await make_cluster("a"), await make_cluster("b")
    failed: list[tuple[str, str]] = []
    b.member.hooks.on_load_failed = lambda model, reason: failed.append((model, reason))
    await a.member.beat()
    a.member.load_failed("m0", "earlier")  # published before b's first beat: history to b
    await a.member.beat()
    await b.member.beat()
    assert failed == []
    a.member.load_failed("m1", "engine_exited: boom")
    await a.member.beat()
    await b.member.beat()
    await b.member.beat()  # once only
    assert failed == [("m1", "engine_exited: boom")]
    a.member.load_failed("m1", "engine_exited: again")  # the same model fails again: a new failure
    await a.member.beat()
    await b.member.beat()
    assert failed[-1] == ("m1", "engine_exited: again")
    b.member.load_failed("m2", "ignored")  # only the leader publishes
    await b.member.beat()
    await b.member.beat()
    assert len(failed) == 2


async def test_password_from_the_config_authenticates(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, password="s3cret-pass")
    server.start()
    try:
        c = Cluster(setup_of(server.url, "a", "p", password="s3cret-pass"))
        assert await c.member.beat()
        wrong = Cluster(setup_of(server.url, "b", "p", password="nope"))
        assert not await wrong.member.beat()
        assert "s3cret" not in repr(c.setup)
        assert "s3cret" not in str(c.member.document())
        await c.close()
        await wrong.close()
    finally:
        server.stop()


async def test_a_hung_redis_costs_one_timeout_then_the_fallback(tmp_path: Path) -> None:
    """SIGSTOP: Redis keeps the connections and answers nothing. Each call gives up after timeout_s (the
    request waits that long, once) and the piece falls back; SIGCONT: the next beat recovers."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        c = Cluster(
            setup_of(
                server.url, "a", "p", timeout_s=0.2, lease_s=1.0, publish_interval_s=0.1, slice_share=0.0
            )
        )
        lim = TenantLimits(requests_per_s=100.0)  # every decision a script call (no slices)
        c.limits.configure({"t": lim}, 0.0)
        assert await c.member.beat()
        assert isinstance(await c.limits.admit("t", lim, 1, 0.0), Seat)
        server.pause()
        async with asyncio.timeout(2.0):  # bounded: one timeout, not a hang
            got = await c.limits.admit("t", lim, 1, 0.0)
        assert isinstance(got, Seat)
        assert not got.remote
        assert not c.link.up
        assert not await c.member.beat()
        assert c.member.document()["fallback"]["load"] == "local"
        server.resume()
        await beat_until(c.member, lambda: c.link.up)
        assert isinstance(await c.limits.admit("t", lim, 1, 0.0), Seat)
        await c.close()
    finally:
        server.resume()
        server.stop()
