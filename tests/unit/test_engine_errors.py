"""An engine's error answer keeps its detail on the way to the client (`errors.engine_error`), and an
unknown model's 404 names the models served (`errors.model_not_found`)."""

from __future__ import annotations

import orjson
import pytest

from gateway.core import errors
from gateway.core.errors import MAX_ENGINE_EXCERPT, MAX_LISTED_MODELS

VLLM_400 = {
    "error": {
        "message": "1 validation error:\n  {'loc': 'body.max_tokens', 'msg': 'must be at least 1'}",
        "type": "Bad Request",
        "param": "body.max_tokens",
        "code": 400,
    }
}


@pytest.mark.parametrize(
    ("body", "message", "type_", "param", "code"),
    [
        pytest.param(
            orjson.dumps(VLLM_400),
            VLLM_400["error"]["message"],
            "Bad Request",
            "body.max_tokens",
            "engine_rejected",  # vLLM's code is the status number: berth's own code stays
            id="vllm",
        ),
        pytest.param(
            b'{"error": {"message": "too long", "type": "invalid_request_error", "param": "messages",'
            b' "code": "context_length_exceeded"}}',
            "too long",
            "invalid_request_error",
            "messages",
            "context_length_exceeded",
            id="openai-string-code",
        ),
        pytest.param(
            b'{"object": "error", "message": "bad n", "type": "BadRequestError", "param": "n", "code": 400}',
            "bad n",
            "BadRequestError",
            "n",
            "engine_rejected",
            id="flat-older-vllm-and-sglang",
        ),
        pytest.param(
            b'{"error": "Input validation error: inputs too long", "error_type": "validation"}',
            "Input validation error: inputs too long",
            "validation",
            None,
            "engine_rejected",
            id="error-string",
        ),
        pytest.param(
            b'{"detail": [{"loc": ["body", "messages", 0, "role"], "msg": "Field required"},'
            b' {"loc": ["body", "n"], "msg": "must be positive"}]}',
            "body.messages.0.role: Field required; body.n: must be positive",
            "invalid_request_error",
            "body.messages.0.role",
            "engine_rejected",
            id="fastapi-validation",
        ),
        pytest.param(
            b'{"detail": "Not Found"}',
            "Not Found",
            "invalid_request_error",
            None,
            "engine_rejected",
            id="fastapi-detail",
        ),
        pytest.param(
            b'{"status": "nope", "reason": 3}',
            "engine answered 400 with a JSON object with keys reason, status but no error message",
            "invalid_request_error",
            None,
            "engine_rejected",
            id="json-without-message",
        ),
        pytest.param(
            b"<html>\n<body>400   Bad Request</body></html>",
            "<html> <body>400 Bad Request</body></html>",
            "invalid_request_error",
            None,
            "engine_rejected",
            id="not-json",
        ),
        pytest.param(b"", "Bad Request", "invalid_request_error", None, "engine_rejected", id="empty"),
    ],
)
def test_engine_4xx_keeps_its_detail(
    body: bytes, message: str, type_: str, param: str | None, code: str
) -> None:
    err = errors.engine_error(400, body, "Bad Request")
    assert (err.status, err.outcome) == (400, "engine_rejected")
    assert err.body() == {"error": {"message": message, "type": type_, "param": param, "code": code}}


def test_a_long_body_that_is_not_json_becomes_a_bounded_excerpt() -> None:
    err = errors.engine_error(422, b"x" * 10_000)
    assert err.message == "x" * MAX_ENGINE_EXCERPT + "..."


def test_an_engine_5xx_is_retryable_and_says_what_the_engine_said() -> None:
    err = errors.engine_error(503, orjson.dumps({"error": {"message": "overloaded", "code": 503}}))
    assert (err.status, err.code, err.retryable) == (502, "engine_failed", True)
    assert err.message == "engine answered 503: overloaded"


def test_an_unknown_model_names_the_served_models_bounded() -> None:
    assert errors.model_not_found("x", ["b", "a", "a"]).message == (
        "The model 'x' does not exist; served models: a, b"
    )
    many = [f"m{i:02d}" for i in range(MAX_LISTED_MODELS + 5)]
    message = errors.model_not_found("x", many).message
    assert message.endswith(f"m{MAX_LISTED_MODELS - 1:02d} and 5 more (GET /v1/models)")
    assert f"m{MAX_LISTED_MODELS:02d}" not in message
    assert errors.model_not_found("x").message == "The model 'x' does not exist"
