"""RedisLink.call: a cancellation of the calling task always ends the call with CancelledError, even one
that the Redis client absorbed (redis-py may, while it takes a connection, and then finish the command)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.cluster.link import RedisLink
from gateway.config.cluster import ClusterConfig, ClusterSetup


def link() -> RedisLink:
    cfg = ClusterConfig(redis="redis://127.0.0.1:1/0", name="a", timeout_s=5.0)
    return RedisLink(ClusterSetup(config=cfg, name="a", password=None))  # no connection is made


async def test_a_cancellation_the_client_absorbed_still_ends_the_call() -> None:
    started = asyncio.Event()

    async def absorbing(r: aioredis.Redis) -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return 1  # the command finished after all
        return 0

    task = asyncio.ensure_future(link().call("probe", absorbing))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_its_own_timeout_is_a_failure_not_a_cancellation() -> None:
    lk = link()
    lk.timeout_s = 0.01

    async def slow(r: aioredis.Redis) -> int:
        await asyncio.Event().wait()
        return 0

    assert await lk.call("probe", slow) is None
    assert not lk.up
