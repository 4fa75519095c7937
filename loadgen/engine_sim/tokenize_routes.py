"""``POST /tokenize`` and ``POST /detokenize`` of a simulated endpoint, in vLLM's shapes (SGLang answers
the same fields), with the simulator's tokenizer (`tokens`): the ids are the ones the engine caches.

- ``/tokenize`` ``{"model", "prompt"}`` or ``{"model", "messages", "add_generation_prompt",
  "continue_final_message"}`` (the chat template `/v1/chat/completions` uses) answers
  ``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` with ``return_token_strs``, else
  null; SGLang sends no ``token_strs``);
- ``/detokenize`` ``{"model", "tokens": [ids]}`` answers ``{"prompt": text}``.

A model the endpoint does not serve is a 404, a malformed body a 400, in the OpenAI error shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from loadgen.engine_sim import tokens
from loadgen.engine_sim.protocol import ApiError, bad_request, chat_flags, chat_prompt_text

_JSON = "application/json"


class TokenizeRoutes:
    def __init__(self, models: Sequence[str], max_model_len: int, *, token_strs: bool) -> None:
        self._models = tuple(models)
        self._max_model_len = max_model_len
        self._token_strs = token_strs  # vLLM's field (SGLang has none)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            data = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            raise bad_request(f"Invalid JSON body: {e}") from None
        if not isinstance(data, dict):
            raise bad_request("the request body must be a JSON object")
        model = data.get("model", self._models[0])
        if model not in self._models:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return data

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            data = await self._body(request)
            if "messages" in data:
                add_gen, cont = chat_flags(data)
                text = chat_prompt_text(
                    data["messages"], add_generation_prompt=add_gen, continue_final_message=cont
                )
            else:
                prompt = data.get("prompt")
                if not isinstance(prompt, str):
                    raise bad_request("'prompt' must be a string", "prompt")
                text = prompt
        except ApiError as e:
            return web.Response(status=e.status, body=e.body(), content_type=_JSON)
        ids = tokens.encode(text).tolist()
        body: dict[str, Any] = {"count": len(ids), "max_model_len": self._max_model_len, "tokens": ids}
        if self._token_strs:
            wanted = data.get("return_token_strs") is True
            body["token_strs"] = [tokens.decode([i]) for i in ids] if wanted else None
        return web.Response(status=200, body=orjson.dumps(body), content_type=_JSON)

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            data = await self._body(request)
            ids = data.get("tokens")
            if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                raise bad_request("'tokens' must be a list of token ids", "tokens")
        except ApiError as e:
            return web.Response(status=e.status, body=e.body(), content_type=_JSON)
        return web.Response(status=200, body=orjson.dumps({"prompt": tokens.decode(ids)}), content_type=_JSON)
