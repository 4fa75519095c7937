"""HTTP helpers of the front: request ids, body reading with a limit, OpenAI-shaped error responses."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import hdrs, web

from gateway.core import errors
from gateway.core.errors import BerthError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MAX_ID_LEN = 128
#: Made ids are a random prefix drawn once per process and a counter: as unique as 12 random bytes per
#: request (which cost a getrandom syscall each, 2 % of a request's CPU), and as unguessable across
#: processes; within one they count up, which is all an id is for (matching a log line to a response).
_ID_PREFIX: Final = os.urandom(6).hex()
_id_counter = itertools.count()


def request_id(request: web.Request) -> str:
    """Honour a sane client `x-request-id`, else make one (24 hex digits)."""
    rid = request.headers.get(hdrs.X_REQUEST_ID)  # an istr: the lookup need not fold its case again
    if rid and len(rid) <= _MAX_ID_LEN and rid.isascii() and rid.isprintable():
        return rid
    return f"{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFFFFFF:012x}"


#: Media types that say only "some bytes": what HTTP libraries send for a body given as bytes without
#: a type (aiohttp's `data=b"..."`). Taken as JSON, like no Content-Type at all (`requests` with
#: `data=` sends none): berth accepted both before it checked, and they claim no other format.
UNDECLARED_MEDIA_TYPES: Final = frozenset({"", "application/octet-stream"})


# Cached: clients send a handful of distinct values, and each request's is checked (bounded: the values
# are the client's to choose).
@functools.lru_cache(maxsize=64)
def is_json_media_type(content_type: str | None) -> bool:
    """The `Content-Type` of a request body berth reads as JSON: `application/json` or
    `application/*+json` with any parameters (charset), in any case (the check vLLM's FastAPI makes),
    or none declared (`UNDECLARED_MEDIA_TYPES`). Form-encoded bodies (curl's `-d` without `-H`),
    `text/plain` and every other type are refused."""
    media = (content_type or "").partition(";")[0].strip().lower()
    if media in UNDECLARED_MEDIA_TYPES:
        return True
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole JSON body: 415 unless the Content-Type says JSON (`is_json_media_type`), 413 as soon
    as it is known to exceed `limit` bytes."""
    content_type = request.headers.get(hdrs.CONTENT_TYPE)
    if not is_json_media_type(content_type):
        raise errors.unsupported_media_type(content_type or "")
    declared = request.content_length
    if declared is not None and declared > limit:
        raise errors.body_too_large(limit)
    content = request.content
    chunks: list[bytes] = []
    size = 0
    try:
        if content.is_eof():
            # The whole body came with the headers (a small body, as most are): taken as it lies,
            # without a read that would only find it there.
            body = content.read_nowait()
            if len(body) > limit:
                raise errors.body_too_large(limit)
            return body
        while True:
            chunk = await content.readany()
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise errors.body_too_large(limit)
            chunks.append(chunk)
            if content.at_eof():
                break  # the whole body was buffered: no second read to learn that it ended
    except web.RequestPayloadError:
        # The body does not decode as its Content-Encoding says, or its chunked framing is broken: the
        # connection's parser has stopped, so the connection closes once the 400 is sent, and the body
        # counts as read (aiohttp would otherwise drain it after the answer, meet the same error again
        # and log it as an unhandled exception).
        content.feed_eof()
        request.protocol.close()
        raise errors.bad_request(
            "request body could not be read (it does not decode as its Content-Encoding says, "
            "or its chunked framing is broken)"
        ) from None
    return b"".join(chunks)


def error_response(err: BerthError, rid: str | None = None) -> web.Response:
    headers = err.headers()
    if rid:
        headers["X-Request-Id"] = rid
    return web.Response(
        status=err.status, body=err.json_bytes(), content_type="application/json", headers=headers
    )


async def not_found(request: web.Request) -> web.Response:
    return error_response(errors.not_found(request.path), request_id(request))


def method_not_allowed(allowed: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        err = errors.method_not_allowed(request.method, request.path, allowed)
        resp = error_response(err, request_id(request))
        resp.headers["Allow"] = allowed
        return resp

    return handler
