"""The body of the engine call, made from the client's.

berth asks every streamed call for the engine's usage report (its token counts feed the metrics, the
tenant's accounting and telemetry; the relay drops the report unless the client asked for it too), and
streams a non-streamed request that may be preempted. What the engine gets:

- the client's bytes as they came, when berth changes nothing;
- the client's bytes with berth's usage request put in front of their first member, when that is all
  berth adds (a streamed request whose client sent no `stream_options`, the common case): no
  re-serialisation of a body that may hold a long prompt, and the engine reads what the client wrote;
- else the parsed body, changed and serialised again.

The parsed body is changed in every case, so that later calls made from it (a retry's priority, a
resume, a tokenize) carry the same fields.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

#: What berth adds to a streamed call whose client sent no `stream_options`.
USAGE_MEMBER: Final = b'"stream_options":{"include_usage":true}'
_WHITESPACE: Final = b" \t\r\n"
_OPEN: Final = ord("{")
_CLOSE: Final = ord("}")


def engine_body(
    body: dict[str, Any],
    raw: bytes | None,
    *,
    served_model: str,
    stream: bool,
    include_usage: bool,
    assemble: bool,
) -> bytes:
    """The engine call's body for the client's `body` (parsed from `raw`, if given), which is changed in
    place: `assemble` (a non-streamed request berth streams from the engine) asks for a stream with usage,
    a `stream` whose client did not ask for usage asks for it, and the model is the served one."""
    changed = False
    member_only = False  # the only change is USAGE_MEMBER, added to a body without stream_options
    if assemble:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        changed = True
    elif stream and not include_usage:
        member_only = "stream_options" not in body
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        changed = True
    if body.get("model") != served_model:
        body["model"] = served_model
        changed = True
        member_only = False
    if raw is not None:
        if not changed:
            return raw
        if member_only:
            spliced = with_first_member(raw, USAGE_MEMBER)
            if spliced is not None:
                return spliced
    return orjson.dumps(body)


def with_first_member(raw: bytes, member: bytes) -> bytes | None:
    """`raw`, the text of a JSON object that lacks `member`'s key, with `member` (`"key":value`) as its
    first member; None if `raw` does not open with `{` (after optional whitespace)."""
    if raw[:2] == b'{"':  # compact, as serialisers write: no whitespace to look past
        return b"{" + member + b"," + raw[1:]
    end = len(raw)
    start = 0
    while start < end and raw[start] in _WHITESPACE:
        start += 1
    if start == end or raw[start] != _OPEN:
        return None
    after = start + 1
    while after < end and raw[after] in _WHITESPACE:
        after += 1
    separator = b"" if after < end and raw[after] == _CLOSE else b","  # an empty object has no member
    return b"".join((b"{", member, separator, memoryview(raw)[start + 1 :]))
