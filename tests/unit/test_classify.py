"""to_sched_request: prompt tokens from the calibrated estimator, output length from the predictor."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from gateway.admission.classify import task_class, to_sched_request
from gateway.core.slo import Allotment
from gateway.core.types import SLO, ApiKind, EndpointId, ModelName, ParsedRequest, RequestId
from gateway.front.schemas import parse_body
from gateway.sched.prefix import NO_HITS, PrefixHits
from gateway.sched.request import SchedRequest
from gateway.telemetry.lengths import OutputLengthPredictor
from gateway.telemetry.tokens import TokenEstimator

M = ModelName("m")


def parsed(
    api: ApiKind = ApiKind.COMPLETION, *, chars: int = 1200, max_tokens: int | None = None
) -> ParsedRequest:
    body: dict[str, object] = {"model": "m"}
    if api is ApiKind.EMBEDDING:
        body["input"] = "x" * chars
    else:
        body["prompt"] = "x" * chars
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return parse_body(api, orjson.dumps(body))


def test_without_predictors_it_is_four_characters_per_token() -> None:
    r = to_sched_request("r1", parsed(chars=1200), M, 5.0)
    assert r.prompt_tokens == 300
    assert (r.predicted_output_tokens, r.predicted_output_p90) == (None, None)


def test_prompt_tokens_use_the_calibrated_ratio() -> None:
    tokens = TokenEstimator()
    for _ in range(10):
        tokens.observe("m", 3000, 1000)  # 3 characters per token for this model
    r = to_sched_request("r1", parsed(chars=1200), M, 5.0, tokens=tokens)
    assert r.prompt_tokens == 400


def test_output_length_is_predicted_and_capped_by_max_tokens() -> None:
    lengths = OutputLengthPredictor()
    for n in (100, 200, 300):
        lengths.observe("m", task_class(SLO()), 300, n)
    r = to_sched_request("r1", parsed(chars=1200), M, 5.0, lengths=lengths)
    assert r.predicted_output_tokens == pytest.approx(200.0)
    assert r.predicted_output_p90 is not None
    assert r.predicted_output_p90 > 200.0
    capped = to_sched_request("r2", parsed(chars=1200, max_tokens=150), M, 5.0, lengths=lengths)
    assert capped.predicted_output_tokens is not None
    assert capped.predicted_output_tokens <= 150.0


def test_an_embedding_generates_nothing() -> None:
    r = to_sched_request("r1", parsed(ApiKind.EMBEDDING), M, 5.0, lengths=OutputLengthPredictor())
    assert (r.predicted_output_tokens, r.predicted_output_p90) == (0.0, 0.0)


def test_a_request_is_resumable_only_under_a_preempting_policy() -> None:
    stream = ParsedRequest(
        api=ApiKind.COMPLETION,
        body={"model": "m", "prompt": "hi", "stream": True},
        model="m",
        stream=True,
        include_usage=False,
        max_tokens=None,
        prompt_chars=2,
    )
    assert not to_sched_request("r1", stream, M, 5.0).resumable
    assert to_sched_request("r1", stream, M, 5.0, preemptive=True).resumable
    whole = dataclasses.replace(stream, stream=False, body={"model": "m", "prompt": "hi"})
    assert not to_sched_request("r1", whole, M, 5.0, preemptive=True).resumable  # answered in one piece
    assert to_sched_request("r1", whole, M, 5.0, preemptive=True, stream_unstreamed=True).resumable


def test_the_request_holds_each_value_under_its_own_name() -> None:
    """The scheduler's request is built positionally (once per request): every field named."""
    p = parse_body(
        ApiKind.CHAT,
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"stream":true}',
    )
    lengths = OutputLengthPredictor(min_samples=1)
    lengths.observe("m", "c", 1, 5)
    allot = Allotment(2.5, True)
    slo = SLO("c", ttft_ms=100.0)
    hits = PrefixHits({EndpointId("e"): 1})
    r = to_sched_request(
        "r9",
        p,
        M,
        5.0,
        lengths=lengths,
        slo=slo,
        task_id="t1",
        allotment=allot,
        preemptive=True,
        cached=lambda tokens: hits if tokens == 1 else NO_HITS,
    )
    pred = lengths.predict("m", "c", 1, 7)
    assert r == SchedRequest(
        id=RequestId("r9"),
        model=M,
        api=ApiKind.CHAT,
        arrival=5.0,
        slo=slo,
        prompt_tokens=1,
        max_tokens=7,
        stream=True,
        task_id="t1",
        predicted_output_tokens=pred.mean,
        predicted_output_p90=pred.p90,
        best_effort=False,
        resumable=True,
        preemptions=0,
        produced_tokens=0,
        allotment=allot,
        cached=hits,
    )
    assert len(dataclasses.fields(SchedRequest)) == 17  # a new field must be passed by to_sched_request
