"""Fuzzing the two parsers that read what engines send: the SSE relay and the Prometheus text parser.

Garbage at any chunk boundary never raises out of them; a valid stream split anywhere relays exactly
what it relays unsplit (bytes, text, tokens, usage, finish); a parser warmed on corrupted pages reads a
good page as a fresh one does. `BERTH_FUZZ_EXAMPLES` raises the number of examples.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.promtext import Exposition, PromParser, parse
from gateway.upstream.sse import SseRelay

EXAMPLES = int(os.environ.get("BERTH_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None)
VLLM_PAGE = (Path(__file__).parent / "data" / "vllm_v1_dp2.prom").read_text()


# ------------------------------------------------------------------------------------- the relay
def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_text = st.text(st.characters(codec="utf-8"), max_size=6)
_delta = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": st.none() | _text,
        "reasoning_content": _text,
        "tool_calls": st.just([{"index": 0, "function": {"arguments": "{}"}}]),
    },
)


@st.composite
def _valid_events(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    model = draw(st.sampled_from(["served", "other"]))
    if kind == 0:
        return b": ping\n\n"
    if kind == 1:
        usage = {"prompt_tokens": draw(st.integers(0, 99)), "completion_tokens": draw(st.integers(0, 99))}
        return _event({"id": "c", "model": model, "choices": [], "usage": usage})
    if kind == 2:  # a completions-API chunk
        choice = {"index": 0, "text": draw(_text), "finish_reason": draw(st.none() | st.just("stop"))}
        return _event({"id": "c", "model": model, "choices": [choice]})
    choice = {"index": 0, "delta": draw(_delta), "finish_reason": draw(st.none() | st.just("length"))}
    return _event({"id": "c", "model": model, "choices": [choice]})


@st.composite
def valid_streams(draw: st.DrawFn) -> bytes:
    body = b"".join(draw(st.lists(_valid_events(), max_size=12)))
    if draw(st.booleans()):
        body += b"data: [DONE]\n\n"
    if draw(st.booleans()):
        body = body.replace(b"\n", b"\r\n")  # CRLF framing (cut points may split the pair)
    return body


def _relay(include_usage: bool, alias: bool) -> SseRelay:
    return SseRelay(
        include_usage=include_usage, served_model="served", client_model="alias" if alias else "served"
    )


def _run(relay: SseRelay, chunks: list[bytes]) -> bytes:
    out = b"".join(relay.feed(c, 1.0) for c in chunks)
    return out + relay.flush()


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _state(relay: SseRelay) -> tuple[Any, ...]:
    return (relay.produced_text, relay.tokens, relay.usage, relay.finish_reason, relay.done, relay.error)


@FUZZ
@given(valid_streams(), st.lists(st.integers(0, 4000), max_size=30), st.booleans(), st.booleans())
def test_a_valid_stream_split_anywhere_relays_as_unsplit(
    stream: bytes, cuts: list[int], include_usage: bool, alias: bool
) -> None:
    whole = _relay(include_usage, alias)
    expected = _run(whole, [stream])
    split = _relay(include_usage, alias)
    assert _run(split, _cut(stream, cuts)) == expected
    assert _state(split) == _state(whole)


_garbage_piece = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"data: ",
            b"data:",
            b"\n\n",
            b"\r\n\r\n",
            b"\r",
            b"data: [DONE]",
            b'data: {"choices": 5}',
            b'data: {"choices": [5, null, {"delta": 3}, {"delta": {"content": 7}}]}',
            b'data: {"choices": [{"delta": {"tool_calls": {"x": 1}}, "finish_reason": [1]}]}',
            b'data: {"choices": [{"text": ["a"]}], "usage": 3}',
            b'data: {"usage": {"completion_tokens": "x"}, "choices": null}',
            b'data: {"error": "boom"}',
            b'data: {"error": {"message": 1}, "model": "served"}',
            b"data: [1, 2]",
            b'data: "text"',
            b"data: NaN",
            b"data: {" + b"[" * 3000,
            b"data: \xff\xfe",
            b"event: x\nid: 3\nretry: 1",
            b"\x00",
            b'{"model":"served"}',
        ]
    ),
)


@FUZZ
@given(
    st.lists(_garbage_piece, max_size=20),
    st.lists(st.integers(0, 2000), max_size=20),
    st.booleans(),
    st.booleans(),
)
def test_garbage_at_any_boundary_never_raises(
    pieces: list[bytes], cuts: list[int], include_usage: bool, alias: bool
) -> None:
    data = b"".join(pieces)
    relay = _relay(include_usage, alias)
    out = _run(relay, _cut(data, cuts))
    assert isinstance(out, bytes)
    assert relay.tokens >= 0
    _ = relay.produced_text  # text pieces are strings whatever the engine sent


# Examples the fuzzing found (TypeError out of `feed`, or a later one out of `produced_text` or the
# dispatcher's reading of `usage`), kept as explicit regression tests.
@pytest.mark.parametrize(
    "event",
    [
        b'data: {"choices": 1}\n\n',
        b'data: {"choices": true, "usage": 3}\n\n',
        b'data: {"choices": [{"delta": {"content": 7}}]}\n\n',
        b'data: {"choices": [{"text": ["a"], "finish_reason": [1]}]}\n\n',
    ],
    ids=["choices-int", "usage-int", "content-int", "text-and-finish-lists"],
)
def test_garbage_fields_are_relayed_and_read_as_nothing(event: bytes) -> None:
    relay = _relay(include_usage=False, alias=False)
    assert relay.feed(event, 1.0) == event
    assert relay.produced_text == ""
    assert relay.usage is None
    assert relay.finish_reason is None


# ---------------------------------------------------------------------------- the metrics parser
def _flat(expo: Exposition) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), repr(s.value))
        for fam in expo.families.values()
        for s in fam.samples
    )


@st.composite
def corrupted_pages(draw: st.DrawFn) -> str:
    """The real vLLM page cut short, with garbage spliced in at random places, or lines shuffled."""
    page = VLLM_PAGE
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(page)))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            page = page[:at]
        elif kind == 1:
            page = page[:at] + draw(st.text(max_size=30)) + page[at:]
        elif kind == 2:
            page = page[:at] + page[at + draw(st.integers(1, 50)) :]
        else:
            lines = page.splitlines()
            page = "\n".join(draw(st.permutations(lines[:40]))) + "\n" + "\n".join(lines[40:])
    return page


def _use(expo: Exposition) -> None:
    """Every typed view over a page, as the scraper reads one."""
    for name in list(expo.sample_names()):
        expo.value(name)
        hist = expo.histogram(name.removesuffix("_bucket"))
        if hist is not None:
            _ = hist.mean
            for q in (0.0, 0.5, 0.99, 1.0):
                hist.quantile(q)


@FUZZ
@given(st.lists(corrupted_pages(), min_size=1, max_size=3))
def test_corrupted_pages_never_raise_and_leave_the_parser_sound(pages: list[str]) -> None:
    warm = PromParser()
    for page in pages:
        expo = warm.parse(page)
        assert _flat(expo) == _flat(parse(page))  # its label cache changes nothing
        _use(expo)
    assert _flat(warm.parse(VLLM_PAGE)) == _flat(parse(VLLM_PAGE))


@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=8))
def test_any_bytes_as_the_scraper_decodes_them_never_raise(data: bytes, cuts: list[int]) -> None:
    parser = PromParser()
    for chunk in _cut(data, cuts):  # pages that end anywhere, one after another on one parser
        _use(parser.parse(chunk.decode("utf-8", errors="replace")))
