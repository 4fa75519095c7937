"""The Redis link of one replica: redis-py's asyncio client with a bounded time per call, and the link's
state (up or down) with one log line and one metric change per transition.

Every call goes through `call`: it gives up after `[cluster] timeout_s` (connection refused, a reset,
a slow or stopped Redis all count the same) and answers None instead of raising, so each shared piece
falls back to its documented local behaviour (docs/cluster.md). The next call that succeeds is the
recovery: nothing needs a restart. The password never reaches a log line (errors are logged by type,
their text scrubbed of it) and the URL is only ever shown without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from gateway.config.cluster import ClusterSetup

log = structlog.get_logger("berth.cluster")

T = TypeVar("T")

#: Characters of a Redis error's text kept in a log line.
ERROR_TEXT: Final = 200


class LinkState(enum.StrEnum):
    CONNECTING = "connecting"  # no call answered yet
    UP = "up"
    DOWN = "down"


class RedisLink:
    """One Redis client for the whole replica, its state and its round-trip figures."""

    def __init__(self, setup: ClusterSetup, *, client: aioredis.Redis | None = None) -> None:
        c = setup.config
        self.setup = setup
        self.timeout_s = c.timeout_s
        password = None if setup.password is None else setup.password.reveal()
        self._password = password
        self.redis: aioredis.Redis = client or aioredis.Redis.from_url(
            c.redis,
            password=password,
            socket_timeout=c.timeout_s,
            socket_connect_timeout=c.connect_timeout_s,
            # One retry at once, on a fresh connection: after a Redis restart every pooled connection is
            # dead, and each would otherwise fail one call (and flap the link's state). Bounded by `call`.
            retry=Retry(NoBackoff(), 1),
            health_check_interval=0,
            client_name=f"berth:{setup.name}",
            max_connections=64,
        )
        self.prefix = c.key_prefix
        self.state = LinkState.CONNECTING
        self.calls = 0
        self.failures = 0
        self.transitions: dict[str, int] = {}  # "up" / "down" -> times the link went there
        self.rtt_s: float | None = None  # the last heartbeat's round trip
        self.changed_at = time.monotonic()
        self.last_error: str | None = None

    def key(self, *parts: str) -> str:
        """A key of this cluster: "{prefix}:part:part"."""
        return ":".join((self.prefix, *parts))

    def script(self, lua: str) -> AsyncScript:
        return self.redis.register_script(lua)

    @property
    def up(self) -> bool:
        return self.state is LinkState.UP

    async def call(self, what: str, fn: Callable[[aioredis.Redis], Awaitable[T]]) -> T | None:
        """`fn(redis)` within the timeout; None when Redis failed or was too slow (the link goes down).

        A cancellation of the calling task always ends it with CancelledError: redis-py may absorb one
        that arrives while it takes a connection and finish the command (then a background loop making
        the call would go on and its shutdown would wait for it forever)."""
        self.calls += 1
        task = asyncio.current_task()
        cancels = 0 if task is None else task.cancelling()
        try:
            async with asyncio.timeout(self.timeout_s):
                out = await fn(self.redis)
        except (RedisError, OSError, TimeoutError) as e:
            self.failures += 1
            self.mark_down(what, e)
            _cancelled_meanwhile(task, cancels)
            return None
        self.mark_up()
        _cancelled_meanwhile(task, cancels)
        return out

    async def timed(self, what: str, fn: Callable[[aioredis.Redis], Awaitable[T]]) -> T | None:
        """`call`, measuring its round trip into `rtt_s`."""
        t0 = time.perf_counter()
        out = await self.call(what, fn)
        if out is not None:
            self.rtt_s = time.perf_counter() - t0
        return out

    def mark_up(self) -> None:
        if self.state is not LinkState.UP:
            was = self.state
            self._go(LinkState.UP)
            log.info("cluster_redis_up", redis=self.setup.safe_url, was=was.value)

    def mark_down(self, what: str, e: BaseException) -> None:
        self.last_error = self._scrub(e)
        if self.state is not LinkState.DOWN:
            self._go(LinkState.DOWN)
            log.warning(
                "cluster_redis_down",
                redis=self.setup.safe_url,
                during=what,
                error=type(e).__name__,
                detail=self.last_error,
                fallback="documented per piece: docs/cluster.md",
            )

    def _go(self, state: LinkState) -> None:
        self.state = state
        self.changed_at = time.monotonic()
        self.transitions[state.value] = self.transitions.get(state.value, 0) + 1

    def _scrub(self, e: BaseException) -> str:
        text = str(e)[:ERROR_TEXT] or type(e).__name__
        if self._password:
            text = text.replace(self._password, "<hidden>")
        return text

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):  # closing a broken connection
            await self.redis.aclose()

    def __repr__(self) -> str:
        return f"RedisLink(redis={self.setup.safe_url!r}, state={self.state.value})"


def _cancelled_meanwhile(task: asyncio.Task[Any] | None, before: int) -> None:
    """Raise the CancelledError of a cancellation requested since `before` (the task's count of
    requests then) that did not reach the caller (`asyncio.timeout` takes back its own requests)."""
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError


def text(v: Any) -> str:
    """A Redis reply as str (replies are bytes: the client does not decode)."""
    if isinstance(v, bytes):
        return v.decode()
    return "" if v is None else str(v)
