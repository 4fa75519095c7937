"""berth's own keys for prompt blocks: a chain over each full block's content and its parent's key.

Both sources of the prefix index key blocks this way, so one lookup serves both:
- the *precise* source re-keys every block an engine reports in its KV events (`BlockStored` carries
  the block's `token_ids`) with `token_chain`, and keeps a map from the engine's own hash to berth's key
  for `BlockRemoved` (the engines' hashes are not reproducible: vLLM seeds them per process);
- the *approximate* source keys the request's text in blocks of characters with `text_chain`.

A key depends on every token (or character) before it, as the engines' block hashes do, so two prompts
share the first `k` keys exactly when they share their first `k` full blocks. Only full blocks get a
key: the engines cache only full blocks.

Keys are Python ints from the built-in `hash` of a tuple of ints (or of a (parent, str) pair): the
tuple hash is deterministic across processes for ints; for strings it follows PYTHONHASHSEED, which
is fine for an index that lives in one process. Cost on this kind of machine: about 0.13 µs per text
block and 0.18 µs per block of token ids, so an 8,000-token prompt's 500 keys take some 65 to 95 µs
(`berth-loadgen diag prefix-index`); a request's keys are computed once and reused for every endpoint,
at admission, dispatch and finish. Most of it is CPython's per-block steps (the block's object, two
hashes, the loop), not the hashing itself (`hashlib.blake2b` per block is several times slower; a
library hash would still pay a call and a block object per block). A hash vectorised over the whole
prompt in numpy is faster for long prompts but pays some µs of fixed cost per call, more than a short
chat's keys cost in all, and turning token ids from a list into an array costs more than hashing them
here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

ROOT: Final = 0  # the parent key of a prompt's first block


def token_chain(token_ids: Sequence[int], block_size: int, parent: int = ROOT) -> list[int]:
    """The keys of the full blocks of `token_ids` (blocks of `block_size` tokens), the first chained to
    `parent`. A partial last block has no key."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    keys: list[int] = []
    append = keys.append
    key = parent
    # The blocks as tuples, cut in C: `block_size` references to one iterator, zipped (a partial last
    # block is left out). Cheaper than slicing a tuple of the ids (no copy of them, no slice objects).
    for block in zip(*[iter(token_ids)] * block_size, strict=False):
        key = hash((key, block))
        append(key)
    return keys


def text_chain(text: str, block_chars: int, parent: int = ROOT) -> list[int]:
    """The keys of the full blocks of `text` (blocks of `block_chars` characters), chained as
    `token_chain` does."""
    if block_chars <= 0:
        raise ValueError(f"block_chars must be positive, got {block_chars}")
    n = len(text) // block_chars
    keys: list[int] = []
    append = keys.append
    key = parent
    cut = 0
    if n > _FEW_BLOCKS:
        slices = _block_slices(block_chars, n)
        cut = min(n, len(slices))
        for block in slices[:cut]:  # slice objects made once: no slice built per block
            key = hash((key, text[block]))
            append(key)
    for start in range(cut * block_chars, n * block_chars, block_chars):  # few blocks, or past the slices
        key = hash((key, text[start : start + block_chars]))
        append(key)
    return keys


#: Blocks below which a text is sliced block by block (the kept slices cost a look-up to save ~20 ns a block).
_FEW_BLOCKS: Final = 8
#: Slice objects kept per block size, at most (about 3.7 MB for one size).
_SLICES_MAX: Final = 1 << 16
#: Block sizes whose slices are kept, at most (a configuration has one or two).
_SLICE_SIZES_MAX: Final = 8
_slices: dict[int, list[slice]] = {}


def _block_slices(size: int, n: int) -> list[slice]:
    """The slices of the first blocks of `size` (at least `n` of them, or `_SLICES_MAX`), grown as
    longer prompts come."""
    got = _slices.get(size)
    if got is None or len(got) < min(n, _SLICES_MAX):
        if len(_slices) >= _SLICE_SIZES_MAX:
            _slices.clear()
        m = min(max(n, 2 * len(got or ()), 64), _SLICES_MAX)
        got = _slices[size] = [slice(i, i + size) for i in range(0, m * size, size)]
    return got
