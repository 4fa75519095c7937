"""The one shared aiohttp ClientSession, with bounded per-host pools and engine-call timeouts.

Timers are the costly part of a timeout on the hot path (each one a loop timer made and cancelled),
so each engine call gets one: a non-streamed call only aiohttp's read timer, which runs from the moment
the body is sent (so it bounds the wait for the headers too) and is re-armed per read of the answer; a
streamed call one `asyncio.timeout` for its headers and then a `StallTimer` that bounds the silence
between its chunks and is re-armed only when it fires.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from gateway import __version__
from gateway.config.schema import UpstreamConfig
from gateway.core import errors
from gateway.core.clock import Clock


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 120.0
    read_timeout_s: float = 120.0
    max_retries: int = 1
    pool_per_host: int = 256
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


def pool_counts(session: aiohttp.ClientSession | None) -> tuple[int, int]:
    """(in use, idle) connections of the session's pool: engine calls, scrapes and health checks hold a
    connection while they run; idle ones wait for reuse until aiohttp's keep-alive timeout.

    aiohttp exposes no counts: this reads its connector's `_acquired` and `_conns`, and answers (0, 0)
    should a release rename them (tests/integration/test_soak.py pins the reading).
    """
    if session is None or session.closed:
        return 0, 0
    connector = session.connector
    in_use = len(getattr(connector, "_acquired", ()))
    idle = sum(len(conns) for conns in getattr(connector, "_conns", {}).values())
    return in_use, idle


_JSON_HEADERS = {"Content-Type": "application/json"}


@functools.lru_cache(maxsize=8)
def _stream_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    """A streamed engine call's: no sock_read timer (remade per chunk); the caller's StallTimer."""
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=None)


@functools.lru_cache(maxsize=8)
def _body_timeout(connect_s: float, first_byte_s: float) -> aiohttp.ClientTimeout:
    """A non-streamed engine call's: the read timer bounds the wait for the headers, which an engine
    sends only once it has generated the whole answer, and then each gap in the body that follows."""
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=first_byte_s)


async def open_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    request_id: str,
    settings: UpstreamSettings,
    *,
    stream: bool = False,
    auth: Mapping[str, str] | None = None,
) -> aiohttp.ClientResponse:
    """POST `body` to `url` and wait for the response headers; `auth`: the endpoint's credentials
    (gateway.upstream.credentials).

    Raises BerthError: 502 (retryable) when the engine cannot be reached (no connection within
    `connect_timeout_s`, the wait for a free pool slot included) or drops the connection before
    answering, 504 when it sends no headers within `first_byte_timeout_s` (for a non-streamed call that
    bound also applies to each gap in the body). With `stream`, aiohttp sets no read timeout on the
    response: the caller runs a StallTimer while it reads.
    """
    headers = {**_JSON_HEADERS, "X-Request-Id": request_id}
    if auth:
        headers.update(auth)
    try:
        if not stream:
            timeout = _body_timeout(settings.connect_timeout_s, settings.first_byte_timeout_s)
            return await session.post(url, data=body, headers=headers, timeout=timeout)
        async with asyncio.timeout(settings.first_byte_timeout_s):
            return await session.post(
                url, data=body, headers=headers, timeout=_stream_timeout(settings.connect_timeout_s)
            )
    except aiohttp.ConnectionTimeoutError:
        # A TimeoutError too, but the request never reached the engine: no free pool connection or no
        # TCP connection within connect_timeout_s (e.g. a burst of new connections while the loop is busy).
        raise errors.upstream_failed(
            f"no connection to the engine within {settings.connect_timeout_s:g}s"
        ) from None
    except TimeoutError:
        raise errors.upstream_timeout(
            f"engine sent no response within {settings.first_byte_timeout_s:g}s"
        ) from None
    except aiohttp.ClientConnectorError as e:
        raise errors.upstream_failed(f"cannot connect to engine: {e.os_error or e}") from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as e:
        raise errors.upstream_failed(f"engine dropped the connection: {e}") from None
    except aiohttp.ClientError as e:
        raise errors.upstream_failed(f"engine request failed: {e}") from None


class StallTimer:
    """Fails `content` with TimeoutError once the engine sent nothing for `timeout_s`.

    aiohttp's sock_read timeout cancels a loop timer and makes a new one on every read; this is one
    timer per stream. The reader sets `seen = clock.now()` for every chunk it takes; the timer, when it
    fires before `seen + timeout_s`, re-arms for what is left. At the deadline it fails the stream only
    if no byte arrived since its previous firing either (a reader held up by a slow client is no stalled
    engine), and never once the response has ended.
    """

    __slots__ = ("_bytes", "_clock", "_content", "_handle", "_loop", "_timeout_s", "seen")

    def __init__(self, content: aiohttp.StreamReader, timeout_s: float, clock: Clock) -> None:
        self._content = content
        self._timeout_s = timeout_s
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._bytes = content.total_bytes  # received as of the last firing
        self.seen = clock.now()
        self._handle = self._loop.call_later(timeout_s, self._check)

    def _check(self) -> None:
        content = self._content
        if content.is_eof():
            return  # the engine finished; what is left is only waiting to be read
        idle = self._clock.now() - self.seen
        received, self._bytes = self._bytes, content.total_bytes
        if idle < self._timeout_s:
            self._handle = self._loop.call_later(self._timeout_s - idle, self._check)
        elif content.total_bytes != received:
            self._handle = self._loop.call_later(self._timeout_s, self._check)
        else:
            content.set_exception(TimeoutError(f"no data for {self._timeout_s:g}s"))

    def cancel(self) -> None:
        self._handle.cancel()
