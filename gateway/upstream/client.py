"""Engine calls: generation calls over berth's own HTTP/1.1 client and pool (`gateway.upstream.h1`,
`gateway.upstream.pool`), the scrapers' GETs (health checks, /metrics, /v1/models) over the same client
with a pool of their own (`gateway.upstream.fetch`), everything else (tokenize) over the one shared
aiohttp ClientSession, with bounded per-host pools.

A generation call is what every request costs, so it skips aiohttp's client (a request object, header
multidicts, a payload writer, its Python stream reader: about 60-75 µs of CPU per call at 64
connections): the request is written whole in one write, the response parsed by httptools (C).
Its deadlines set no timer of their own: they are watches swept by one timer for all calls
(`gateway.upstream.deadlines`): the wait for the response headers (`first_byte_timeout_s`), then the
silence between the body's reads (a non-streamed body: `first_byte_timeout_s`; a stream:
`read_timeout_s`, the caller's `Deadlines.stall`).

What aiohttp's client did that this one does not: HTTP proxies (`HTTP_PROXY` and the like were never
read: the session does not trust the environment), redirects (an engine call is never redirected),
cookies and compression (engines are asked for identity encoding).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import aiohttp

from gateway import __version__
from gateway.config.schema import UpstreamConfig
from gateway.core import errors
from gateway.core.clock import Clock
from gateway.upstream.deadlines import Deadlines
from gateway.upstream.fetch import Fetcher
from gateway.upstream.h1 import BadResponse, EngineDropped, H1Response
from gateway.upstream.pool import ConnectTimeout, Origin, Pool, PoolClosed, PoolExhausted
from gateway.upstream.target import url_parts

#: The hint of the warning a shortfall makes (`gateway.app.components.Gateway.check_pool`).
POOL_HINT = (
    "requests beyond the pool wait for a connection and get 503 upstream_pool_exhausted after "
    "upstream.connect_timeout_s although their engine has a free seat: raise the key to at least the seats"
)


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 120.0
    read_timeout_s: float = 120.0
    max_retries: int = 1
    pool_per_host: int = 512
    pool_total: int = 1024

    @classmethod
    def of(cls, cfg: UpstreamConfig) -> UpstreamSettings:
        return cls(
            connect_timeout_s=cfg.connect_timeout_s,
            first_byte_timeout_s=cfg.first_byte_timeout_s,
            read_timeout_s=cfg.read_timeout_s,
            max_retries=cfg.max_retries,
            pool_per_host=cfg.pool_per_host,
            pool_total=cfg.pool_total,
        )


@dataclass(frozen=True, slots=True)
class PoolShortfall:
    """A limit of the engine-call pool below the seats it serves: requests the gateway may have in
    flight at once (over the fleet for `pool_total`, over one engine host's endpoints for `pool_per_host`)."""

    key: str  # "upstream.pool_total" or "upstream.pool_per_host"
    size: int  # the key's value
    seats: int
    host: str = ""  # the engine host (host:port) of a per-host shortfall


def pool_shortfalls(settings: UpstreamSettings, seats: Iterable[tuple[str, int]]) -> list[PoolShortfall]:
    """The pool's limits that the fleet's seats (`seats`: each endpoint's URL and the most requests the
    gateway may run there, its cap's bound) exceed; endpoints behind one origin share its per-host limit."""
    per_origin: dict[Origin, int] = {}
    for url, n in seats:
        origin = url_parts(url).origin
        per_origin[origin] = per_origin.get(origin, 0) + n
    out: list[PoolShortfall] = []
    total = sum(per_origin.values())
    if total > settings.pool_total:
        out.append(PoolShortfall("upstream.pool_total", settings.pool_total, total))
    for (_, host, port), n in sorted(per_origin.items()):
        if n > settings.pool_per_host:
            out.append(PoolShortfall("upstream.pool_per_host", settings.pool_per_host, n, f"{host}:{port}"))
    return out


def make_session(settings: UpstreamSettings) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=settings.pool_total,
        limit_per_host=settings.pool_per_host,
        ttl_dns_cache=60,
        enable_cleanup_closed=False,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
    )
    # auto_decompress off: bodies are relayed as the engine sent them, so engines are asked for identity
    # encoding (aiohttp would otherwise offer gzip and deflate, and a compressing proxy in front of an
    # engine would send bodies the relay cannot read and the client cannot decode). The User-Agent is
    # set rather than skipped: aiohttp rebuilds the request headers to skip one, on every request.
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        headers={"User-Agent": f"berth/{__version__}", "Accept-Encoding": "identity"},
        auto_decompress=False,
        raise_for_status=False,
    )


def pool_counts(session: aiohttp.ClientSession | None, *pools: Pool | None) -> tuple[int, int]:
    """(in use, idle) connections to engines: the pools' (generation calls', scrapes') and the session's
    (tokenize calls and the rest); a call holds one while it runs, idle ones wait for reuse.

    aiohttp exposes no counts: this reads its connector's `_acquired` and `_conns`, and counts nothing
    of the session should a release rename them (tests/integration/test_soak.py pins the reading).
    """
    in_use, idle = 0, 0
    for pool in pools:
        if pool is not None:
            used, free = pool.counts()
            in_use += used
            idle += free
    if session is None or session.closed:
        return in_use, idle
    connector = session.connector
    in_use += len(getattr(connector, "_acquired", ()))
    idle += sum(len(conns) for conns in getattr(connector, "_conns", {}).values())
    return in_use, idle


@dataclass(frozen=True, slots=True)
class _Target:
    """An engine URL split once: its pool origin and the fixed part of a request's head."""

    origin: Origin
    head: str  # request line and the headers every call to this URL sends
    basic: str  # an Authorization header from credentials in the URL ("" without)


@functools.lru_cache(maxsize=1024)
def _target(url: str, method: str = "POST") -> _Target:
    u = url_parts(url)
    path = f"{u.path}?{u.query}" if u.query else u.path
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {u.authority}\r\nUser-Agent: berth/{__version__}\r\n"
        "Accept: */*\r\nAccept-Encoding: identity\r\nContent-Type: application/json\r\n"
    )
    return _Target(u.origin, head, u.basic)


def _request(target: _Target, body: bytes, request_id: str, auth: Mapping[str, str] | None) -> bytes:
    """The whole request: head and body, for one write."""
    extra = target.basic
    if auth:
        extra = "".join(f"{k}: {v}\r\n" for k, v in auth.items())
        if any(_unsafe(k) or _unsafe(v) for k, v in auth.items()):
            raise ValueError("a newline in a request header")
    if _unsafe(request_id):
        raise ValueError("a newline in a request header")
    head = f"{target.head}{extra}X-Request-Id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _unsafe(value: str) -> bool:
    return "\n" in value or "\r" in value


def make_pool(settings: UpstreamSettings, clock: Clock) -> Pool:
    """The engine-call connections (generation calls; scrapes have their own, `make_fetcher`)."""
    return Pool(
        clock=clock,
        per_host=settings.pool_per_host,
        total=settings.pool_total,
        connect_timeout_s=settings.connect_timeout_s,
    )


def make_fetcher(settings: UpstreamSettings, clock: Clock) -> Fetcher:
    """The scrapers' GETs, over a pool of their own with the same limits as the generation calls' (a
    scraper has one request in flight at a time, so the limits only bound a fleet behind one origin)."""
    return Fetcher(
        Pool(
            clock=clock,
            per_host=settings.pool_per_host,
            total=settings.pool_total,
            connect_timeout_s=settings.connect_timeout_s,
        )
    )


async def open_request(
    pool: Pool,
    url: str,
    body: bytes,
    request_id: str,
    settings: UpstreamSettings,
    *,
    deadlines: Deadlines,
    auth: Mapping[str, str] | None = None,
    method: str = "POST",
) -> H1Response:
    """POST `body` to `url` (or another `method`: GET with an empty body) and wait for the response
    headers; `auth`: the endpoint's credentials (gateway.upstream.credentials).

    Raises BerthError: 503 `upstream_pool_exhausted` when no pool slot came free within
    `connect_timeout_s` (the gateway's `pool_total` or `pool_per_host` reached), 502 (retryable) when
    the engine cannot be reached (no connection within the rest of `connect_timeout_s`) or drops the
    connection before answering, 504 when it sends no headers within `first_byte_timeout_s`. Nothing
    times the body: the caller watches it (`Deadlines.stall`) while it reads, and closes the response
    when done.
    """
    target = _target(url, method)
    data = _request(target, body, request_id, auth)
    watch = deadlines.cancel_after(settings.first_byte_timeout_s)
    try:
        conn = pool.take(target.origin)
        while conn is None:
            conn = await pool.connect(target.origin)
            if not conn.usable():  # handed over idle, and closed by the engine before this call went on
                conn = None
        resp = conn.send(data)
        try:
            await resp.head()
        except BaseException:
            resp.close()  # the engine sees the connection drop and aborts the request
            raise
        return resp
    except asyncio.CancelledError:
        if watch.timed_out():
            raise _no_response(settings) from None
        raise
    except PoolExhausted as e:
        # Every connection the pool may open was in use for connect_timeout_s: the gateway's limit
        # (503, not the engine's failure); another endpoint may have room only under a per-host limit.
        raise errors.upstream_pool_exhausted(
            e.limit, e.size, settings.connect_timeout_s, retryable=e.limit == "pool_per_host"
        ) from None
    except ConnectTimeout:
        # The request never reached the engine: no TCP connection within connect_timeout_s (e.g. a
        # burst of new connections while the loop is busy).
        raise errors.upstream_failed(
            f"no connection to the engine within {settings.connect_timeout_s:g}s"
        ) from None
    except EngineDropped as e:
        raise errors.upstream_failed(f"engine dropped the connection: {e}") from None
    except (BadResponse, PoolClosed) as e:
        raise errors.upstream_failed(f"engine request failed: {e}") from None
    except OSError as e:
        raise errors.upstream_failed(f"cannot connect to engine: {e}") from None
    finally:
        deadlines.forget(watch)


def _no_response(settings: UpstreamSettings) -> errors.BerthError:
    return errors.upstream_timeout(f"engine sent no response within {settings.first_byte_timeout_s:g}s")
