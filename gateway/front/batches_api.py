"""The OpenAI Batches API: `POST /v1/batches`, `GET /v1/batches` (cursor `after`, `limit`),
`GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.

A batch belongs to the tenant whose key created it: another tenant gets 404. Creating one validates
its input file at once: the answer is the batch `in_progress`, or `failed` with each problem and its
line in `errors` (as OpenAI's validation reports them).
"""

from __future__ import annotations

from typing import Final

import orjson
from aiohttp import web

from gateway.batch.refusals import batch_not_found
from gateway.batch.runner import BatchRunner
from gateway.core import errors
from gateway.front.batch_lists import forwarded, local_page, merged_list, page_key
from gateway.front.batch_lists import page as list_page
from gateway.front.files_api import int_query
from gateway.front.http import read_body
from gateway.front.services import SERVICES

_MAX_CREATE_BODY: Final = 64 * 1024


async def create_batch(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    raw = await read_body(request, _MAX_CREATE_BODY)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise errors.bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise errors.bad_request("request body must be a JSON object", code="invalid_json")
    peers = request.app[SERVICES].batch_peers
    file_id = body.get("input_file_id")
    if peers is not None and isinstance(file_id, str) and not forwarded(request):
        peer = peers.owner(file_id)
        if peer is not None:  # the batch runs where its input file is: created there
            return await peers.forward(request, peer, file_id, raw)
    rec = await runner.create(
        owner,
        body.get("input_file_id"),
        body.get("endpoint"),
        body.get("completion_window"),
        body.get("metadata"),
        output_expires_after=body.get("output_expires_after"),
    )
    return web.json_response(rec.document())


async def get_batch(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    batch_id = request.match_info["batch_id"]
    rec = await runner.get(owner, batch_id)
    if rec is None:
        raise batch_not_found(batch_id)
    return web.json_response(rec.document())


async def list_batches(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    q = request.query
    limit = int_query(q.get("limit"), default=20, low=1, high=100, name="limit")
    peers = request.app[SERVICES].batch_peers
    if peers is not None:  # cluster mode: every replica's batches, in one order
        if not forwarded(request):
            return await merged_list(request, runner, peers, owner, kind="batches", limit=limit)
        docs, more = await local_page(
            runner, owner, kind="batches", key=page_key(request), limit=limit, ascending=False, purpose=None
        )
        return web.json_response(list_page(docs, more=more))
    recs, more = await runner.store.list_batches(owner, after=q.get("after"), limit=limit)
    # A running batch's counts are the runner's, newer than the store's last write.
    live = {r.id: r for r in runner.running()}
    return web.json_response(list_page([live.get(r.id, r).document() for r in recs], more=more))


async def cancel_batch(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    batch_id = request.match_info["batch_id"]
    rec = await runner.cancel(owner, batch_id)
    if rec is None:
        raise batch_not_found(batch_id)
    return web.json_response(rec.document())
