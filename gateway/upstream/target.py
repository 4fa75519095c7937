"""An engine URL split once for berth's own HTTP/1.1 client: the pool origin, the request target and
the Host header, and basic auth from credentials in the URL (sent as aiohttp sent them). Generation
calls (`gateway.upstream.client`) and the scrapers' GETs (`gateway.upstream.fetch`) build their
requests' fixed heads from it."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from gateway.upstream.pool import Origin


@dataclass(frozen=True, slots=True)
class UrlParts:
    origin: Origin
    path: str  # "/" when the URL has none
    query: str  # "" without
    authority: str  # the Host header: host[:port], without credentials
    basic: str  # an Authorization header line from credentials in the URL ("" without)


@functools.lru_cache(maxsize=4096)
def url_parts(url: str) -> UrlParts:
    """`url` split; ValueError for a URL that is not http(s) with a host."""
    parts = urlsplit(url)
    scheme = parts.scheme
    host = parts.hostname
    if scheme not in ("http", "https") or not host:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if scheme == "https" else 80)
    basic = ""
    if parts.username is not None:  # as aiohttp did: credentials in the URL are sent as basic auth
        user = unquote(parts.username)
        token = base64.b64encode(f"{user}:{unquote(parts.password or '')}".encode()).decode()
        basic = f"Authorization: Basic {token}\r\n"
    return UrlParts(
        (scheme, host, port), parts.path or "/", parts.query, parts.netloc.rpartition("@")[2], basic
    )
