"""`GET /v1/files` and `GET /v1/batches` in cluster mode: one list merged from every replica that is up.

The merged order is (created_at, id), newest first for batches (and for files unless `order=asc`): each
replica answers a page of its own store in that order (`BatchStore.page_*`), starting past the cursor's
key, and the replica the client reached merges them and keeps `limit`. The client's cursor `after` is an
id, as OpenAI's: its key (created_at, id) is read from the replica that holds it, then sent to the
others in `x-berth-page-key`. One list costs one round trip to each other replica that is up (two when
the cursor is another replica's).

A replica that is down (or does not answer within `ANSWER_TIMEOUT_S`) is left out of the list, not an
error: the list is then short of its files and batches, and the response says which replicas it lacks in
`x-berth-replicas-missing`.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Mapping, Sequence
from typing import Any, Final

import aiohttp
import orjson
import structlog
from aiohttp import web
from multidict import MultiDict

from gateway.batch.runner import BatchRunner
from gateway.batch.store import PageKey
from gateway.core import errors
from gateway.front.batch_peers import ANSWER_TIMEOUT_S, FORWARDED_BY, BatchPeers, Peer, replica_unavailable

log = structlog.get_logger("berth.batch")

#: The key a page starts past ("CREATED_AT ID"), sent with a page asked of another replica.
PAGE_KEY: Final = "x-berth-page-key"
MISSING: Final = "x-berth-replicas-missing"

Doc = Mapping[str, Any]


def page_key(request: web.Request) -> PageKey | None:
    """The key a page asked by another replica starts past (None: from the first)."""
    raw = request.headers.get(PAGE_KEY)
    if not raw:
        return None
    created, _, ident = raw.partition(" ")
    if not created.lstrip("-").isdigit() or not ident:
        raise errors.bad_request(f"{PAGE_KEY} must be 'CREATED_AT ID'")
    return int(created), ident


def forwarded(request: web.Request) -> bool:
    return FORWARDED_BY in request.headers


def merge(pages: Sequence[Sequence[Doc]], limit: int, *, ascending: bool) -> tuple[list[Doc], bool]:
    """Pages each in (created_at, id) order merged into one list of at most `limit`; whether more follow
    in the pages given."""

    def key(d: Doc) -> tuple[int, str]:
        return int(d["created_at"]), str(d["id"])

    merged = list(heapq.merge(*pages, key=key, reverse=not ascending))
    return merged[:limit], len(merged) > limit


async def merged_list(
    request: web.Request,
    runner: BatchRunner,
    peers: BatchPeers,
    owner: str,
    *,
    kind: str,
    limit: int,
    ascending: bool = False,
    purpose: str | None = None,
) -> web.StreamResponse:
    """A list page (`kind` "files" or "batches") merged from every replica that is up (module doc)."""
    after = request.query.get("after")
    key: PageKey | None = None
    if after:
        key = await _key_of(request, runner, peers, owner, (kind, after))
        if key is None:  # a cursor the tenant cannot see: an empty page, as one replica answers it
            return web.json_response(page([], more=False))
    up, missing = peers.peers()
    local = local_page(runner, owner, kind=kind, key=key, limit=limit, ascending=ascending, purpose=purpose)
    asked = [_remote_page(request, peers, p, key) for p in up]
    mine, *theirs = await asyncio.gather(local, *asked)
    assert mine is not None
    pages: list[Sequence[Doc]] = [mine[0]]
    more = mine[1]
    for p, answer in zip(up, theirs, strict=True):
        if answer is None:
            missing.append(p.name)
            continue
        pages.append(answer[0])
        more = more or answer[1]
    data, cut = merge(pages, limit, ascending=ascending)
    resp = web.json_response(page(data, more=more or cut))
    if missing:
        resp.headers[MISSING] = ",".join(sorted(missing))
    return resp


async def local_page(
    runner: BatchRunner,
    owner: str,
    *,
    kind: str,
    key: PageKey | None,
    limit: int,
    ascending: bool,
    purpose: str | None,
) -> tuple[list[Doc], bool]:
    """This replica's page in the merged order: `limit` documents past `key`, and whether more follow."""
    if kind == "files":
        files, more = await runner.store.page_files(
            owner, purpose=purpose, key=key, limit=limit, ascending=ascending
        )
        return [f.document() for f in files], more
    recs, more = await runner.store.page_batches(owner, key=key, limit=limit)
    live = {r.id: r for r in runner.running()}  # a running batch's counts are newer than the store's
    return [live.get(r.id, r).document() for r in recs], more


def page(data: Sequence[Doc], *, more: bool) -> dict[str, object]:
    return {
        "object": "list",
        "data": list(data),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


async def _key_of(
    request: web.Request, runner: BatchRunner, peers: BatchPeers, owner: str, cursor: tuple[str, str]
) -> PageKey | None:
    """The key of the cursor (`kind`, id), from the replica that holds it (None: not there for this
    tenant)."""
    kind, object_id = cursor
    peer = peers.owner(object_id)
    if peer is None:
        rec = (
            await runner.store.get_file(owner, object_id)
            if kind == "files"
            else await runner.store.get_batch(owner, object_id)
        )
        return None if rec is None else (rec.created_at, rec.id)
    doc = await _get(request, peers, peer, f"/v1/{kind}/{object_id}", None)
    if doc is None:
        raise replica_unavailable(object_id, peer.name, "does not answer")
    status, body = doc
    if status == 404:
        return None
    if status != 200:
        raise replica_unavailable(object_id, peer.name, f"answered {status}")
    return int(body["created_at"]), str(body["id"])


async def _remote_page(
    request: web.Request, peers: BatchPeers, peer: Peer, key: PageKey | None
) -> tuple[list[Doc], bool] | None:
    got = await _get(request, peers, peer, request.path, key, query=request.query)
    if got is None:
        return None
    status, body = got
    if status != 200:
        log.warning("batch_list_peer_refused", replica=peer.name, status=status)
        return None
    return list(body["data"]), bool(body["has_more"])


async def _get(
    request: web.Request,
    peers: BatchPeers,
    peer: Peer,
    path: str,
    key: PageKey | None,
    *,
    query: Mapping[str, str] | None = None,
) -> tuple[int, Any] | None:
    """GET `path` of `peer` with the caller's key: its status and JSON body (None: it did not answer)."""
    headers = peers.headers(request)
    if key is not None:
        headers[PAGE_KEY] = f"{key[0]} {key[1]}"
    params = MultiDict((k, v) for k, v in (query or {}).items() if k != "after")
    try:
        async with (
            asyncio.timeout(ANSWER_TIMEOUT_S),
            peers.session().get(peer.url + path, params=params, headers=headers) as resp,
        ):
            return resp.status, orjson.loads(await resp.read())
    except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError, KeyError) as e:
        log.warning("batch_peer_failed", replica=peer.name, path=path, error=type(e).__name__)
        return None
