"""The prefix index: the approximate source's blocks per endpoint (LRU, bounded, matched against every
endpoint at once), the seam for the precise source, and the hit-rate bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.blockhash import token_chain
from gateway.core.types import ApiKind, EndpointId
from gateway.telemetry.prefix_approx import ApproximateBlocks
from gateway.telemetry.prefix_index import PrefixIndex, PrefixSettings
from gateway.telemetry.prefix_keys import answer_of, chat_text, prompt_of
from gateway.telemetry.prefix_source import BlockHolder

A, B, C = EndpointId("a"), EndpointId("b"), EndpointId("c")
S = PrefixSettings(block_tokens=4, chars_per_token=4.0)  # 16-character blocks


def chains(draw: st.DrawFn) -> list[int]:
    return draw(st.lists(st.integers(0, 3), min_size=0, max_size=12))


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 5), st.lists(st.integers(0, 2), min_size=0, max_size=10)),
        min_size=1,
        max_size=40,
    ),
    caps=st.lists(st.integers(1, 12), min_size=6, max_size=6),
    probe=st.lists(st.integers(0, 2), min_size=0, max_size=12),
    gallop_groups=st.sampled_from([0, 1, 3, 1_000]),
    mask=st.none() | st.integers(0, 63),
    evict=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12)), max_size=3),
)
def test_matching_all_slots_at_once_equals_matching_each(  # noqa: PLR0917 (hypothesis's arguments)
    ops: list[tuple[int, list[int]]],
    caps: list[int],
    probe: list[int],
    gallop_groups: int,
    mask: int | None,
    evict: list[tuple[int, int]],
) -> None:
    """Sequences are chains over a small alphabet (so prompts share prefixes); each slot's LRU keeps
    every held block's prefix held too, so matching every slot at once (galloping, then one pass over
    the rest from any point on: `gallop_groups`) finds each slot's longest held prefix exactly, as a
    linear walk of its own LRU and its binary search do, and never holds more than its capacity."""
    blocks = ApproximateBlocks()
    slots = [blocks.add_slot(c) for c in caps]
    for slot, seq in ops:
        blocks.insert(slots[slot], token_chain(seq, 1))
    for slot, cap in evict:  # shrink some slots: their least recent blocks go
        blocks.set_capacity(slots[slot], cap)
        caps[slot] = min(caps[slot], cap)
    keys = token_chain(probe, 1)
    got = {}
    for bits, n in blocks.match_all(keys, mask, gallop_groups=gallop_groups):
        for s in slots:
            if bits >> s & 1:
                assert s not in got
                got[s] = n
    for s, cap in zip(slots, caps, strict=True):
        assert blocks.held(s) <= cap
        lru = blocks._slots[s].lru
        linear = 0
        while linear < len(keys) and keys[linear] in lru:
            linear += 1
        want = linear if mask is None or mask >> s & 1 else 0
        assert got.get(s, 0) == want
        assert blocks.matched(s, keys) == linear
        # prefix closure: a held block's parent is held
        for seq_slot, seq in ops:
            if seq_slot == slots.index(s):
                chain = token_chain(seq, 1)
                held = [k in lru for k in chain]
                assert held == sorted(held, reverse=True)


def test_lru_evicts_the_least_recent_and_a_prefix_after_what_extends_it() -> None:
    blocks = ApproximateBlocks()
    s = blocks.add_slot(3)
    blocks.insert(s, [1, 2, 3])
    blocks.insert(s, [1, 2, 9])  # shares 1, 2: they are the most recent now
    assert blocks.held(s) == 3
    assert blocks.matched(s, [1, 2, 3]) == 2  # 3 was the least recent
    assert blocks.matched(s, [1, 2, 9]) == 3
    blocks.set_capacity(s, 1)
    assert blocks.matched(s, [1, 2, 9]) == 1  # the shared root outlives its extensions
    blocks.drop_slot(s)
    assert blocks.total_blocks == 0


def _index(**kw: object) -> PrefixIndex:
    return PrefixIndex(PrefixSettings(block_tokens=4, chars_per_token=4.0, **kw))  # type: ignore[arg-type]


def test_lookup_reports_cached_tokens_per_endpoint() -> None:
    idx = _index()
    shared = "s" * 64  # four 16-character blocks
    first = idx.keys_of("m", ApiKind.COMPLETION, shared + "x" * 40)
    idx.dispatched(A, first, 26)
    idx.dispatched(B, idx.keys_of("m", ApiKind.COMPLETION, shared[:32]), 8)
    probe = idx.keys_of("m", ApiKind.COMPLETION, shared + "y" * 40)
    hits = idx.lookup(probe, 26)
    assert dict(hits) == {A: 16, B: 8}  # blocks × 16 chars / 4 chars per token
    assert idx.lookup(probe, 10).get_tokens(A) == 10  # never more than the prompt
    # another model shares nothing, however alike the text
    assert not idx.lookup(idx.keys_of("other", ApiKind.COMPLETION, shared), 16)


@pytest.mark.parametrize("chars_per_token", [4.0, 3.7])
def test_many_endpoints_each_holding_its_own_length(chars_per_token: float) -> None:
    """Forty endpoints holding prefixes of one document, some lengths shared (the one-pass scan and
    groups of several endpoints): the lookup answers what each endpoint's own match says."""
    idx = PrefixIndex(PrefixSettings(block_tokens=4, chars_per_token=chars_per_token))
    doc = "".join(chr(ord("a") + i % 26) * 16 for i in range(200))  # 200 blocks
    eids = [EndpointId(f"e{i}") for i in range(40)]
    for i, e in enumerate(eids):
        cut = 16 * (5 * (i // 2) + 1 + i % 3)  # pairs share a length, and some lengths repeat
        idx.dispatched(e, idx.keys_of("m", ApiKind.COMPLETION, doc[:cut]), cut // 4)
    probe = idx.keys_of("m", ApiKind.COMPLETION, doc)
    for prompt_tokens in (800, 100):
        hits = idx.lookup(probe, prompt_tokens)
        assert dict(hits) == {e: idx.cached_on(e, probe, prompt_tokens) for e in eids}
        assert all(0 < t <= prompt_tokens for t in hits.values())


def test_a_conversation_reuses_the_previous_turn_and_its_answer() -> None:
    idx = _index()
    turn1 = [{"role": "system", "content": "be brief " * 8}, {"role": "user", "content": "q1 " * 10}]
    k1 = idx.keys("m", ApiKind.CHAT, {"messages": turn1})
    assert k1 is not None
    idx.dispatched(A, k1, 40)
    idx.finished(A, k1, "answer one " * 10)
    turn2 = [*turn1, {"role": "assistant", "content": "answer one " * 10}, {"role": "user", "content": "q2"}]
    k2 = idx.keys("m", ApiKind.CHAT, {"messages": turn2})
    assert k2 is not None
    text2 = chat_text(turn2)
    cached = idx.lookup(k2, 1000).get_tokens(A)
    # everything up to the new user message is held (to the last full block)
    through_answer = len(chat_text(turn1)) + len("\x1eassistant\x1f") + len("answer one " * 10)
    assert cached == (through_answer // 16) * 4
    assert cached > (len(chat_text(turn1)) // 16) * 4
    assert len(text2) > through_answer


def test_prompts_sent_as_token_ids_are_keyed_by_their_ids() -> None:
    idx = _index()
    ids = list(range(40))
    k = idx.keys("m", ApiKind.COMPLETION, {"prompt": ids})
    assert k is not None
    assert k.tokens_per_block == 4
    idx.dispatched(A, k, 40)
    k2 = idx.keys("m", ApiKind.COMPLETION, {"prompt": [ids[:30] + [99] * 10]})
    assert k2 is not None
    assert idx.lookup(k2, 40).get_tokens(A) == 28  # 7 whole blocks of 4 shared


@pytest.mark.parametrize(
    ("api", "body", "indexed"),
    [
        (ApiKind.COMPLETION, {"prompt": "abc"}, True),
        (ApiKind.COMPLETION, {"prompt": ["abc", "def"]}, False),
        (ApiKind.CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, True),
        (ApiKind.EMBEDDING, {"input": "abc"}, False),
    ],
    ids=["text", "several prompts", "chat parts", "embedding"],
)
def test_which_prompts_are_indexed(api: ApiKind, body: dict[str, object], indexed: bool) -> None:
    assert (prompt_of(api, body) is not None) is indexed


def test_the_index_is_sized_from_the_kv_capacity() -> None:
    idx = _index(index_tokens=400)
    idx.dispatched(A, idx.keys_of("m", ApiKind.COMPLETION, "z" * 16 * 200), 800)
    stats = idx.stats(A)
    assert stats is not None
    assert stats.capacity_blocks == 100
    assert stats.cached_blocks == 100
    idx.set_capacity(A, 40.0)  # scraped: 40 tokens
    stats = idx.stats(A)
    assert stats is not None
    assert stats.capacity_blocks == stats.cached_blocks == 10
    idx.keep([B])
    assert idx.stats(A) is None


class FakePrecise:
    """A precise source's holder: the engine's blocks keyed by berth's chain over token ids."""

    def __init__(self, keys: Sequence[int], size: int) -> None:
        self._keys = set(keys)
        self._size = size

    @property
    def block_tokens(self) -> int:
        return self._size

    def matched(self, keys: Sequence[int]) -> int:
        n = 0
        while n < len(keys) and keys[n] in self._keys:
            n += 1
        return n

    def cached_blocks(self) -> int:
        return len(self._keys)


@pytest.mark.parametrize(("source", "precise"), [("auto", True), ("precise", True), ("approximate", False)])
def test_a_precise_holder_answers_for_its_endpoint(source: str, precise: bool) -> None:
    idx = _index(source=source)
    ids = list(range(64))
    holder: BlockHolder = FakePrecise(token_chain(ids[:32], 16), 16)
    idx.attach(A, holder)
    idx.set_lag(A, 0.02)
    k = idx.keys("m", ApiKind.COMPLETION, {"prompt": ids})
    assert k is not None
    idx.dispatched(A, k, 64)  # the approximate source would say all 64
    got = idx.lookup(k, 64).get_tokens(A)
    assert got == (32 if precise else 64)
    stats = idx.stats(A)
    assert stats is not None
    assert stats.source == ("precise" if precise else "approximate")
    assert stats.event_lag_s == 0.02
    idx.attach(A, None)  # its events stopped: the approximate source again, visibly
    assert idx.source(A) == "approximate"


def test_engine_counters_give_the_measured_hit_rate_and_the_correction() -> None:
    idx = _index()
    k = idx.keys_of("m", ApiKind.COMPLETION, "q" * 4000)  # 250 blocks of 16 characters, 4 tokens each
    assert idx.dispatched(A, k, 1000) == 0  # nothing held before
    idx.observe_engine(A, hits=0.0, queries=0.0)
    assert idx.dispatched(A, k, 1000) == 1000  # all of it held now (the index's own prediction)
    idx.observe_engine(A, hits=500.0, queries=1000.0)  # the engine hit half of what was predicted
    stats = idx.stats(A)
    assert stats is not None
    assert stats.engine_hit_rate == pytest.approx(0.5)
    assert stats.predicted_hit_rate == pytest.approx(0.5)  # 1000 of 2000 cumulative
    assert idx.correction(A) == pytest.approx(0.5)
    # the approximate answer is scaled by a correction below 1; the bookkeeping stays uncorrected
    assert idx.lookup(k, 1000).get_tokens(A) == 500
    assert idx.dispatched(A, k, 1000) == 1000
    idx.observe_engine(A, hit_rate=0.7)  # SGLang's gauge, against all of the last 1000 predicted
    assert idx.correction(A) == pytest.approx(0.7)
    assert idx.stats(A).engine_hit_rate == pytest.approx(0.7)  # type: ignore[union-attr]
    idx.observe_engine(A, hit_rate=0.9)  # nothing predicted since: no new correction
    assert idx.correction(A) == pytest.approx(0.7)


def test_an_engine_that_caches_nothing_is_credited_with_nothing() -> None:
    idx = _index()
    k = idx.keys_of("m", ApiKind.COMPLETION, "q" * 4000)
    idx.observe_engine(A, hits=0.0, queries=0.0)
    idx.dispatched(A, k, 1000)
    idx.dispatched(A, k, 1000)
    idx.observe_engine(A, hits=0.0, queries=2000.0)  # prefix caching off in the engine
    assert idx.correction(A) == 0.0
    assert not idx.lookup(k, 1000)


def test_off_indexes_nothing() -> None:
    idx = _index(source="off")
    assert idx.keys("m", ApiKind.COMPLETION, {"prompt": "x" * 100}) is None
    assert not idx.lookup(None, 10)


def test_an_engine_restart_empties_its_approximate_index() -> None:
    idx = _index()
    k = idx.keys_of("m", ApiKind.COMPLETION, "q" * 400)
    idx.dispatched(A, k, 100)
    idx.observe_engine(A, hits=500.0, queries=1000.0)
    assert idx.lookup(k, 100).get_tokens(A) == 100
    idx.observe_engine(A, hits=0.0, queries=10.0)  # the counters went back: a new engine process
    assert idx.lookup(k, 100).get_tokens(A) == 0


@pytest.mark.parametrize(
    ("obj", "text"),
    [
        ({"choices": [{"message": {"role": "assistant", "content": "hi"}}]}, "hi"),
        ({"choices": [{"text": "hello"}]}, "hello"),
        ({"choices": [{"text": "a"}, {"text": "b"}]}, None),
        ({"choices": [{"message": {"content": None, "tool_calls": []}}]}, None),
        ({"error": "x"}, None),
    ],
    ids=["chat", "completion", "several choices", "no text", "no choices"],
)
def test_the_answer_of_a_whole_response(obj: dict[str, object], text: str | None) -> None:
    assert answer_of(obj) == text
