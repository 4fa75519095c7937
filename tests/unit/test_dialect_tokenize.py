"""The engines' tokenize route, sans-IO: the body each dialect sends for a request, and the count read
back from an answer (shapes from vLLM's `vllm/entrypoints/serve/tokenize/protocol.py` and SGLang's
`TokenizeRequest` / `TokenizeResponse`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from gateway.core.types import ApiKind, EngineKind
from gateway.upstream.dialects import SGLANG, VLLM, Dialect, dialect_for, tokenize_count

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("dialect", "api", "request_body", "expected"),
    [
        pytest.param(
            VLLM,
            ApiKind.CHAT,
            {"model": "alias", "messages": MSGS, "max_tokens": 5, "stream": True, "temperature": 0},
            {"model": "served", "messages": MSGS},
            id="vllm-chat",
        ),
        pytest.param(
            VLLM,
            ApiKind.CHAT,
            {
                "model": "alias",
                "messages": MSGS,
                "tools": TOOLS,
                "tool_choice": "auto",
                "add_generation_prompt": False,
                "continue_final_message": True,
                "add_special_tokens": True,
                "chat_template": "{{ messages }}",
                "chat_template_kwargs": {"enable_thinking": False},
                "priority": 3,
            },
            {
                "model": "served",
                "messages": MSGS,
                "add_generation_prompt": False,
                "continue_final_message": True,
                "add_special_tokens": True,
                "chat_template": "{{ messages }}",
                "chat_template_kwargs": {"enable_thinking": False},
                "tools": TOOLS,
            },
            id="vllm-chat-template-fields",
        ),
        pytest.param(
            VLLM,
            ApiKind.CHAT,
            {"model": "alias", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            {"model": "served", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            id="vllm-chat-text-parts",
        ),
        pytest.param(
            VLLM,
            ApiKind.COMPLETION,
            {"model": "alias", "prompt": "def f():", "max_tokens": 5, "echo": True},
            {"model": "served", "prompt": "def f():"},
            id="vllm-completion",
        ),
        pytest.param(
            VLLM,
            ApiKind.COMPLETION,
            {"model": "alias", "prompt": "def f():", "add_special_tokens": False},
            {"model": "served", "prompt": "def f():", "add_special_tokens": False},
            id="vllm-completion-special-tokens",
        ),
        pytest.param(
            VLLM,
            ApiKind.EMBEDDING,
            {"model": "alias", "input": "a sentence", "encoding_format": "float"},
            {"model": "served", "prompt": "a sentence"},
            id="vllm-embedding",
        ),
        pytest.param(
            SGLANG,
            ApiKind.CHAT,
            {
                "model": "alias",
                "messages": MSGS,
                "tools": TOOLS,
                "tool_choice": "auto",
                "reasoning_effort": "low",
                "add_generation_prompt": False,
            },
            {
                "model": "served",
                "messages": MSGS,
                "tools": TOOLS,
                "tool_choice": "auto",
                "reasoning_effort": "low",
            },
            id="sglang-chat",
        ),
        pytest.param(
            SGLANG,
            ApiKind.COMPLETION,
            {"model": "alias", "prompt": "def f():"},
            {"model": "served", "prompt": "def f():"},
            id="sglang-completion",
        ),
    ],
)
def test_tokenize_body(
    dialect: Dialect, api: ApiKind, request_body: dict[str, Any], expected: dict[str, Any]
) -> None:
    body = dialect.tokenize_body(api, request_body, "served")

    assert body is not None
    assert orjson.loads(body) == expected
    assert dialect.tokenize_path == "/tokenize"


@pytest.mark.parametrize(
    ("dialect", "api", "request_body"),
    [
        pytest.param(VLLM, ApiKind.COMPLETION, {"prompt": ["a", "b"]}, id="prompt-batch"),
        pytest.param(VLLM, ApiKind.COMPLETION, {"prompt": [1, 2, 3]}, id="token-ids"),
        pytest.param(VLLM, ApiKind.COMPLETION, {"prompt": [[1, 2], [3]]}, id="token-id-batch"),
        pytest.param(SGLANG, ApiKind.EMBEDDING, {"input": ["a", "b"]}, id="embedding-batch"),
        pytest.param(
            VLLM,
            ApiKind.CHAT,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}},
                        ],
                    }
                ]
            },
            id="image-part",
        ),
        pytest.param(replace(VLLM, tokenize_path=None), ApiKind.CHAT, {"messages": MSGS}, id="no-route"),
        pytest.param(
            replace(VLLM, tokenize_chat_fields=()), ApiKind.CHAT, {"messages": MSGS}, id="no-chat-counting"
        ),
    ],
)
def test_what_is_not_counted(dialect: Dialect, api: ApiKind, request_body: dict[str, Any]) -> None:
    assert dialect.tokenize_body(api, request_body, "served") is None


@pytest.mark.parametrize(
    ("answer", "count"),
    [
        pytest.param(b'{"count": 7, "max_model_len": 2048, "tokens": [1, 2, 3, 4, 5, 6, 7]}', 7, id="vllm"),
        pytest.param(
            b'{"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3], "token_strs": null}', 3, id="vllm-strs"
        ),
        pytest.param(b'{"tokens": [], "count": 0, "max_model_len": -1}', 0, id="sglang-empty"),
    ],
)
def test_tokenize_count(answer: bytes, count: int) -> None:
    assert tokenize_count(answer) == count


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"<html>502 Bad Gateway</html>", id="not-json"),
        pytest.param(b"[7]", id="not-an-object"),
        pytest.param(b'{"tokens": [1, 2]}', id="no-count"),
        pytest.param(b'{"count": -1}', id="negative"),
        pytest.param(b'{"count": 2.5}', id="not-an-integer"),
        pytest.param(b'{"count": true}', id="boolean"),
        pytest.param(b'{"count": [2, 3]}', id="a-batch"),
        pytest.param(b'{"count": "7"}', id="string"),
    ],
)
def test_tokenize_count_rejects(answer: bytes) -> None:
    with pytest.raises(ValueError, match="tokenize answer"):
        tokenize_count(answer)


def test_dialect_for_every_kind() -> None:
    for kind in EngineKind:
        assert dialect_for(kind).kind is kind


@pytest.mark.parametrize("dialect", [VLLM, SGLANG], ids=["vllm", "sglang"])
def test_aborts_on_disconnect(dialect: Dialect) -> None:
    assert dialect.aborts_on_disconnect


def test_abort() -> None:
    assert VLLM.abort_path is None
    assert VLLM.abort_body("r-1") is None
    assert SGLANG.abort_path == "/abort_request"
    assert SGLANG.request_id_field == "rid"
    assert orjson.loads(SGLANG.abort_body('r-1"x') or b"") == {"rid": 'r-1"x'}
