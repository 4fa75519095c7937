"""The OpenAI Files API (the files of batches): `POST /v1/files` (multipart: `file`, `purpose=batch`,
optional `expires_after[anchor]=created_at` and `expires_after[seconds]`), `GET /v1/files`,
`GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`.

An upload is streamed to disk as it arrives (at most `[batch] max_file_bytes`, 413 past it), never held
in memory. A file belongs to the tenant whose key uploaded it: another tenant gets 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import structlog
from aiohttp import BodyPartReader, web

from gateway.admission.tenancy import ANONYMOUS
from gateway.batch.files import FileTooLarge
from gateway.batch.model import PURPOSE_BATCH, FileRecord, new_id
from gateway.batch.refusals import check_expires_after, file_not_found
from gateway.batch.runner import BatchRunner
from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.front.auth import WWW_AUTHENTICATE, authenticate
from gateway.front.batch_lists import forwarded, local_page, merged_list, page_key
from gateway.front.batch_lists import page as list_page
from gateway.front.http import error_response, request_id
from gateway.front.services import SERVICES

log = structlog.get_logger("berth.batch")

_FORM_FIELD_LIMIT: Final = 4096
_READ: Final = 256 * 1024

BatchHandler = Callable[[web.Request, BatchRunner, str], Awaitable[web.StreamResponse]]


def batch_route(handler: BatchHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A Files/Batches route: the tenant of the key (401 when [auth] requires one), the runner, and
    errors in the OpenAI shape."""

    async def route(request: web.Request) -> web.StreamResponse:
        s = request.app[SERVICES]
        try:
            runner = s.batch
            if runner is None:
                raise errors.not_found(request.path)
            tenant = authenticate(s.settings, request.headers)
            await runner.ensure_open()
            owner = ANONYMOUS if tenant is None else tenant.name
            object_id = request.match_info.get("batch_id") or request.match_info.get("file_id")
            if s.batch_peers is not None and object_id and not forwarded(request):
                peer = s.batch_peers.owner(object_id)
                if peer is not None:  # held by another replica: its answer, unchanged
                    body = await request.read() if request.can_read_body else None
                    return await s.batch_peers.forward(request, peer, object_id, body)
            return await handler(request, runner, owner)
        except BerthError as e:
            resp = error_response(e, request_id(request))
            if e.status == 401:
                resp.headers.update(WWW_AUTHENTICATE)
            return resp
        except Exception:
            log.exception("batch_route_failed", path=request.path, method=request.method)
            return error_response(errors.internal(), request_id(request))

    return route


async def create_file(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    if not request.content_type.startswith("multipart/"):
        raise errors.bad_request("upload a file as multipart/form-data (fields 'file' and 'purpose')")
    reader = await request.multipart()
    fields: dict[str, str] = {}
    upload = None
    filename = ""
    file_id = new_id("file-", runner.settings.id_tag)
    try:
        while True:
            part = await reader.next()
            if part is None:
                break
            if not isinstance(part, BodyPartReader):
                raise errors.bad_request("nested multipart bodies are not accepted")
            name = part.name or ""
            if name == "file":
                if upload is not None:
                    raise errors.bad_request("only one 'file' may be uploaded at a time", param="file")
                filename = part.filename or "upload.jsonl"
                runner.files.ensure()
                upload = runner.files.upload(file_id, runner.settings.max_file_bytes)
                while chunk := await part.read_chunk(_READ):
                    await upload.write(chunk)
            else:
                value = await part.read(decode=True)
                if len(value) > _FORM_FIELD_LIMIT:
                    raise errors.bad_request(f"form field {name[:40]!r} is too long", param=name[:40])
                fields[name] = value.decode("utf-8", "replace")
        if upload is None:
            raise errors.bad_request("'file' is required", param="file")
        purpose = fields.get("purpose")
        if purpose != PURPOSE_BATCH:
            raise errors.bad_request(
                f"'purpose' must be 'batch' (the only purpose berth stores), got {str(purpose)[:40]!r}",
                param="purpose",
            )
        if not filename.endswith(".jsonl"):
            raise errors.bad_request("a batch file must be a .jsonl file", param="file")
        expiry_s = _expiry(fields, runner.settings.file_expiry_s)
        await upload.commit()
    except FileTooLarge as e:
        if upload is not None:
            await upload.abort()
        raise errors.BerthError(
            status=413,
            message=f"the file exceeds the limit of {e.limit} bytes ([batch] max_file_bytes)",
            type="invalid_request_error",
            code="file_too_large",
            outcome="too_large",
            source=errors.ErrorSource.CLIENT,
            param="file",
        ) from None
    except OSError as e:  # a full disk, most often
        if upload is not None:
            await upload.abort()
        raise storage_failed(e) from None
    except BaseException:
        if upload is not None:
            await upload.abort()
        raise
    now = int(runner.wall())
    rec = FileRecord(
        id=file_id,
        owner=owner,
        purpose=PURPOSE_BATCH,
        filename=filename,
        bytes=upload.size,
        created_at=now,
        expires_at=now + expiry_s,
    )
    try:
        await runner.store.add_file(rec)
    except BaseException:
        await runner.files.remove(file_id)
        raise
    return web.json_response(rec.document())


def storage_failed(e: OSError) -> BerthError:
    return BerthError(
        status=507,
        message=f"the gateway could not store the file: {e.strerror or e}",
        type="server_error",
        code="insufficient_storage",
        outcome="internal_error",
        source=errors.ErrorSource.INTERNAL,
    )


def _expiry(fields: dict[str, str], default_s: int) -> int:
    anchor = fields.get("expires_after[anchor]")
    seconds = fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return default_s
    n = int(seconds) if seconds is not None and seconds.isdigit() else -1
    checked = check_expires_after({"anchor": anchor, "seconds": n}, "expires_after")
    assert checked is not None
    return checked


async def list_files(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    q = request.query
    limit = int_query(q.get("limit"), default=10000, low=1, high=10000, name="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise errors.bad_request("'order' must be 'asc' or 'desc'", param="order")
    peers = request.app[SERVICES].batch_peers
    if peers is not None:  # cluster mode: every replica's files, in one order
        if not forwarded(request):
            return await merged_list(
                request,
                runner,
                peers,
                owner,
                kind="files",
                limit=limit,
                ascending=order == "asc",
                purpose=q.get("purpose"),
            )
        docs, more = await local_page(
            runner,
            owner,
            kind="files",
            key=page_key(request),
            limit=limit,
            ascending=order == "asc",
            purpose=q.get("purpose"),
        )
        return web.json_response(list_page(docs, more=more))
    files, more = await runner.store.list_files(
        owner, purpose=q.get("purpose"), after=q.get("after"), limit=limit, ascending=order == "asc"
    )
    return web.json_response(list_page([f.document() for f in files], more=more))


async def get_file(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    f = await _owned(request, runner, owner)
    return web.json_response(f.document())


async def file_content(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    f = await _owned(request, runner, owner)
    path = runner.files.path(f.id)
    if not path.is_file():
        raise file_not_found(f.id)
    return web.FileResponse(path, headers={"Content-Type": "application/jsonl"})


async def delete_file(request: web.Request, runner: BatchRunner, owner: str) -> web.StreamResponse:
    file_id = request.match_info["file_id"]
    for rec in runner.running():
        if rec.input_file_id == file_id and rec.owner == owner:
            raise errors.bad_request(
                f"file {file_id} is the input of batch {rec.id}, which is still running: cancel it first",
                param="file_id",
                code="file_in_use",
            )
    f = await runner.store.delete_file(owner, file_id)
    if f is None:
        raise file_not_found(file_id)
    await runner.files.remove(f.id)
    return web.json_response({"id": f.id, "object": "file", "deleted": True})


async def _owned(request: web.Request, runner: BatchRunner, owner: str) -> FileRecord:
    file_id = request.match_info["file_id"]
    f = await runner.store.get_file(owner, file_id)
    if f is None:
        raise file_not_found(file_id)
    return f


def int_query(raw: str | None, *, default: int, low: int, high: int, name: str) -> int:
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = low - 1
    if not low <= n <= high:
        raise errors.bad_request(f"'{name}' must be an integer from {low} to {high}", param=name)
    return n
