"""What a call's prompt says: messages made of named spans of text, so that workloads can share prefixes.

A `Span` names a piece of text, ``(space, key, tokens)``: equal names give equal text, a shorter span of
a name is a prefix of a longer one, and different keys give different text (`loadgen.prompts`). A span
of the space `ANSWER` is the text the engine simulator answers (``" tok"`` a token), the stand-in for a
model's answer that a conversation sends back. A `Prompt` is a list of messages (role and spans):

- the chat API sends each message as it is; the simulator renders them as ``<|role|>\\n{content}\\n``
  each, then ``<|assistant|>\\n`` (`rendered`), and counts ``ceil(len / 4)`` tokens;
- the completions API sends the spans of every message joined (roles unused), one token a word, so a
  span starting at a multiple of `b` tokens starts a block of `b` tokens there.

A prompt whose messages extend another's (same messages, then more; or the same last message with
more spans) renders to a text that extends the other's: the engine, a token index and a text index
see the shared prefix alike.

A call without a prompt (the workloads without a prefix structure) sends `prompt_text` named by its
salt (`call_salt`): text of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from loadgen.engine_sim.tokens import GENERATION_PROMPT, TOKEN_TEXT, render_chat
from loadgen.prompts import CHAT_TEMPLATE_TOKENS, MAX_KEY, PLAIN_SPACE, span_text

Role = Literal["system", "user", "assistant"]
ApiName = Literal["chat", "completion"]
#: The space of answer stand-ins: `tokens` times the simulator's answer token, whatever the key.
ANSWER: Final = "answer"


@dataclass(frozen=True, slots=True)
class Span:
    space: str
    key: int
    tokens: int

    def text(self) -> str:
        if self.space == ANSWER:
            return TOKEN_TEXT * self.tokens
        return span_text(self.space, self.key, self.tokens)


def answer(tokens: int) -> Span:
    """The stand-in for a model's answer of `tokens` tokens: what the engine simulator streams."""
    return Span(ANSWER, 0, tokens)


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    spans: tuple[Span, ...]

    def text(self) -> str:
        return "".join(s.text() for s in self.spans)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.spans)


def _template_chars(role: str) -> int:
    return len(f"<|{role}|>\n") + 1  # the header, and the newline after the content


@dataclass(frozen=True, slots=True)
class Prompt:
    messages: tuple[Message, ...]

    @property
    def content_tokens(self) -> int:
        """The words of all spans: the prompt's tokens on the completions API."""
        return sum(m.tokens for m in self.messages)

    def tokens(self, api: ApiName) -> int:
        """The prompt's tokens on the engine simulator (exact), by API."""
        if api == "completion":
            return max(1, self.content_tokens)
        chars = sum(_template_chars(m.role) + 4 * m.tokens for m in self.messages)
        return max(1, math.ceil((chars + len(GENERATION_PROMPT)) / 4))

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def completion_text(self) -> str:
        return "".join(m.text() for m in self.messages)

    def rendered(self, api: ApiName) -> str:
        """The text the engine simulator tokenizes: the completion prompt, or the rendered chat."""
        if api == "completion":
            return self.completion_text()
        return render_chat(self.chat_messages())  # the simulator's chat template (engine_sim.tokens)


def call_salt(task_index: int, call_index: int, seed: int) -> int:
    """The salt of a call without a prompt: one per call of a run (a task has fewer than 8 calls)."""
    return task_index * 8 + call_index + seed * 7919


def plain_prompt(prompt_tokens: int, api: ApiName, salt: int) -> Prompt:
    """The prompt of a call without a prefix structure: one user message of text of its own, sized so
    that the simulator counts `prompt_tokens` (the chat template's tokens taken off)."""
    words = prompt_tokens - CHAT_TEMPLATE_TOKENS if api == "chat" else prompt_tokens
    return Prompt((Message("user", (Span(PLAIN_SPACE, salt % (MAX_KEY + 1), max(1, words)),)),))


def plain_text(prompt_tokens: int, api: ApiName, salt: int) -> str:
    """The text of `plain_prompt`'s one message (its `completion_text`), without making the prompt."""
    words = prompt_tokens - CHAT_TEMPLATE_TOKENS if api == "chat" else prompt_tokens
    return span_text(PLAIN_SPACE, salt % (MAX_KEY + 1), max(1, words))
