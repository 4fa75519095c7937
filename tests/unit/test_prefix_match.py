"""Matching a prompt against every endpoint at once: the galloping search and the one-pass scan of
`ApproximateBlocks.match_lists`, and the index's lookup built on it, pinned on random index states to a
reference (the first version of the search, kept here as it was) and to each endpoint's own match."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, compress, islice, repeat
from operator import and_, is_not, xor

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.blockhash import token_chain
from gateway.core.types import ApiKind, EndpointId
from gateway.telemetry.prefix_approx import ApproximateBlocks
from gateway.telemetry.prefix_index import PrefixIndex, PrefixSettings


def reference_match(
    owners: dict[int, int], keys: Sequence[int], mask: int | None, gallop_groups: int
) -> tuple[list[int], list[int]]:
    """`match_lists` as first written: gallop per length, then a scan once the lengths come close."""
    get = owners.get
    n = len(keys)
    sets: list[int] = []
    ends: list[int] = []
    if n == 0:
        return sets, ends
    m = get(keys[0], 0)
    if mask is not None:
        m &= mask
    lo = 0
    while m:
        found = len(ends)
        if found >= gallop_groups and lo < 16 * max(found, 1):
            more_sets, more_ends = _reference_scan(owners, keys, lo + 1, m, nested=mask is None)
            sets += more_sets
            ends += more_ends
            break
        step = 1
        hi = n
        while lo + step < n:
            j = lo + step
            if get(keys[j], 0) & m == m:
                lo = j
                step += step
            else:
                hi = j
                break
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if get(keys[mid], 0) & m == m:
                lo = mid
            else:
                hi = mid
        rest = get(keys[hi], 0) & m if hi < n else 0
        sets.append(m & ~rest)
        ends.append(hi)
        m = rest
        lo = hi
    return sets, ends


def _reference_scan(
    owners: dict[int, int], keys: Sequence[int], start: int, m: int, *, nested: bool
) -> tuple[list[int], list[int]]:
    get = owners.get
    n = len(keys)
    lo, hi = start - 1, n
    step = 1
    while lo + step < n:
        if get(keys[lo + step], 0) & m:
            lo += step
            step += step
        else:
            hi = lo + step
            break
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if get(keys[mid], 0) & m:
            lo = mid
        else:
            hi = mid
    if hi == start:
        return [m], [start]
    vals = tuple(map(get, keys[start:hi], repeat(0)))
    changed = list(map(is_not, vals, islice(vals, 1, None)))
    runs = [m, *compress(vals, changed), vals[-1]]
    if not nested:
        runs = list(accumulate(runs, and_))
    runs.append(0)
    gone = list(map(xor, runs, islice(runs, 1, None)))
    ends = [start, *compress(range(start + 1, hi), changed), hi]
    return list(compress(gone, gone)), list(compress(ends, gone))


def _per_slot(sets: list[int], ends: list[int]) -> dict[int, int]:
    """Each slot's match length from (bitset, length) pairs; a slot must appear at most once."""
    out: dict[int, int] = {}
    for bits, n in zip(sets, ends, strict=True):
        for slot in range(bits.bit_length()):
            if bits >> slot & 1:
                assert slot not in out
                out[slot] = n
    return out


_ops = st.lists(
    st.tuples(st.integers(0, 11), st.lists(st.integers(0, 2), min_size=0, max_size=14)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    ops=_ops,
    caps=st.lists(st.integers(1, 16), min_size=12, max_size=12),
    probe=st.lists(st.integers(0, 2), min_size=0, max_size=16),
    gallop_groups=st.sampled_from([0, 1, 2, 3, 1_000]),
    mask=st.none() | st.integers(0, (1 << 12) - 1),
    prefix=st.lists(st.just(0), max_size=40),
)
def test_the_match_equals_the_reference_match(  # noqa: PLR0917 (hypothesis's arguments)
    ops: list[tuple[int, list[int]]],
    caps: list[int],
    probe: list[int],
    gallop_groups: int,
    mask: int | None,
    prefix: list[int],
) -> None:
    """Twelve slots, prompts over a small alphabet behind a shared prefix of random length (so the first
    match length lies far in, and many slots end close together after it): every slot's match length
    is the reference's, whichever way the search starts (galloping groups, mask)."""
    blocks = ApproximateBlocks()
    slots = [blocks.add_slot(c) for c in caps]
    for slot, seq in ops:
        blocks.insert(slots[slot], token_chain(prefix + seq, 1))
    keys = token_chain(prefix + probe, 1)
    got = blocks.match_lists(keys, mask, gallop_groups=gallop_groups)
    want = reference_match(blocks._owners, keys, mask, gallop_groups)
    assert _per_slot(*got) == _per_slot(*want)
    assert got[1] == sorted(got[1])  # lengths increase
    assert all(got[0])  # no empty set


@settings(max_examples=120, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 3), st.integers(0, 12)), min_size=1, max_size=40
    ),
    probe=st.tuples(st.integers(0, 3), st.integers(0, 12)),
    chars_per_token=st.sampled_from([4.0, 3.7, 1.3]),
    prompt_tokens=st.integers(1, 300),
)
def test_a_lookup_answers_each_endpoints_own_match(
    ops: list[tuple[int, int, int]], probe: tuple[int, int], chars_per_token: float, prompt_tokens: int
) -> None:
    """Eight endpoints sent prefixes of a few documents: the lookup over all endpoints at once reports,
    for each endpoint holding anything of the prompt, what that endpoint's own match says (and leaves
    out the others), whatever the tokens per block and however short the prompt."""
    idx = PrefixIndex(PrefixSettings(block_tokens=4, chars_per_token=chars_per_token))
    docs = ["".join(chr(ord("a") + (d * 7 + i) % 26) * 8 for i in range(40)) for d in range(4)]
    docs = [docs[0][: 8 * 5 * d] + doc for d, doc in enumerate(docs)]  # documents share beginnings
    eids = [EndpointId(f"e{i}") for i in range(8)]
    for e, d, blocks in ops:
        text = docs[d][: blocks * idx.settings.block_chars]
        idx.dispatched(eids[e], idx.keys_of("m", ApiKind.COMPLETION, text), max(1, len(text) // 4))
    d, blocks = probe
    pk = idx.keys_of("m", ApiKind.COMPLETION, docs[d][: blocks * idx.settings.block_chars + 5])
    hits = idx.lookup(pk, prompt_tokens)
    own = {e: idx.cached_on(e, pk, prompt_tokens) for e in eids}
    assert dict(hits) == {e: t for e, t in own.items() if t > 0}
