"""``chat``: multi-turn conversations that resend the conversation so far, under shared system prompts.

An arrival starts a conversation (a task of one chat call per turn, model slot 0, report class
``chat``). It belongs to one of ``--apps`` applications (default 4, uniform), each with a system
prompt of its own of ``--system-tokens`` (default U[500, 2000]) tokens, shared by all its conversations.
A conversation has ``--turns`` turns (default U[2, 8]); turn ``k``'s prompt is the system prompt, then
every earlier turn's user message and answer, then the new user message: it extends turn ``k − 1``'s
rendered prompt, so the whole earlier turn is a cached prefix for an engine that kept it. The user
messages and answers have ShareGPT-like lengths (`sharegpt`); an answer sent back is the text the
engine simulator answers (``" tok"`` a token, `prompt.answer`), the output length pinned, so on the
simulator the resent answer is exactly the text the engine generated. A real engine answers other
words: there only the prompts' blocks are reusable, not the answers'.

Between an answer and the next turn the user thinks for an exponential time of mean ``--think-time``
seconds (default 5; 0: none); a failed turn ends the conversation. ``--sessions N`` runs N
conversations, started by the arrival process at N / duration a second, instead of ``--rate``.
SLO per request: TTFT 2 s, ATGT 100 ms (as ``sharegpt-like``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.options import WorkloadOptions
from loadgen.workloads.prompt import Message, Prompt, Span, answer
from loadgen.workloads.sharegpt import sharegpt_output, sharegpt_prompt

TURNS: Final = (2, 8)
THINK_TIME_S: Final = 5.0
APPS: Final = 4
SYSTEM_TOKENS: Final = (500, 2000)
SLO: Final = Slo(ttft_ms=2000.0, atgt_ms=100.0)
#: How much longer than the run's duration the arrival process may run to start `--sessions` conversations.
_SESSION_HORIZON: Final = 10.0


class ChatWorkload:
    def __init__(self, options: WorkloadOptions | None = None, *, variant: str | None = None) -> None:
        if variant:
            raise ValueError(f"chat has no variants (got {variant!r}): its options set it up")
        opts = options or WorkloadOptions()
        self.turns = opts.turns or TURNS
        self.think_time_s = THINK_TIME_S if opts.think_time_s is None else opts.think_time_s
        self.apps = opts.apps or APPS
        self.system_tokens = opts.system_tokens or SYSTEM_TOKENS
        self.sessions = opts.sessions
        self.name = "chat"

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        if self.sessions is not None:
            if duration_s <= 0:
                raise ValueError("chat: --sessions needs a duration > 0")
            n = self.sessions
            starts = arrivals(n / duration_s, duration_s * _SESSION_HORIZON)[:n]
        else:
            starts = arrivals(rate, duration_s)
        space = f"chat{rng.getrandbits(32)}"
        systems = [
            Message("system", (Span(space + "/system", app, rng.randint(*self.system_tokens)),))
            for app in range(self.apps)
        ]
        tasks: list[TaskSpec] = []
        said = 0  # user messages so far: each one's text is its own
        for i, at in enumerate(starts):
            messages = [systems[rng.randrange(self.apps)]]
            calls: list[CallSpec] = []
            for turn in range(rng.randint(*self.turns)):
                messages.append(Message("user", (Span(space + "/user", said, sharegpt_prompt(rng)),)))
                said += 1
                prompt = Prompt(tuple(messages))
                out = sharegpt_output(rng)
                think = rng.expovariate(1.0 / self.think_time_s) if turn and self.think_time_s > 0 else 0.0
                calls.append(
                    CallSpec(
                        prompt.tokens("chat"), out, cls="chat", slo=SLO, prompt=prompt, gap_before_s=think
                    )
                )
                messages.append(Message("assistant", (answer(out),)))
            tasks.append(TaskSpec(i, at, "chat", tuple(calls)))
        return tasks
