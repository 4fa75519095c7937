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
from gateway.front.files_api import int_query, list_page
from gateway.front.http import read_body

_MAX_CREATE_BODY: Final = 64 * 1024


async def create_batch(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    raw = await read_body(request, _MAX_CREATE_BODY)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise errors.bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise errors.bad_request("request body must be a JSON object", code="invalid_json")
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
    recs, more = await runner.store.list_batches(owner, after=q.get("after"), limit=limit)
    # A running batch's counts are the runner's, newer than the store's last write.
    live = {r.id: r for r in runner.running()}
    return web.json_response(list_page([live.get(r.id, r).document() for r in recs], more))


async def cancel_batch(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    batch_id = request.match_info["batch_id"]
    rec = await runner.cancel(owner, batch_id)
    if rec is None:
        raise batch_not_found(batch_id)
    return web.json_response(rec.document())
