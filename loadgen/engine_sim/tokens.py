"""The simulated engines' tokenizer: deterministic, no vocabulary file, and consistent with the token count
the simulator has always used (``ceil(characters / 4)``).

- **Text**: every 4-character chunk is one token, the last chunk may be shorter. A chunk of ASCII
  characters gets a reversible id (7 bits per character and the chunk length in bits 28-29, so every id is
  below 2**30); any other chunk gets ``2**30 + crc32(utf-8) mod 2**30`` (not reversible: it detokenizes to
  U+FFFD). Equal text gives equal ids in every process; the prompt text of `loadgen.prompts` (3-letter
  words and a space) is one token per word.
- **Chat**: the messages are rendered as ``"<|{role}|>\\n{content}\\n"`` each (text parts joined with no
  separator), then the generation prompt ``"<|assistant|>\\n"`` (unless ``add_generation_prompt`` is false
  or ``continue_final_message`` is true, which also leaves the last message open: no trailing newline),
  and the rendered text is tokenized as above, markers included.
- **Token ids** sent by the client (completions ``prompt: [ids]``) are the prompt as they are.

The one generated token, the text ``" tok"``, has the id `GENERATED_TOKEN_ID`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

TokenIds = npt.NDArray[np.int64]

CHARS_PER_TOKEN: Final = 4
GENERATION_PROMPT: Final = "<|assistant|>\n"
TOKEN_TEXT: Final = " tok"
_HASHED: Final = 1 << 30


def count_text(text: str) -> int:
    """The token count of `text` (at least 1, as an empty prompt still costs the engine a token)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def encode(text: str) -> TokenIds:
    """The token ids of `text`: one per 4 characters (see the module doc)."""
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        return np.array([_chunk_id(text[i : i + 4]) for i in range(0, len(text), 4)], dtype=np.int64)
    n = len(raw)
    full = n // 4
    # four ASCII bytes, little-endian, packed to 7 bits each (bit 7 of every byte is 0)
    u = np.frombuffer(raw, dtype="<u4", count=full)
    packed = (u & 0x7F) | ((u >> 1) & 0x3F80) | ((u >> 2) & 0x1FC000) | ((u >> 3) & 0xFE00000) | (3 << 28)
    ids: TokenIds = packed.astype(np.int64)
    if n % 4:
        ids = np.append(ids, _chunk_id(text[full * 4 :]))
    return ids


def _chunk_id(chunk: str) -> int:
    if chunk.isascii():
        value = (len(chunk) - 1) << 28
        for i, ch in enumerate(chunk):
            value |= ord(ch) << (7 * i)
        return value
    return _HASHED + (zlib.crc32(chunk.encode("utf-8")) % _HASHED)


def decode(ids: Iterable[int]) -> str:
    """The text of `ids` (ids of non-ASCII chunks and ids this tokenizer never makes read as U+FFFD)."""
    parts: list[str] = []
    for token in ids:
        if 0 <= token < _HASHED:
            length = (token >> 28) + 1
            parts.append("".join(chr((token >> (7 * i)) & 127) for i in range(length)))
        else:
            parts.append("\ufffd")
    return "".join(parts)


GENERATED_TOKEN_ID: Final = _chunk_id(TOKEN_TEXT)


def render_chat(
    messages: Sequence[Any], *, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """The prompt text of chat `messages` (already validated: dicts with a string role)."""
    parts: list[str] = []
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            text = "".join(
                p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and "text" in p
            )
        open_end = continue_final_message and i == last
        parts.append(f"<|{msg['role']}|>\n{text}" if open_end else f"<|{msg['role']}|>\n{text}\n")
    if add_generation_prompt and not continue_final_message:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def as_token_ids(values: Sequence[Any]) -> TokenIds | None:
    """`values` as token ids when it is a non-empty list of non-negative ints, else None."""
    if not values or not all(type(t) is int and t >= 0 for t in values):
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None
