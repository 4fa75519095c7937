"""berth's block keys: chained, full blocks only, equal prefixes give equal keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import blockhash
from gateway.core.blockhash import ROOT, text_chain, token_chain


@given(
    st.lists(st.integers(0, 50_000), max_size=80),
    st.lists(st.integers(0, 50_000), max_size=80),
    st.integers(1, 9),
)
def test_keys_agree_exactly_on_the_shared_full_blocks(a: list[int], b: list[int], bs: int) -> None:
    ka, kb = token_chain(a, bs), token_chain(b, bs)
    assert len(ka) == len(a) // bs
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    same = sum(1 for x, y in zip(ka, kb, strict=False) if x == y)
    # keys are equal on the shared full blocks and (a collision aside) differ from the first other one
    assert ka[: shared // bs] == kb[: shared // bs]
    assert same == min(shared // bs, len(ka), len(kb))


def test_a_key_depends_on_its_parent() -> None:
    block = [1, 2, 3, 4]
    assert token_chain(block, 4) == token_chain(block, 4, ROOT)
    assert token_chain(block, 4, parent=7) != token_chain(block, 4)
    # the second block's key is the first block's key chained with its own content
    two = token_chain([*block, *block], 4)
    assert two[1] == token_chain(block, 4, parent=two[0])[0]
    assert two[0] != two[1]


def test_text_blocks_are_keyed_like_token_blocks() -> None:
    text = "abc " * 40
    keys = text_chain(text, 16)
    assert len(keys) == 10
    assert text_chain(text + "xyz", 16) == keys  # a partial block has no key
    assert text_chain("zzz " + text[4:], 16)[1:] != keys[1:]  # a change before a block changes its key


def test_a_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        token_chain([1], 0)
    with pytest.raises(ValueError, match="positive"):
        text_chain("a", 0)


def _sliced_chain(token_ids: list[int], block_size: int, parent: int) -> list[int]:
    """The chain as first written (a tuple of the ids, sliced per block): the keys must not change."""
    ids = tuple(token_ids)
    keys: list[int] = []
    key = parent
    for start in range(0, len(ids) - block_size + 1, block_size):
        key = hash((key, ids[start : start + block_size]))
        keys.append(key)
    return keys


@given(
    st.lists(st.integers(0, 1 << 40), max_size=120),
    st.integers(1, 17),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.lists(st.integers(0, 8), max_size=6),
)
def test_the_keys_are_the_same_however_the_ids_arrive(
    ids: list[int], bs: int, parent: int, cuts: list[int]
) -> None:
    """A list, a tuple, or blocks a few at a time chained to the previous piece's last key (as KV events
    report them: `parent_block_hash` and the new blocks' token ids) give the same keys, the keys of
    the chain as first written."""
    whole = token_chain(ids, bs, parent)
    assert whole == _sliced_chain(ids, bs, parent)
    assert token_chain(tuple(ids), bs, parent) == whole
    pieces: list[int] = []
    start, last = 0, parent
    for c in [*cuts, len(ids)]:  # pieces of whole blocks
        end = min(len(ids) // bs * bs, start + c * bs) if c != len(ids) else len(ids) // bs * bs
        more = token_chain(ids[start:end], bs, last)
        pieces += more
        last = more[-1] if more else last
        start = end
    assert pieces == whole


def _sliced_text_chain(text: str, block_chars: int, parent: int) -> list[int]:
    keys: list[int] = []
    key = parent
    for start in range(0, len(text) - block_chars + 1, block_chars):
        key = hash((key, text[start : start + block_chars]))
        keys.append(key)
    return keys


@given(
    st.text(alphabet="ab é€\U0001f600", max_size=400), st.integers(1, 70), st.integers(-(1 << 63), 1 << 63)
)
def test_text_keys_are_the_chain_as_first_written(text: str, block_chars: int, parent: int) -> None:
    """The slices kept per block size change nothing: the keys are those of slicing block by block."""
    assert text_chain(text, block_chars, parent) == _sliced_text_chain(text, block_chars, parent)


def test_text_keys_past_the_slices_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt longer than the slices kept for its block size is keyed on by slicing, the same way."""
    monkeypatch.setattr(blockhash, "_SLICES_MAX", 3)
    monkeypatch.setattr(blockhash, "_slices", {})
    text = "abcdefghij" * 7
    for size in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10):  # more sizes than are kept: the cache starts afresh
        assert text_chain(text, size, 11) == _sliced_text_chain(text, size, 11)
    assert len(blockhash._slices) <= blockhash._SLICE_SIZES_MAX
