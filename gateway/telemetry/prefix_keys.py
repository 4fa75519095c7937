"""A request's prompt as the prefix index keys it: computed once per request, matched against every
endpoint.

The *approximate* source keys the prompt's text in blocks of `block_chars` characters
(`gateway.core.blockhash.text_chain`), rooted at the model (two models never share a block), or, for a
prompt sent as token ids, its ids in blocks of `block_tokens` (`token_chain`). A chat's text is its
messages in order, each as ``RS role US content`` (ASCII record and unit separators), so the next turn of
a conversation, which resends the messages and the answer, starts with this turn's text and the answer:
`extended` chains the answer on, and the index holds it for the next turn (multi-turn reuse).

The *precise* source needs the engine's token ids (`token_keys`: berth's chain over them, in the engine's
block size); a text prompt has them only when they were counted through the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from gateway.core.blockhash import token_chain
from gateway.core.types import ApiKind

_RS: Final = "\x1e"
_US: Final = "\x1f"


def model_root(model: str) -> int:
    """The parent key of a model's first blocks (stable within one process)."""
    return hash(("berth.prefix", model))


def chat_text(messages: Sequence[Any]) -> str:
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(
                p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
            )
        parts.append(f"{_RS}{m.get('role', '')}{_US}{content if isinstance(content, str) else ''}")
    return "".join(parts)


def answer_suffix(api: ApiKind, answer: str) -> str:
    """What a conversation's next prompt adds after this one's text for the answer `answer`."""
    return f"{_RS}assistant{_US}{answer}" if api is ApiKind.CHAT else answer


def answer_of(obj: Mapping[str, Any]) -> str | None:
    """The generated text of a whole (not streamed) answer: its first choice's message content (chat) or
    text (completions); None when there is none, or several choices (which would the next turn send?)."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
        return None
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
    return text if isinstance(text, str) else None


def prompt_of(api: ApiKind, body: Mapping[str, Any]) -> str | list[int] | None:
    """The prompt the index keys: its text, its token ids, or None (not indexed: embeddings, a batch of
    several prompts)."""
    if api is ApiKind.CHAT:
        messages = body.get("messages")
        return chat_text(messages) if isinstance(messages, list) else None
    if api is not ApiKind.COMPLETION:
        return None
    p = body.get("prompt")
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p:
        if len(p) == 1:
            p = p[0]
            if isinstance(p, str):
                return p
        if isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return p
    return None


class PromptKeys:
    """One request's keys. `keys`: the approximate source's; `tail`: the text after the last full
    block (None for token ids: an answer cannot be chained onto ids); `tokens_per_block`: exact for
    token ids, None for text (the index converts with the model's characters per token)."""

    __slots__ = (
        "_by_size",
        "api",
        "block_chars",
        "keys",
        "model",
        "root",
        "tail",
        "token_ids",
        "tokens_per_block",
    )

    def __init__(
        self,
        model: str,
        api: ApiKind,
        keys: list[int],
        *,
        root: int,
        block_chars: int,
        tail: str | None,
        token_ids: Sequence[int] | None = None,
        tokens_per_block: int | None = None,
    ) -> None:
        self.model = model
        self.api = api
        self.keys = keys
        self.root = root
        self.block_chars = block_chars
        self.tail = tail
        self.token_ids = token_ids
        self.tokens_per_block = tokens_per_block
        self._by_size: dict[int, list[int]] = {}

    def token_keys(self, block_size: int) -> list[int] | None:
        """berth's chain over the prompt's token ids in blocks of `block_size` (the precise source's
        keys), computed once per block size; None without token ids."""
        if self.token_ids is None:
            return None
        got = self._by_size.get(block_size)
        if got is None:
            got = self._by_size[block_size] = token_chain(self.token_ids, block_size)
        return got

    def with_token_ids(self, token_ids: Sequence[int]) -> None:
        """The engine's token ids of a text prompt (counted through the engine): the precise source can
        match it."""
        self.token_ids = token_ids
        self._by_size.clear()
