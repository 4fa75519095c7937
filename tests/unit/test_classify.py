"""to_sched_request: prompt tokens from the calibrated estimator, output length from the predictor."""

from __future__ import annotations

import orjson
import pytest

from gateway.admission.classify import task_class, to_sched_request
from gateway.core.types import SLO, ApiKind, ModelName, ParsedRequest
from gateway.front.schemas import parse_body
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
