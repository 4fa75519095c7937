"""How the runner reaches an engine: the `LineRunner` protocol (the front implements it with the same
admission, scheduler and dispatch as any request), and the documents of the output and error files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from gateway.batch.model import InputLine, LineResult, new_id
from gateway.batch.validate import BodyCheck

EXPIRED_MESSAGE: Final = "This request could not be executed before the completion window expired."


@dataclass(frozen=True, slots=True)
class LineRequest:
    owner: str  # the tenant that created the batch: its key's limits, classes and quotas apply
    endpoint: str  # /v1/chat/completions, /v1/completions or /v1/embeddings
    body: bytes  # the line's `body`, JSON
    window_end: float  # unix seconds: the request's deadline (earlier batches go first)
    request_id: str


@dataclass(frozen=True, slots=True)
class LineAnswer:
    status: int
    body: bytes  # JSON: the engine's answer, or an OpenAI error
    # The gateway had no room for the line now (a full queue, a tenant's limit, no ready endpoint, a
    # drain): not an answer; the runner tries again after this many seconds.
    retry_after_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class LineRunner(Protocol):
    def checker(self) -> BodyCheck:
        """A check of line bodies against what berth serves now (usable off the event loop)."""

    def accepting(self) -> bool:
        """Whether new lines may start (False while the gateway drains)."""

    async def run(self, line: LineRequest) -> LineAnswer:
        """Run one line through admission, the scheduler and an engine; cancellation aborts it."""


def answered(x: InputLine, answer: LineAnswer, request_id: str) -> LineResult:
    """The output (200) or error file line of an answered request."""
    try:
        body: Any = orjson.Fragment(answer.body) if orjson.loads(answer.body) is not None else None
    except orjson.JSONDecodeError:
        body = {"error": {"message": "the engine's answer was not JSON", "type": "upstream_error"}}
    doc = {
        "id": new_id("batch_req_"),
        "custom_id": x.custom_id,
        "response": {"status_code": answer.status, "request_id": request_id, "body": body},
        "error": None,
    }
    ok = answer.status == 200
    return LineResult(
        line=x.line,
        ok=ok,
        document=orjson.dumps(doc),
        input_tokens=answer.prompt_tokens,
        cached_tokens=answer.cached_tokens,
        output_tokens=answer.completion_tokens,
    )


def expired(x: InputLine) -> bytes:
    """The error file line of a request left unfinished when its batch's window ended."""
    return orjson.dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": x.custom_id,
            "response": None,
            "error": {"code": "batch_expired", "message": EXPIRED_MESSAGE},
        }
    )
