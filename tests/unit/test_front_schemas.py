"""Request validation: precise messages naming the field; unknown fields pass through."""

from __future__ import annotations

import orjson
import pytest

from gateway.core.errors import BerthError
from gateway.core.types import ApiKind
from gateway.front.schemas import parse_body


@pytest.mark.parametrize(
    ("api", "body", "param"),
    [
        (ApiKind.CHAT, {"messages": [{"role": "user"}]}, "model"),
        (ApiKind.CHAT, {"model": "", "messages": [{"role": "user"}]}, "model"),
        (ApiKind.CHAT, {"model": "m"}, "messages"),
        (ApiKind.CHAT, {"model": "m", "messages": ["x"]}, "messages[0]"),
        (ApiKind.CHAT, {"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            ApiKind.CHAT,
            {"model": "m", "messages": [{"role": "user", "content": ["x"]}]},
            "messages[0].content[0]",
        ),
        (ApiKind.CHAT, {"model": "m", "messages": [{"role": "u"}], "max_tokens": -1}, "max_tokens"),
        (ApiKind.CHAT, {"model": "m", "messages": [{"role": "u"}], "max_tokens": True}, "max_tokens"),
        (ApiKind.CHAT, {"model": "m", "messages": [{"role": "u"}], "n": 0}, "n"),
        (ApiKind.CHAT, {"model": "m", "messages": [{"role": "u"}], "stream_options": {}}, "stream_options"),
        (
            ApiKind.CHAT,
            {
                "model": "m",
                "messages": [{"role": "u"}],
                "stream": True,
                "stream_options": {"include_usage": "y"},
            },
            "stream_options.include_usage",
        ),
        (ApiKind.COMPLETION, {"model": "m"}, "prompt"),
        (ApiKind.COMPLETION, {"model": "m", "prompt": [1, "a"]}, "prompt"),
        (ApiKind.EMBEDDING, {"model": "m"}, "input"),
        (ApiKind.EMBEDDING, {"model": "m", "input": "x", "stream": True}, "stream"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_schema_errors_name_the_field(api: ApiKind, body: dict[str, object], param: str) -> None:
    with pytest.raises(BerthError) as ei:
        parse_body(api, orjson.dumps(body))
    assert ei.value.status == 400
    assert ei.value.param == param
    assert ei.value.message.startswith(f"'{param}'")


def test_valid_request_keeps_unknown_fields_and_reads_what_berth_needs() -> None:
    raw = orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hello"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 50,
            "max_completion_tokens": 20,
            "ignore_eos": True,
        }
    )
    p = parse_body(ApiKind.CHAT, raw)
    assert (p.model, p.stream, p.include_usage, p.max_tokens, p.prompt_chars) == ("m", True, True, 20, 5)
    assert p.body["ignore_eos"] is True


def test_malformed_json() -> None:
    with pytest.raises(BerthError) as ei:
        parse_body(ApiKind.CHAT, b'{"model": ')
    assert ei.value.code == "invalid_json"
