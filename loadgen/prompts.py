"""Prompt text of a requested length, cheap to build and distinct per request.

The text is made of 3-letter words each followed by a space (4 characters), which most BPE tokenizers
count as about one token each and the engine simulator counts as exactly one (ceil(chars / 4)). Prompts
are slices of one long seeded text starting at a per-request offset, so two requests rarely share a
prefix (real engines' prefix caches would otherwise flatter the measurements).

Chat prompts are shortened by `CHAT_TEMPLATE_TOKENS`, the tokens the simulator's chat template adds
(``<|user|>``/``<|assistant|>`` markers), so a chat request's prompt_tokens matches the request's target
on the simulator; real engines' templates add a similar handful.
"""

from __future__ import annotations

import random

_WORDS_TEXT = (
    "the and for are but not you all any can had her was one our out day get has him his how man new now old "
    "see two way who boy did its let put say she too use art bed box car cat cup dog ear egg end eye fan far "
    "fit fly fun gas hat ice job key kit lab law leg lid map mix net oil pan pen pet pie pin pot ray red rod "
    "row run sea sky sun tab tea tip top toy van war wax web win yes zip"
)
_WORDS = _WORDS_TEXT.split()
_TEXT_WORDS = 16384
_TEXT = "".join(w + " " for w in random.Random(20240601).choices(_WORDS, k=_TEXT_WORDS))
CHAT_TEMPLATE_TOKENS = 6


def prompt_text(tokens: int, salt: int) -> str:
    """About `tokens` tokens of text; `salt` picks where in the long text it starts."""
    tokens = max(1, tokens)
    start = (salt * 2654435761) % (_TEXT_WORDS // 2)
    if start + tokens <= _TEXT_WORDS:
        return _TEXT[4 * start : 4 * (start + tokens)]
    reps = tokens // _TEXT_WORDS + 2
    return (_TEXT * reps)[4 * start : 4 * (start + tokens)]
