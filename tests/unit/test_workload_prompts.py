"""Prompt text as named spans: equal names equal text, different keys different text, prefixes kept, token
counts exact on the engine simulator; plain prompts share nothing; the reusable share of a schedule."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.client import build_body
from loadgen.engine_sim.protocol import chat_prompt_tokens, completion_prompt_tokens
from loadgen.prompts import HEADER_WORDS, MAX_KEY, prompt_text, span_text
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.base import CallSpec, TaskSpec, call_prompt
from loadgen.workloads.prompt import ApiName, Message, Prompt, Span, answer, call_salt
from loadgen.workloads.stats import format_reuse, reusable_share

KEYS = st.integers(0, MAX_KEY)
API_NAMES: tuple[ApiName, ...] = ("chat", "completion")
SPACES = st.sampled_from(["a", "mooncake1", "chat7/user", "coding3/repo"])


def words(text: str) -> list[str]:
    assert len(text) % 4 == 0
    return [text[i : i + 4] for i in range(0, len(text), 4)]


@given(SPACES, KEYS, st.integers(0, 3000), st.integers(0, 3000))
def test_a_shorter_span_is_a_prefix_of_a_longer_one(space: str, key: int, n: int, m: int) -> None:
    short, long = sorted((n, m))
    a, b = span_text(space, key, short), span_text(space, key, long)
    assert len(a) == 4 * short
    assert len(b) == 4 * long
    assert b.startswith(a)
    assert a == span_text(space, key, short)  # equal names, equal text


@given(SPACES, KEYS, KEYS, st.integers(HEADER_WORDS, 600))
def test_different_keys_differ_within_the_header(space: str, a: int, b: int, n: int) -> None:
    ta, tb = span_text(space, a, n), span_text(space, b, n)
    head = 4 * HEADER_WORDS
    assert (ta[:head] == tb[:head]) == (a == b)
    assert (ta == tb) == (a == b)


@given(KEYS, st.integers(1, 200))
def test_span_words_are_three_letters_and_a_space(key: int, n: int) -> None:
    for w in words(span_text("s", key, n)):
        assert len(w) == 4
        assert w[:3].isalpha()
        assert w[3] == " "


def test_a_key_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="text key"):
        span_text("s", MAX_KEY + 1, 5)
    with pytest.raises(ValueError, match="text key"):
        span_text("s", -1, 5)


def test_spaces_spell_the_same_key_differently() -> None:
    assert span_text("a", 7, 100) != span_text("b", 7, 100)


@pytest.mark.parametrize("n", [1, 7, 100, 3000, 40_000])
def test_plain_prompts_of_a_run_share_no_leading_block(n: int) -> None:
    texts = [prompt_text(n, call_salt(t, i, seed=3)) for t in range(300) for i in range(2)]
    assert all(len(t) == 4 * n for t in texts)
    if n >= HEADER_WORDS:
        assert len({t[: 4 * HEADER_WORDS] for t in texts}) == len(texts)


PROMPT = Prompt(
    (
        Message("system", (Span("sys", 1, 300),)),
        Message("user", (Span("u", 1, 57), Span("u", 2, 3))),
        Message("assistant", (answer(41),)),
        Message("user", (Span("u", 3, 9),)),
    )
)


@pytest.mark.parametrize("api", API_NAMES)
def test_prompt_tokens_are_the_simulators_count(api: ApiName) -> None:
    call = CallSpec(PROMPT.tokens(api), 5, api=api, prompt=PROMPT)
    body = orjson.loads(build_body(call, "m", salt=0))
    if api == "chat":
        assert chat_prompt_tokens(body["messages"]) == call.prompt_tokens
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
        assert body["messages"][2]["content"] == " tok" * 41  # what the simulator answers
    else:
        assert completion_prompt_tokens(body["prompt"]) == call.prompt_tokens == 300 + 60 + 41 + 9
        assert body["prompt"] == PROMPT.rendered("completion")


def test_a_longer_conversation_renders_to_an_extension() -> None:
    shorter = Prompt(PROMPT.messages[:2])
    for api in API_NAMES:
        assert PROMPT.rendered(api).startswith(shorter.rendered(api))
        assert len(PROMPT.rendered(api)) <= 4 * PROMPT.tokens(api)


@pytest.mark.parametrize("api", API_NAMES)
def test_a_call_without_a_prompt_sends_text_of_its_own(api: ApiName) -> None:
    call = CallSpec(100, 5, api=api)
    a, b = call_prompt(call, 1), call_prompt(call, 2)
    assert a.tokens(call.api) == b.tokens(call.api) == 100
    assert a.rendered(call.api) != b.rendered(call.api)
    assert call_prompt(call, -5).tokens(call.api) == 100  # any salt names a text


def schedule(spec: str, *, rate: float = 5.0, duration: float = 40.0, seed: int = 1) -> list[TaskSpec]:
    run = RunOptions(target="x", workload=spec, rate=rate, duration_s=duration, seed=seed)
    return build_schedule(get_workload(spec), run)


@pytest.mark.parametrize(
    "spec", ["sharegpt-like", "coding:pattern1", "chat-batch:mixed", "multi-model:uniform", "maaso"]
)
def test_workloads_without_a_prefix_structure_share_no_block(spec: str) -> None:
    tasks = schedule(spec)
    for block in (HEADER_WORDS, 16, 512):
        stats = reusable_share(tasks, block_tokens=block, seed=1)
        assert stats.reused == 0, block
        assert stats.blocks > 0 or block == 512


def test_reusable_share_counts_full_blocks_seen_before() -> None:
    shared = Span("s", 1, 64)
    calls = [
        CallSpec(80, 1, api="completion", prompt=Prompt((Message("user", (shared, Span("t", i, 16))),)))
        for i in range(3)
    ]
    tasks = [TaskSpec(i, float(i), "x", (c,)) for i, c in enumerate(calls)]
    stats = reusable_share(tasks, block_tokens=16, seed=0)
    assert (stats.requests, stats.blocks, stats.reused) == (3, 15, 8)  # 4 shared blocks, twice
    assert stats.share == pytest.approx(8 / 15)
    moved = dataclasses.replace(calls[1], model_slot=1)
    other_model = [TaskSpec(0, 0.0, "x", (calls[0],)), TaskSpec(1, 1.0, "x", (moved,))]
    assert reusable_share(other_model, block_tokens=16).reused == 0  # another model's engines
    assert reusable_share(tasks, block_tokens=128).blocks == 0
    assert "53.3 %" in format_reuse("x", [stats])
    with pytest.raises(ValueError, match="block_tokens"):
        reusable_share(tasks, block_tokens=0)


@given(
    st.integers(1, 20_000),
    st.integers(1, 64),
    st.sampled_from(API_NAMES),
    st.integers(0, 2**62),
    st.none() | st.integers(0, 3),
)
def test_a_plain_body_is_built_as_its_prompt_says(
    prompt_tokens: int, output: int, api: ApiName, salt: int, priority: int | None
) -> None:
    """`build_body` of a call without a prompt writes `plain_prompt`'s message without making it: the
    same bytes as the body built from the prompt object."""
    call = CallSpec(prompt_tokens, output, api=api, priority=priority)
    prompt = call_prompt(call, salt)
    made = build_body(dataclasses.replace(call, prompt=prompt), "m", salt)
    assert build_body(call, "m", salt) == made


@given(SPACES, KEYS)
def test_the_header_spells_each_digit_with_the_spaces_offset(space: str, key: int) -> None:
    """`_header`'s tables of words per position give the words of the plain formula."""
    from loadgen.prompts import _BASE, _WORDS, _header, _pattern

    words, k = [], key
    for p in _pattern(space):
        k, digit = divmod(k, _BASE)
        words.append(_WORDS[(digit + p) % _BASE] + " ")
    assert _header(space, key) == "".join(words)
