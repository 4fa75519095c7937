"""One call to an engine's tokenize route: POST the dialect's body, read the count, within a deadline.

The body and the answer's shape are the dialect's (`Dialect.tokenize_body`, `tokenize_count`); this
module only moves bytes. It never raises for what the engine or the network does: the answer says
what happened, and the caller falls back to its estimate. One loop timer bounds the whole call
(connect, headers, body); aiohttp adds none of its own.

Cancellation propagates: the response context closes the connection when the call is cancelled (a
client that went away), and the engine sees it close.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp

from gateway.upstream.dialects import tokenize_count, tokenize_ids


class TokenizeResult(enum.StrEnum):
    """How a count went; the `result` label of `berth_tokenize_requests_total`."""

    OK = "ok"
    TIMEOUT = "timeout"  # no whole answer within the deadline
    ERROR = "error"  # no connection, a dropped one, a non-200, or an answer without a count
    UNSUPPORTED = "unsupported"  # not asked: the engine cannot count this request's prompt
    NO_ENDPOINT = "no_endpoint"  # not asked: no ready endpoint serves the model
    GIVEN = "given"  # not asked: the prompt is token ids (a completions prompt), counted as given


@dataclass(frozen=True, slots=True)
class TokenizeAnswer:
    result: TokenizeResult
    count: int | None = None  # with OK only
    tokens: tuple[int, ...] | None = None  # the token ids, when asked for (`ids=True`) and OK
    status: int | None = None  # the HTTP status, when the engine answered
    detail: str = ""  # why it is not OK, for the debug line


_JSON: Final = "application/json"
# The deadline is the caller's asyncio.timeout: no aiohttp timers on top (the session's default
# sock_read timer would be one more per call).
_NO_TIMERS: Final = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=None, sock_read=None)


async def tokenize(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    request_id: str,
    timeout_s: float,
    *,
    auth: Mapping[str, str] | None = None,
    ids: bool = False,
) -> TokenizeAnswer:
    """POST `body` to `url` (an engine's tokenize route) and read the prompt's token count (and with
    `ids`, its token ids); `auth`: the endpoint's credentials."""
    headers = {"Content-Type": _JSON, "X-Request-Id": request_id}
    if auth:
        headers.update(auth)
    try:
        async with (
            asyncio.timeout(timeout_s),
            session.post(url, data=body, headers=headers, timeout=_NO_TIMERS) as resp,
        ):
            status = resp.status
            raw = await resp.read()  # read even when not 200: the connection stays reusable
    except TimeoutError:
        return TokenizeAnswer(TokenizeResult.TIMEOUT, detail=f"no answer within {timeout_s:g}s")
    except aiohttp.ClientError as e:
        return TokenizeAnswer(TokenizeResult.ERROR, detail=f"engine request failed: {e}")
    if status != 200:
        return TokenizeAnswer(TokenizeResult.ERROR, status=status, detail=f"engine answered {status}")
    try:
        count = tokenize_count(raw)
        tokens = tokenize_ids(raw) if ids else None
    except ValueError as e:
        return TokenizeAnswer(TokenizeResult.ERROR, status=status, detail=str(e))
    return TokenizeAnswer(TokenizeResult.OK, count=count, status=status, tokens=tokens)
