"""Small GETs to engines over berth's own HTTP/1.1 client: what the scrapers ask (health, /metrics,
/v1/models).

A scrape round is two or three GETs per endpoint every scrape interval, for every endpoint of the fleet:
in front of 100 endpoints, aiohttp's client spent more CPU on them than berth spent on anything else
while idle. `Fetcher.get` writes the request whole in one write and reads the answer with httptools
(`gateway.upstream.h1`), over keep-alive connections of its own pool (`gateway.upstream.pool`), so
scrapes and generation calls never wait for each other's connections: a fleet's scrapes cannot take
the slots of a busy engine's generation calls, and generation calls filling `pool_per_host` cannot
hold back the health checks that keep the engine in the fleet.

A GET whose connection the engine closes (or resets) before answering is sent once more on a new
connection, as aiohttp's client did for idempotent requests: a kept-alive connection that the engine's
keep-alive timeout closed as the request went out is not a failing engine. A drop mid-answer is not
retried. Every failure is an `OSError`: `FetchFailed` (a `ConnectionError`), `ConnectTimeout` (a
`TimeoutError`), or what the connect itself raised. The caller bounds the whole call (`asyncio.timeout`);
a call cut short closes its connection.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from gateway import __version__
from gateway.upstream.h1 import EngineDropped, H1Response, ResponseError
from gateway.upstream.pool import Origin, Pool
from gateway.upstream.target import url_parts


class FetchFailed(ConnectionError):
    """The GET produced no usable answer (the engine dropped it, sent garbage, or a body over the limit)."""


@dataclass(frozen=True, slots=True)
class _Target:
    origin: Origin
    head: str  # the request line and the headers every GET of this URL sends
    basic: str  # an Authorization header from credentials in the URL ("" without)


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> _Target:
    u = url_parts(url)
    target = u.path + (f"?{u.query}" if u.query else "")
    head = f"GET {target} HTTP/1.1\r\nHost: {u.authority}\r\nUser-Agent: berth/{__version__}\r\n"
    return _Target(u.origin, head, u.basic)


def _request(target: _Target, headers: Mapping[str, str]) -> bytes:
    """The whole request. An `Authorization` in `headers` (the endpoint's key) replaces the URL's."""
    extra = target.basic
    if "Authorization" in headers or "authorization" in headers:
        extra = ""
    for k, v in headers.items():
        if _unsafe(k) or _unsafe(v):
            raise FetchFailed("a newline in a request header")
        extra += f"{k}: {v}\r\n"
    return f"{target.head}{extra}\r\n".encode()


def _unsafe(value: str) -> bool:
    return "\n" in value or "\r" in value


class Fetcher:
    """GETs over a pool of their own (see the module docstring for why not the generation calls')."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @property
    def pool(self) -> Pool:
        return self._pool

    async def get(self, url: str, headers: Mapping[str, str], limit: int) -> tuple[int, bytes]:
        """GET `url` with `headers` (besides Host and User-Agent); (status, body). A body of more than
        `limit` bytes is a failure. Raises OSError (see the module docstring), FetchFailed for a URL
        that is not http(s) too (aiohttp's InvalidURL failed a health check the same way)."""
        try:
            target = _target(url)
        except ValueError as e:
            raise FetchFailed(str(e)) from None
        data = _request(target, headers)
        pool = self._pool
        conn = pool.take(target.origin)
        retried = False
        while True:
            while conn is None:
                conn = await pool.connect(target.origin)
                if not conn.usable():  # handed over idle, and closed by the engine meanwhile
                    conn = None
            resp = conn.send(data)
            try:
                return await _answer(resp, limit)
            except EngineDropped:
                if retried or resp.status:
                    raise FetchFailed(_dropped(resp)) from None
                conn, retried = None, True  # dropped before answering: once more on a new connection
            except ResponseError as e:
                raise FetchFailed(str(e)) from None
            finally:
                resp.close()  # a no-op once the answer was read whole (the connection went back)


def _dropped(resp: H1Response) -> str:
    return "engine closed the connection mid-answer" if resp.status else "engine closed the connection"


async def _answer(resp: H1Response, limit: int) -> tuple[int, bytes]:
    await resp.head()
    parts: list[bytes] = []
    size = 0
    async for chunk in resp:
        size += len(chunk)
        if size > limit:
            raise FetchFailed(f"body exceeds {limit} bytes")
        parts.append(chunk)
    return resp.status, parts[0] if len(parts) == 1 else b"".join(parts)
