"""The Responses API of the fake engine, shaped as vLLM serves it: `POST /v1/responses` (streamed as
`event: <type>` / `data: <json>` events ending with `response.completed`, no `[DONE]`), `GET
/v1/responses/{id}` and `POST /v1/responses/{id}/cancel`; responses are kept in this engine's memory, so
another engine answers 404 for them."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from loadgen.engine_sim.responses_routes import response_object

_IDS = itertools.count(1)


@dataclass
class FakeResponses:
    model: str = "tiny"
    name: str = "e"  # put into each response id, so a test sees which engine made it
    tokens: int = 4
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    retrieved: list[str] = field(default_factory=list)
    hold: asyncio.Event | None = None  # when set: a streamed answer waits for it after its first token

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._create)
        app.router.add_get("/v1/responses/{rid}", self._retrieve)
        app.router.add_post("/v1/responses/{rid}/cancel", self._cancel)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if body.get("model") != self.model:
            return _error(f"The model `{body.get('model')}` does not exist.", 404)
        prev = body.get("previous_response_id")
        if prev is not None and prev not in self.stored:
            return _error(f"Response with id '{prev}' not found.", 404)
        rid = f"resp_{self.name}{next(_IDS)}"
        n = min(self.tokens, int(body.get("max_output_tokens") or self.tokens))
        pieces = [f" t{i}" for i in range(n)]
        background, stream = bool(body.get("background")), bool(body.get("stream"))
        if background and not stream:
            resp = self._response(rid, body, [], "queued", n)
            self.stored[rid] = resp
            return web.json_response(resp)
        done = self._response(rid, body, pieces, "completed", n)
        if not stream:
            if body.get("store", True):
                self.stored[rid] = done
            return web.json_response(done)
        if background:  # kept while it streams, so that it can be retrieved or cancelled meanwhile
            self.stored[rid] = self._response(rid, body, [], "in_progress", n)
        elif body.get("store", True):
            self.stored[rid] = done
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        seq = itertools.count()
        start = self._response(rid, body, [], "in_progress", n)
        await out.write(_event("response.created", seq, response={**start, "usage": None}))
        await out.write(_event("response.in_progress", seq, response={**start, "usage": None}))
        for i, piece in enumerate(pieces):
            ev = {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []}
            await out.write(_event("response.output_text.delta", seq, **ev))
            if i == 0 and self.hold is not None:
                await self.hold.wait()
        text = "".join(pieces)
        done_ev = {"item_id": "msg_1", "output_index": 0, "content_index": 0, "text": text, "logprobs": []}
        await out.write(_event("response.output_text.done", seq, **done_ev))
        if background and self.stored[rid]["status"] != "cancelled":  # a cancelled one stays so
            self.stored[rid] = done
        await out.write(_event("response.completed", seq, response=done))
        await out.write_eof()
        return out

    def _response(
        self, rid: str, body: dict[str, Any], pieces: list[str], status: str, n: int
    ) -> dict[str, Any]:
        return response_object(
            rid,
            body["model"],
            status,
            "".join(pieces),
            created_at=1700000000,
            usage=(3, len(pieces)) if pieces else None,
            background=bool(body.get("background")),
            previous_response_id=body.get("previous_response_id"),
            max_output_tokens=body.get("max_output_tokens"),
        )

    async def _retrieve(self, request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        self.retrieved.append(rid)
        resp = self.stored.get(rid)
        if resp is None:
            return _error(f"Response with id '{rid}' not found.", 404)
        return web.json_response(resp)

    async def _cancel(self, request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        resp = self.stored.get(rid)
        if resp is None:
            return _error(f"Response with id '{rid}' not found.", 404)
        if not resp["background"]:
            return _error("Cannot cancel a synchronous response.", 400)
        resp["status"] = "cancelled"
        return web.json_response(resp)


def _event(kind: str, seq: itertools.count[int], **fields: Any) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": next(seq), **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _error(message: str, status: int) -> web.Response:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status
    )
