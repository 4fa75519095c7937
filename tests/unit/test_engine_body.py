"""The engine call's body: the client's bytes, with only what berth must add."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.dispatch.engine_body import USAGE_MEMBER, engine_body, with_first_member

# Written the way no serialiser would write it back: spaces, a key order, 1e2 and 0.10 (orjson: 100.0, 0.1).
CLIENT = (
    b'{ "model" : "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.10, "n": 1e2,\n'
    b' "stream": true }'
)


def _body(raw: bytes) -> dict[str, Any]:
    out = orjson.loads(raw)
    assert isinstance(out, dict)
    return out


def test_a_stream_without_stream_options_gets_only_the_usage_member_in_front() -> None:
    body = _body(CLIENT)
    sent = engine_body(body, CLIENT, served_model="m", stream=True, include_usage=False, assemble=False)
    assert sent == b"{" + USAGE_MEMBER + b"," + CLIENT[1:]
    assert orjson.loads(sent) == body  # what the engine reads is the changed body
    assert body["stream_options"] == {"include_usage": True}


def test_nothing_changed_sends_the_clients_bytes() -> None:
    raw = CLIENT.replace(b'"stream": true', b'"stream": true, "stream_options": {"include_usage": true}')
    sent = engine_body(_body(raw), raw, served_model="m", stream=True, include_usage=True, assemble=False)
    assert sent is raw


USAGE = {"include_usage": True}


@pytest.mark.parametrize(
    ("raw", "served", "call", "expected"),
    [
        pytest.param(
            b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}',
            "m", "stream",
            {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": True, **USAGE}},
            id="client-stream-options-merged",
        ),
        pytest.param(
            b'{"model":"m","stream":true,"stream_options":null}',
            "m", "stream", {"model": "m", "stream": True, "stream_options": USAGE},
            id="client-null-stream-options-replaced",
        ),
        pytest.param(
            b'{"model":"alias","stream":true}',
            "served", "stream", {"model": "served", "stream": True, "stream_options": USAGE},
            id="alias-renamed",
        ),
        pytest.param(
            b'{"model":"m","max_tokens":3}',
            "m", "assemble", {"model": "m", "max_tokens": 3, "stream": True, "stream_options": USAGE},
            id="assembled-streamed-from-the-engine",
        ),
        pytest.param(
            b'{"model":"alias","max_tokens":3}',
            "served", "plain", {"model": "served", "max_tokens": 3},
            id="non-streamed-alias",
        ),
    ],
)  # fmt: skip
def test_other_changes_reserialise_the_changed_body(
    raw: bytes, served: str, call: str, expected: dict[str, Any]
) -> None:
    body = _body(raw)
    sent = engine_body(
        body,
        raw,
        served_model=served,
        stream=call == "stream",
        include_usage=False,
        assemble=call == "assemble",
    )
    assert orjson.loads(sent) == expected == body
    assert sent.count(b'"stream_options"') == (1 if "stream_options" in expected else 0)


def test_without_the_clients_bytes_the_body_is_serialised() -> None:
    body = {"model": "m", "stream": True}
    sent = engine_body(body, None, served_model="m", stream=True, include_usage=False, assemble=False)
    assert orjson.loads(sent) == {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a":1}', b'{"k":1,"a":1}'),
        (b' \n\t{"a":1}', b'{"k":1,"a":1}'),
        (b"{}", b'{"k":1}'),
        (b"{ \n}", b'{"k":1 \n}'),
        (b"[1]", None),
        (b"", None),
    ],
    ids=["object", "leading-whitespace", "empty", "empty-with-space", "array", "nothing"],
)
def test_with_first_member(raw: bytes, expected: bytes | None) -> None:
    assert with_first_member(raw, b'"k":1') == expected


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@given(
    members=st.dictionaries(st.text(max_size=8).filter(lambda k: k != "stream_options"), _JSON, max_size=5),
    indent=st.booleans(),
)
def test_the_member_lands_in_any_object(members: dict[str, Any], indent: bool) -> None:
    raw = orjson.dumps(members, option=orjson.OPT_INDENT_2 if indent else 0)
    spliced = with_first_member(raw, USAGE_MEMBER)
    assert spliced is not None
    assert orjson.loads(spliced) == {"stream_options": {"include_usage": True}, **members}
