"""Keep-alive connections to engines for generation calls (`gateway.upstream.h1`), per origin.

Per origin (scheme, host, port) the idle connections are kept last in, first out (the most recently
used is the least likely to have been closed by the server). At most `per_host` connections per
origin and `total` overall are open (connecting, in use or idle); a call that finds none idle and no
room waits for one in arrival order, and that wait and the TCP (and TLS) connect together are
bounded by `connect_timeout_s` (`ConnectTimeout`). When the total is reached by idle connections of
other origins, the oldest of those is closed to make room.

A connection comes back only when its response was received whole and the server keeps it alive.
An idle connection the server closes is dropped at once (its `connection_lost`), one idle longer
than `keepalive_s` when it is next taken: uvicorn (vLLM, SGLang) closes idle connections after 5 s,
so a connection idle about that long may be closed under a request just written to it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Final

from gateway.core.clock import Clock
from gateway.upstream.h1 import EngineDropped, H1Connection

#: Idle connections older than this are not reused (a little under uvicorn's 5 s keep-alive timeout).
KEEPALIVE_S: Final = 4.0

Origin = tuple[str, str, int]  # scheme, host, port


class ConnectTimeout(TimeoutError):
    """No connection (a free slot, then the connect itself) within the connect timeout."""


class PoolExhausted(ConnectTimeout):
    """No free slot within the connect timeout: the pool's limits (`limit`: "pool_total" or
    "pool_per_host", `size` its value) held the call back, not the engine."""

    def __init__(self, message: str, *, limit: str, size: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.size = size


class PoolClosed(ConnectionError):
    """The pool was closed (the gateway is shutting down)."""


class Pool:
    def __init__(
        self,
        *,
        clock: Clock,
        per_host: int,
        total: int,
        connect_timeout_s: float,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self._clock = clock
        self._per_host = per_host
        self._total_limit = total
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._idle: dict[Origin, list[H1Connection]] = {}
        self._n_idle = 0
        self._open: dict[Origin, int] = {}  # slots per origin: connecting, in use and idle
        self._total = 0
        self._conns: set[H1Connection] = set()  # every connection made and not yet lost
        self._waiters: deque[tuple[Origin, asyncio.Future[H1Connection | None]]] = deque()
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    def counts(self) -> tuple[int, int]:
        """(in use, idle) connections."""
        return len(self._conns) - self._n_idle, self._n_idle

    def take(self, origin: Origin) -> H1Connection | None:
        """An idle connection to `origin` fit for a request, or None (then `connect`)."""
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = self._clock.now()
        while idle:
            conn = idle.pop()
            self._n_idle -= 1
            if conn.usable() and now - conn.idle_since < self._keepalive_s:
                return conn
            conn.close()  # stale: its slot is freed when it is lost
        return None

    async def connect(self, origin: Origin) -> H1Connection:
        """A connection to `origin`: an idle one handed over while waiting, or a new one.

        Raises PoolExhausted (no free slot within the connect timeout), ConnectTimeout (the connect
        itself took the rest of it), OSError (the connect failed), EngineDropped (the server closed it
        at once) or PoolClosed."""
        slotted = False
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                conn = await self._slot(origin)
                slotted = True
                if conn is not None:
                    return conn
                try:
                    return await self._dial(origin)
                except BaseException:
                    self._free(origin)
                    raise
        except TimeoutError:
            if not slotted:
                raise self._exhausted(origin) from None
            raise ConnectTimeout(f"no connection within {self._connect_timeout_s:g}s") from None

    def _exhausted(self, origin: Origin) -> PoolExhausted:
        """What held a call that waited the whole connect timeout for a slot: the total when it is
        reached (no other origin has room either), else its origin's limit."""
        if self._total >= self._total_limit:
            limit, size = "pool_total", self._total_limit
        else:
            limit, size = "pool_per_host", self._per_host
        return PoolExhausted(
            f"no free connection within {self._connect_timeout_s:g}s ({size} open: upstream.{limit})",
            limit=limit,
            size=size,
        )

    def released(self, conn: H1Connection) -> None:
        """`conn`'s response was received whole and it stays open: to a waiter for its origin, else idle."""
        if self._closed:
            conn.close()
            return
        for i, (origin, fut) in enumerate(self._waiters):
            if origin == conn.key and not fut.done():
                del self._waiters[i]
                fut.set_result(conn)
                return
        if self._starved():  # others wait for room: this connection's slot goes to them when it closes
            conn.close()
            return
        conn.idle_since = self._clock.now()
        self._idle.setdefault(conn.key, []).append(conn)
        self._n_idle += 1

    def lost(self, conn: H1Connection) -> None:
        """`conn` closed (idle, in use, or stale)."""
        if conn not in self._conns:
            return  # closed before `_dial` counted it: `connect` freed its slot
        self._conns.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
            self._n_idle -= 1
        self._free(conn.key)

    def close(self) -> None:
        """Close every connection and fail every waiter (shutdown)."""
        self._closed = True
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(PoolClosed("the gateway is shutting down"))
        for conn in list(self._conns):
            conn.close()

    # -- slots

    async def _slot(self, origin: Origin) -> H1Connection | None:
        """A reserved slot to dial with (None), or an idle connection handed over by `released`."""
        if self._closed:
            raise PoolClosed("the gateway is shutting down")
        if self._may_open(origin):
            self._reserve(origin)
            return None
        if self._total >= self._total_limit and self._open.get(origin, 0) < self._per_host:
            self._evict_idle()  # the total is taken, partly by idle connections elsewhere
        fut: asyncio.Future[H1Connection | None] = asyncio.get_running_loop().create_future()
        waiter = (origin, fut)
        self._waiters.append(waiter)
        try:
            return await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                got = fut.result()  # granted, but the caller gave up first: give it back
                if got is None:
                    self._free(origin)
                else:
                    self.released(got)
            elif waiter in self._waiters:  # cancelled (a timeout, a leaving client) while waiting
                self._waiters.remove(waiter)
            raise

    def _may_open(self, origin: Origin) -> bool:
        return self._total < self._total_limit and self._open.get(origin, 0) < self._per_host

    def _reserve(self, origin: Origin) -> None:
        self._open[origin] = self._open.get(origin, 0) + 1
        self._total += 1

    def _free(self, origin: Origin) -> None:
        n = self._open[origin] - 1
        if n:
            self._open[origin] = n
        else:
            del self._open[origin]
        self._total -= 1
        self._serve_waiters()

    def _serve_waiters(self) -> None:
        """Give free slots to waiters in arrival order (skipping those whose origin is at its limit)."""
        for waiter in list(self._waiters):
            origin, fut = waiter
            if fut.done():
                self._waiters.remove(waiter)
            elif self._may_open(origin):
                self._waiters.remove(waiter)
                self._reserve(origin)
                fut.set_result(None)
        if self._starved():
            self._evict_idle()

    def _starved(self) -> bool:
        """Whether a waiter is held back by the total alone (not by its origin's limit)."""
        if self._total < self._total_limit:
            return False
        return any(self._open.get(o, 0) < self._per_host for o, f in self._waiters if not f.done())

    def _evict_idle(self) -> None:
        """Close the oldest idle connection (of any origin) to make room under the total."""
        oldest: H1Connection | None = None
        for conns in self._idle.values():
            if conns and (oldest is None or conns[0].idle_since < oldest.idle_since):
                oldest = conns[0]
        if oldest is not None:
            self._idle[oldest.key].remove(oldest)
            self._n_idle -= 1
            oldest.close()

    async def _dial(self, origin: Origin) -> H1Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        _, conn = await loop.create_connection(
            lambda: H1Connection(self, origin, loop),
            host,
            port,
            ssl=tls,
            server_hostname=host if tls is not None else None,
        )
        if conn.closed:  # closed by the server before this call went on
            raise EngineDropped("engine closed the connection at once")
        self._conns.add(conn)
        return conn
