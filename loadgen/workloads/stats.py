"""The prefix structure of a schedule: the share of its prompt blocks that an earlier request already sent.

Each call's prompt is rendered as the engine simulator tokenizes it (`Prompt.rendered`: the completion
text, or the chat template around the messages), cut into blocks of `block_tokens` tokens (4 characters
a token) and keyed as berth keys blocks (`gateway.core.blockhash.text_chain`: a key covers the block and
everything before it), the chain starting from the call's model (engines of different models share no
cache). Only full blocks count, as engines cache only those. A block is *reusable* when its key was sent
earlier in the run: the share an unbounded cache, shared by the whole fleet, would hit. Calls are taken
in the order they would be sent without waiting for answers: a task's arrival plus its calls' client-side
gaps (a conversation's turns keep their order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.core.blockhash import text_chain
from loadgen.workloads.base import TaskSpec, call_prompt
from loadgen.workloads.prompt import call_salt


@dataclass(frozen=True, slots=True)
class ReuseStats:
    block_tokens: int
    requests: int
    prompt_tokens: int
    blocks: int  # full blocks of all prompts
    reused: int  # of which an earlier request sent the same key

    @property
    def share(self) -> float:
        return self.reused / self.blocks if self.blocks else 0.0


def reusable_share(tasks: Sequence[TaskSpec], *, block_tokens: int, seed: int = 0) -> ReuseStats:
    """The reusable share of the full blocks of `tasks`' prompts (`seed`: the run's, for the salts of
    calls without a prompt of their workload's)."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    order: list[tuple[float, int, int]] = []
    for t in tasks:
        at = t.at_s
        for i, c in enumerate(t.calls):
            at += c.gap_before_s
            order.append((at, t.index, i))
    order.sort()
    by_index = {t.index: t for t in tasks}
    seen: set[int] = set()
    blocks = reused = tokens = 0
    for _, index, i in order:
        call = by_index[index].calls[i]
        text = call_prompt(call, call_salt(index, i, seed)).rendered(call.api)
        root = hash(("model", call.model if call.model is not None else call.model_slot))
        keys = text_chain(text, 4 * block_tokens, parent=root)
        blocks += len(keys)
        reused += sum(1 for k in keys if k in seen)
        seen.update(keys)
        tokens += call.prompt_tokens
    return ReuseStats(block_tokens, len(order), tokens, blocks, reused)


def format_reuse(name: str, rows: Sequence[ReuseStats]) -> str:
    """A table of `reusable_share` results, one row per block size."""
    lines = [f"workload {name}", "block   requests   prompt tok   full blocks   reusable   share"]
    for r in rows:
        lines.append(
            f"{r.block_tokens:5d}   {r.requests:8d}   {r.prompt_tokens:10d}   {r.blocks:11d}   "
            f"{r.reused:8d}   {100 * r.share:4.1f} %"
        )
    return "\n".join(lines)
