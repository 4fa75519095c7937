"""The one shared aiohttp ClientSession, with bounded per-host pools and engine-call timeouts.

Engine calls set no aiohttp read timer (one made and cancelled per call and again per read) and no
`asyncio.timeout`: their deadlines are watches swept by one timer for all calls
(`gateway.upstream.deadlines`): the wait for the response headers (`first_byte_timeout_s`), then the
silence between the body's reads (a non-streamed body: `first_byte_timeout_s`, as aiohttp's read timer
bounded it; a stream: `read_timeout_s`, the caller's `Deadlines.stall`).
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
from gateway.upstream.deadlines import Deadlines


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
def _call_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    """An engine call's: the connect bound only, no read timer (the call's watches bound the rest)."""
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=None)


async def open_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    request_id: str,
    settings: UpstreamSettings,
    *,
    deadlines: Deadlines,
    auth: Mapping[str, str] | None = None,
) -> aiohttp.ClientResponse:
    """POST `body` to `url` and wait for the response headers; `auth`: the endpoint's credentials
    (gateway.upstream.credentials).

    Raises BerthError: 502 (retryable) when the engine cannot be reached (no connection within
    `connect_timeout_s`, the wait for a free pool slot included) or drops the connection before
    answering, 504 when it sends no headers within `first_byte_timeout_s`. aiohttp sets no read timeout
    on the response: the caller watches its body (`Deadlines.stall`) while it reads.
    """
    headers = {**_JSON_HEADERS, "X-Request-Id": request_id}
    if auth:
        headers.update(auth)
    watch = deadlines.cancel_after(settings.first_byte_timeout_s)
    try:
        return await session.post(
            url, data=body, headers=headers, timeout=_call_timeout(settings.connect_timeout_s)
        )
    except asyncio.CancelledError:
        if watch.timed_out():
            raise _no_response(settings) from None
        raise
    except aiohttp.ConnectionTimeoutError:
        # A TimeoutError too, but the request never reached the engine: no free pool connection or no
        # TCP connection within connect_timeout_s (e.g. a burst of new connections while the loop is busy).
        raise errors.upstream_failed(
            f"no connection to the engine within {settings.connect_timeout_s:g}s"
        ) from None
    except TimeoutError:
        raise _no_response(settings) from None
    except aiohttp.ClientConnectorError as e:
        raise errors.upstream_failed(f"cannot connect to engine: {e.os_error or e}") from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as e:
        raise errors.upstream_failed(f"engine dropped the connection: {e}") from None
    except aiohttp.ClientError as e:
        raise errors.upstream_failed(f"engine request failed: {e}") from None
    finally:
        deadlines.forget(watch)


def _no_response(settings: UpstreamSettings) -> errors.BerthError:
    return errors.upstream_timeout(f"engine sent no response within {settings.first_byte_timeout_s:g}s")
