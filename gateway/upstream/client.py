"""The one shared aiohttp ClientSession, with bounded per-host pools and engine-call timeouts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from gateway.core import errors


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 120.0
    read_timeout_s: float = 120.0
    max_retries: int = 1
    pool_per_host: int = 256
    pool_total: int = 1024


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
    # auto_decompress off: bodies are relayed as the engine sent them.
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        raise_for_status=False,
    )


_JSON_HEADERS = {"Content-Type": "application/json"}


async def open_request(
    session: aiohttp.ClientSession, url: str, body: bytes, request_id: str, settings: UpstreamSettings
) -> aiohttp.ClientResponse:
    """POST `body` to `url` and wait for the response headers.

    Raises BerthError: 502 (retryable) when the engine cannot be reached or drops the connection before
    answering, 504 when it sends no headers within `first_byte_timeout_s`.
    """
    headers = {**_JSON_HEADERS, "X-Request-Id": request_id}
    try:
        async with asyncio.timeout(settings.first_byte_timeout_s):
            return await session.post(url, data=body, headers=headers)
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
