"""/v1/models and unknown models, through berth to real vLLM."""

from __future__ import annotations

import json
from collections.abc import Callable

import openai
import pytest

from tests.engine.conftest import MODEL_NAME


def test_models_lists_tiny_llama(openai_client: openai.OpenAI) -> None:
    models = openai_client.models.list()

    ids = [m.id for m in models.data]
    assert MODEL_NAME in ids
    assert all(m.object == "model" for m in models.data)


def test_models_response_has_the_openai_list_shape(openai_client: openai.OpenAI) -> None:
    raw = openai_client.models.with_raw_response.list()

    assert raw.http_response.status_code == 200
    assert raw.http_response.headers["content-type"].startswith("application/json")
    body = json.loads(raw.http_response.text)
    assert body["object"] == "list"
    [entry] = [m for m in body["data"] if m["id"] == MODEL_NAME]
    assert entry["object"] == "model"
    assert isinstance(entry["created"], int)
    assert isinstance(entry["owned_by"], str)


def _chat(client: openai.OpenAI, model: str) -> object:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )


def _completion(client: openai.OpenAI, model: str) -> object:
    return client.completions.create(model=model, prompt="hi", max_tokens=4)


def _streaming_chat(client: openai.OpenAI, model: str) -> object:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    with stream:
        return list(stream)


@pytest.mark.parametrize(
    "call",
    [_chat, _completion, _streaming_chat],
    ids=["chat", "completion", "streaming-chat"],
)
def test_unknown_model_is_not_found(
    openai_client: openai.OpenAI, call: Callable[[openai.OpenAI, str], object]
) -> None:
    with pytest.raises(openai.NotFoundError) as excinfo:
        call(openai_client, "no-such-model")

    assert excinfo.value.status_code == 404
    assert "no-such-model" in excinfo.value.message
