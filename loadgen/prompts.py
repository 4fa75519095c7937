"""Prompt text of a requested length, cheap to build, deterministic, and distinct where it should be.

The text is made of 3-letter words each followed by a space (4 characters), which most BPE tokenizers
count as about one token each and the engine simulator counts as exactly one (ceil(chars / 4)).

`span_text(space, key, n)` is the text named by ``(space, key)``: its first `HEADER_WORDS` words spell
the key (in base 95, offset by a pattern drawn from the space), the rest is a slice of one long seeded
text starting at an offset drawn from the key. So
- equal names give equal text, and a shorter span of a name is a prefix of a longer one;
- two different keys of one space differ within their first `HEADER_WORDS` words (any key in
  [0, 95**10), which holds every 64-bit unsigned integer); two spaces differ with probability 1 − 95^-10;
- building a span is two slices and a join, whatever its length.

`prompt_text(tokens, salt)` is the prompt of a request without a prefix structure: the span named by its
salt, so two requests of a run (distinct salts) share no prefix of more than a few words, which keeps
real engines' prefix caches from flattering measurements.

Chat prompts are shortened by `CHAT_TEMPLATE_TOKENS`, the tokens the simulator's chat template adds
(``<|user|>``/``<|assistant|>`` markers), so a chat request's prompt_tokens matches the request's target
on the simulator; real engines' templates add a similar handful.
"""

from __future__ import annotations

import functools
import hashlib
import random
from typing import Final

_WORDS_TEXT = (
    "the and for are but not you all any can had her was one our out day get has him his how man new now old "
    "see two way who boy did its let put say she too use art bed box car cat cup dog ear egg end eye fan far "
    "fit fly fun gas hat ice job key kit lab law leg lid map mix net oil pan pen pet pie pin pot ray red rod "
    "row run sea sky sun tab tea tip top toy van war wax web win yes zip"
)
_WORDS = _WORDS_TEXT.split()
_BASE: Final = len(_WORDS)  # 95
_TEXT_WORDS = 16384
_TEXT = "".join(w + " " for w in random.Random(20240601).choices(_WORDS, k=_TEXT_WORDS))
CHAT_TEMPLATE_TOKENS = 6
#: Words at the head of a span that spell its key: keys below 95**10 (> 2**64) are told apart.
HEADER_WORDS: Final = 10
MAX_KEY: Final = _BASE**HEADER_WORDS - 1
#: The space of `prompt_text`'s spans.
PLAIN_SPACE: Final = "plain"


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@functools.lru_cache(maxsize=256)
def _pattern(space: str) -> tuple[int, ...]:
    """A space's offsets for the key's digits: the same key spells differently in another space."""
    return tuple(b % _BASE for b in _digest("pattern\0" + space)[:HEADER_WORDS])


@functools.lru_cache(maxsize=256)
def _digit_words(space: str) -> tuple[tuple[str, ...], ...]:
    """Per header position, the word (with its space) each digit of a key spells there in `space`: the
    word `(digit + offset) % _BASE` of the position's offset (`_pattern`)."""
    return tuple(tuple(_WORDS[(d + p) % _BASE] + " " for d in range(_BASE)) for p in _pattern(space))


def _header(space: str, key: int) -> str:
    if not 0 <= key <= MAX_KEY:
        raise ValueError(f"a text key must be in [0, {MAX_KEY}], got {key}")
    words = []
    for table in _digit_words(space):
        key, digit = divmod(key, _BASE)
        words.append(table[digit])
    return "".join(words)


def _body(space: str, key: int, n: int) -> str:
    """`n` words of the long text from an offset drawn from the name."""
    start = int.from_bytes(_digest(f"{space}\0{key}")[:8], "little") % (_TEXT_WORDS // 2)
    if start + n <= _TEXT_WORDS:
        return _TEXT[4 * start : 4 * (start + n)]
    reps = n // _TEXT_WORDS + 2
    return (_TEXT * reps)[4 * start : 4 * (start + n)]


def span_text(space: str, key: int, words: int) -> str:
    """The first `words` words (tokens) of the text named ``(space, key)``; 4 characters a word."""
    if words <= 0:
        return ""
    head = _header(space, key)
    if words <= HEADER_WORDS:
        return head[: 4 * words]
    return head + _body(space, key, words - HEADER_WORDS)


def prompt_text(tokens: int, salt: int) -> str:
    """`tokens` tokens of text (at least 1) of its own: `salt` names it (a non-negative integer)."""
    return span_text(PLAIN_SPACE, salt % (MAX_KEY + 1), max(1, tokens))
