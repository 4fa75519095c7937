"""Resuming a preempted request: which requests can be continued faithfully, and the engine call that
continues one where it stopped.

A request preempted after some tokens is re-issued so that the engine goes on from the text the client
already has:
- completions: the prompt becomes `prompt + produced text`;
- chat: the produced text becomes a final assistant message that the engine continues rather than answers
  (vLLM: `continue_final_message: true` with `add_generation_prompt: false`, which vLLM requires together;
  SGLang: `continue_final_message: true`, its chat route renders the final assistant message as a prefill);
- `max_tokens` / `max_completion_tokens` shrink by the tokens produced, `min_tokens` too.

The produced text is re-tokenized by the engine, so the continuation sees the same text but not always
the same token ids. Where the produced text joins the prompt, a BPE merge across the join would change
the prompt's last tokens: measured on the engine tier's tiny byte-level BPE model, a completion resumed
as `prompt + produced text` diverged from the uninterrupted greedy run right at the cut, while a chat
(whose produced text is a message of its own) continued token for token. So a completion is resumed
with token ids when the engine's tokenize route answers: the original prompt and the produced text
tokenized apart and joined (`prompt_ids`), which keeps the prompt's tokens exactly. The produced text
alone can still tokenize differently from the tokens sampled (a model may sample a non-canonical
split); that case continues from the canonical split of the same text. Penalties that count output
tokens (presence, frequency) see the produced text as prompt after a resume.

Only requests whose continuation is the same kind of answer may be preempted (`resumable`): one choice,
no log probabilities (they would be missing for the produced part), no echo, no suffix, no tools or
structured output (a grammar or a tool call cannot be continued from the middle), a completion prompt
that is one string, and a chat that does not already continue a final message. A non-streamed request
is resumable only when berth streams it from the engine on the client's behalf (it does for batch
requests under a policy that preempts), since an answer in one piece shows nothing until it is whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from gateway.core.types import ApiKind

# Fields whose presence (with a value other than these "off" values) makes a request unresumable.
_BLOCKING: Final[dict[str, tuple[object, ...]]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "prompt_logprobs": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "use_beam_search": (None, False),
    "continue_final_message": (None, False),
    "add_generation_prompt": (None, True),
}
_TEXT_FORMATS: Final = (None, {"type": "text"})


def resumable(api: ApiKind, body: Mapping[str, Any]) -> bool:
    """Whether the request can be continued elsewhere without the client noticing (streamed, or
    streamed from the engine by berth and answered as one response: `gateway.dispatch.runner`)."""
    if api not in (ApiKind.COMPLETION, ApiKind.CHAT):
        return False
    for key, off in _BLOCKING.items():
        value = body.get(key)
        if value is not None and not _is_off(value, off):
            return False
    if not _is_off(body.get("response_format"), _TEXT_FORMATS):
        return False
    if api is ApiKind.COMPLETION:
        return isinstance(body.get("prompt"), str)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    return isinstance(last, dict) and last.get("role") != "assistant"


def _is_off(value: object, off: tuple[object, ...]) -> bool:
    # By type as well as value: `logprobs: 0` asks completions for log probabilities, though 0 == False.
    return any(value is o or (type(value) is type(o) and value == o) for o in off)


def resume_body(
    api: ApiKind,
    body: Mapping[str, Any],
    produced_text: str,
    produced_tokens: int,
    *,
    continue_fields: Mapping[str, Any],
    prompt_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The engine call that continues `body` after `produced_text` (`produced_tokens` tokens) was
    streamed. `continue_fields`: the engine's fields that make a chat continue its final assistant
    message (`gateway.upstream.dialects.Dialect.continue_chat`). `prompt_ids`: a completion's prompt
    and produced text as token ids, each tokenized on its own (see the module's note), sent instead of
    the joined text when known."""
    out = dict(body)
    if produced_text:
        if api is ApiKind.COMPLETION:
            out["prompt"] = list(prompt_ids) if prompt_ids else str(body["prompt"]) + produced_text
        else:
            out["messages"] = [*body["messages"], {"role": "assistant", "content": produced_text}]
            out.update(continue_fields)
    if produced_tokens:
        for key in ("max_tokens", "max_completion_tokens"):
            limit = body.get(key)
            if isinstance(limit, int) and not isinstance(limit, bool):
                out[key] = max(1, limit - produced_tokens)
        floor = body.get("min_tokens")
        if isinstance(floor, int) and not isinstance(floor, bool) and floor > 0:
            out["min_tokens"] = max(0, floor - produced_tokens)
    return out
