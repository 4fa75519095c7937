"""The front's `LineRunner`: a batch line goes through the same phases as a request on its route, with
no client connection: admit (the model, the SLO, prompt tokens) -> the tenant's limits -> dispatch
(queue, engine call; preemptible and resumable as batch work is) -> finish (the seat back, the
canonical log line, the metrics).

The line runs as its batch's creator (the tenant's classes, limits and token quota apply), in the batch
SLO class (`[batch] slo_class`, else the policy's first class of kind batch, else its default class),
with the batch window's end as its deadline, so earlier batches go first. A refusal that says the
gateway has no room now (a full queue, a tenant's limit, no ready endpoint, a drain) is not an answer:
the runner tries the line again; so does a line whose model berth does not serve at the moment (it was
served when the batch was created: an endpoint may be restarting).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

import orjson
import structlog

from gateway.admission.slo import H_CLASS, H_DEADLINE
from gateway.batch.lines import LineAnswer, LineRequest
from gateway.batch.validate import BodyCheck
from gateway.core import errors
from gateway.core.errors import BerthError, ErrorSource
from gateway.core.slo import SloKind, SloPolicy
from gateway.core.types import ApiKind
from gateway.dispatch.context import RequestContext
from gateway.front.api import admit, finish
from gateway.front.schemas import parse_body
from gateway.front.services import Services

log = structlog.get_logger("berth.batch")

API_OF_PATH: Final = {api.path: api for api in ApiKind}
_MAX_DEADLINE_MS: Final = 1e9  # what x-berth-deadline-ms accepts
UNKNOWN_MODEL: Final = errors.model_not_found("").outcome


def batch_class(policy: SloPolicy, configured: str) -> str:
    """The SLO class batch lines run in."""
    if configured and configured in policy.classes:
        return configured
    for c in policy.classes.values():
        if c.kind is SloKind.BATCH:
            return c.name
    return policy.default_class


class FrontLines:
    def __init__(
        self, services: Services, *, slo_class: str = "", wall: Callable[[], float] = time.time
    ) -> None:
        self.s = services
        self.slo_class = slo_class
        self.wall = wall

    def accepting(self) -> bool:
        # Ready: the first scrape round found the endpoints' models (a line fed before would find its
        # model unknown), and not draining.
        return self.s.ready

    def checker(self) -> BodyCheck:
        s = self.s
        known = s.scheduler.known_models()
        catalog = s.settings.catalog

        def check(endpoint: str, body: dict[str, Any]) -> tuple[str, str, str | None] | None:
            api = API_OF_PATH[endpoint]
            if body.get("stream"):
                return "invalid_request", "'stream' is not supported in a batch", "stream"
            try:
                parsed = parse_body(api, orjson.dumps(body))
                catalog.resolve(parsed.model, known)
            except BerthError as e:
                return e.code, e.message, e.param
            return None

        return check

    async def run(self, line: LineRequest) -> LineAnswer:
        s = self.s
        api = API_OF_PATH[line.endpoint]
        ctx = RequestContext(line.request_id, api, s.clock.now())
        tenant = s.settings.tenants.by_name.get(line.owner)
        seat = None
        try:
            if s.draining:
                raise errors.shutting_down()
            parsed = parse_body(api, line.body)
            ctx.client_model = parsed.model
            remaining_ms = (line.window_end - self.wall()) * 1000.0
            headers = [(H_CLASS, batch_class(s.settings.slo, self.slo_class))]
            if remaining_ms > 0:
                headers.append((H_DEADLINE, f"{min(remaining_ms, _MAX_DEADLINE_MS):.0f}"))
            sreq = await admit(s, ctx, parsed, headers, tenant)
            seat = s.tenancy.admit(tenant, sreq, s.clock.now())
            await asyncio.sleep(0)  # as on the route: the front half and the engine call in two turns
            resp = await s.dispatcher.run(ctx, sreq, parsed.body, False, None, raw=line.body)
            body = getattr(resp, "body", None)
            return LineAnswer(
                resp.status,
                body if isinstance(body, bytes) else b"null",
                prompt_tokens=ctx.prompt_tokens or 0,
                cached_tokens=_cached(body),
                completion_tokens=ctx.output_tokens,
            )
        except BerthError as e:
            ctx.fail(e)
            if e.source is ErrorSource.GATEWAY or e.outcome == UNKNOWN_MODEL:
                # No room now, or its model (checked when the batch was created) is not served at the
                # moment: tried again until the window ends.
                return LineAnswer(e.status, e.json_bytes(), retry_after_s=e.retry_after_s or 1.0)
            return LineAnswer(e.status, e.json_bytes())
        except asyncio.CancelledError:
            ctx.outcome = "cancelled"
            ctx.status = ctx.status or 499
            raise
        except Exception:
            log.exception("batch_line_failed", request_id=line.request_id)
            err = errors.internal()
            ctx.fail(err)
            return LineAnswer(err.status, err.json_bytes())
        finally:
            finish(s, ctx, tenant, seat)


def _cached(body: object) -> int:
    """The cached prompt tokens an answer reports (usage.prompt_tokens_details.cached_tokens)."""
    if not isinstance(body, bytes) or b"cached_tokens" not in body:
        return 0
    try:
        n = orjson.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return 0
    return n if isinstance(n, int) else 0
