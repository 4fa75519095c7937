"""Exact prompt-token counts from an engine's tokenize route (`[telemetry] prompt_tokens = "tokenize"`).

Before a request becomes a scheduler request, `EnginePromptCounter.count` asks one ready endpoint that
serves its model (the one the gateway runs fewest requests on: any of them has the model's tokenizer)
to count the prompt under the engine's served name, within `telemetry.tokenize_timeout_s`. A count
becomes the request's prompt tokens and calibrates the `TokenEstimator`, so the estimate stays right
for the requests whose count fails. Nothing here can fail a request: on a timeout, an error, a non-200
or a malformed answer the caller uses the estimate; `berth_tokenize_requests_total{result}` counts
every outcome and a debug line says why it was not "ok".

Results (`TokenizeResult`): ok, given (a prompt of token ids: nothing to ask), timeout, error (an
SGLang too old to count chat messages answers 400: error every time, so turn it off there),
unsupported (not asked: the engine has no tokenize route for this kind of request, the prompt is
neither one string, token ids nor chat messages of text only, or the endpoint lately answered 404 /
405 for the model), no_endpoint (not asked: no ready endpoint serves the model; the request queues
as usual). A 404 or 405 says that the endpoint lacks the route (or the model): that endpoint and
model are passed over for `UNSUPPORTED_RETRY_S` rather than cost every request a round trip.

With the default `prompt_tokens = "estimate"` none of this is built: the request path checks one
attribute. A client that disconnects during the count cancels the engine call (its connection
closes); nothing is counted and nothing is kept.

Token ids (`ids = True`, on while any endpoint publishes KV events): the precise prefix source keys
blocks by token ids, so a request is matched by its ids. The same call asks for them (both engines
answer them beside the count). A completions prompt given as token ids (one list of ints) needs no
call at all: its ids and count are the prompt itself. What asking for ids costs per request is in
docs/kv-events.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import aiohttp
import structlog

from gateway.core.clock import Clock
from gateway.core.metrics import GatewayMetrics
from gateway.core.types import ApiKind, EndpointHealth, EndpointId, ModelName, ParsedRequest
from gateway.sched.snapshot import EndpointView
from gateway.telemetry.tokens import TokenEstimator
from gateway.upstream.credentials import EngineAuth
from gateway.upstream.dialects import dialect_for
from gateway.upstream.tokenize import TokenizeResult, tokenize

log = structlog.get_logger("berth.tokenize")

#: How long an endpoint that answered 404 / 405 for a model is not asked again for it.
UNSUPPORTED_RETRY_S: Final = 60.0
_MISSING: Final = frozenset({404, 405})


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A prompt as the engine tokenizes it: its count, and its ids when they were asked for."""

    count: int
    ids: tuple[int, ...] | None = None


def given_ids(parsed: ParsedRequest) -> tuple[int, ...] | None:
    """The token ids of a completions prompt sent as one list of token ids; None for any other prompt."""
    if parsed.api is not ApiKind.COMPLETION:
        return None
    prompt = parsed.body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(x) is int for x in prompt):
        return tuple(prompt)
    return None


class EnginePromptCounter:
    def __init__(
        self,
        *,
        session: Callable[[], aiohttp.ClientSession],
        endpoints: Callable[[], Sequence[EndpointView]],
        tokens: TokenEstimator,
        metrics: GatewayMetrics,
        clock: Clock,
        timeout_s: float,
        auth: EngineAuth | None = None,
    ) -> None:
        self._session = session  # read per call: the session opens after this is built
        self._auth = auth if auth is not None else EngineAuth()
        self._endpoints = endpoints
        self._tokens = tokens
        self._results = metrics.tokenize_requests_of
        self._duration = metrics.tokenize_duration
        self._clock = clock
        self.timeout_s = timeout_s
        self._skip_until: dict[tuple[EndpointId, ModelName], float] = {}
        self.ids = False  # ask for the token ids too (the precise prefix source matches by them)

    async def count(self, request_id: str, parsed: ParsedRequest, served: ModelName) -> int | None:
        """The prompt tokens of `parsed` as an engine serving `served` counts them; None: use the
        estimate (the metric and the debug line say why)."""
        measured = await self.measure(request_id, parsed, served)
        return None if measured is None else measured.count

    async def measure(self, request_id: str, parsed: ParsedRequest, served: ModelName) -> PromptTokens | None:
        """The prompt's count and, with `ids`, its token ids; None: use the estimate."""
        given = given_ids(parsed)
        if given is not None:
            self._results(TokenizeResult.GIVEN).inc()
            return PromptTokens(len(given), given)
        now = self._clock.now()
        skip = self._skip_until
        if skip:  # forget the lapsed
            for key in [k for k, until in skip.items() if until <= now]:
                del skip[key]
        ep, result = pick_endpoint(self._endpoints(), served, skip, now)
        if ep is None:
            self._results(result).inc()
            return None
        dialect = dialect_for(ep.engine)
        body = dialect.tokenize_body(parsed.api, parsed.body, served)
        if body is None or dialect.tokenize_path is None:
            self._results(TokenizeResult.UNSUPPORTED).inc()
            return None
        started = self._clock.now()
        auth = self._auth
        answer = await tokenize(
            self._session(),
            ep.url + dialect.tokenize_path,
            body,
            request_id,
            self.timeout_s,
            auth=auth.headers(ep.id),
            ids=self.ids,
        )
        if answer.status is not None:
            auth.result(ep.id, "tokenize", answer.status)
        finished = self._clock.now()
        self._duration.observe(finished - started)
        self._results(answer.result).inc()
        if answer.count is not None:
            self._tokens.observe(served, parsed.prompt_chars, answer.count)
            return PromptTokens(answer.count, answer.tokens)
        if answer.status in _MISSING:
            skip[(ep.id, served)] = finished + UNSUPPORTED_RETRY_S
        log.debug(
            "tokenize_fallback",
            request_id=request_id,
            endpoint=ep.id,
            model=served,
            result=answer.result.value,
            status=answer.status,
            detail=answer.detail,
        )
        return None


def pick_endpoint(
    endpoints: Iterable[EndpointView],
    served: ModelName,
    passed_over: Mapping[tuple[EndpointId, ModelName], float],
    now: float,
) -> tuple[EndpointView | None, TokenizeResult]:
    """The endpoint to count a prompt of `served` on: the ready one serving it with the fewest
    requests in flight (the first of those in order), leaving out those `passed_over` until a time
    after `now`. None and why when there is none: no_endpoint, or unsupported when every ready one
    is passed over."""
    best: EndpointView | None = None
    skipped = False
    for ep in endpoints:
        if ep.health is not EndpointHealth.READY or served not in ep.models:
            continue
        if passed_over and passed_over.get((ep.id, served), now) > now:
            skipped = True
            continue
        if best is None or ep.inflight < best.inflight:
            best = ep
    if best is not None:
        return best, TokenizeResult.OK
    return None, TokenizeResult.UNSUPPORTED if skipped else TokenizeResult.NO_ENDPOINT
