"""``coding``: CATO's coding-assistant tasks (papers/ALGORITHMS.md §1).

| task          | calls (model slot)                  | prompt / output tokens per call    | SLA         |
| ------------- | ----------------------------------- | ---------------------------------- | ----------- |
| completion    | complete (0)                        | U[256, 768] / U[4, 9]              | TTFT 1.2 s  |
| generation    | generate (0), then validate (1)     | U[64, 256] / U[150, 300];          | TTFT 15 s   |
|               |                                     | p1 + o1 + 64 / U[20, 60]           |             |
| summarization | summarize (0)                       | U[1500, 3000] / U[20, 30]          | E2E 4 s     |
| translation   | translate (0), then validate (1)    | U[800, 1500] / U[100, 400];        | E2E 25 s    |
|               |                                     | p1 + o1 / U[20, 40]                |             |

Mixes (select with ``coding:NAME``): ``pattern1`` (default; 40 % completion, 40 % generation, 10 %
translation, 10 % summarization), ``pattern2`` (25 % each), ``ttft-heavy`` (90 % TTFT tasks / 10 % E2E
tasks: 45/45/5/5).

A two-call task's first call goes to model slot 0 and its second to slot 1 (the first and second model
the target lists; the same model when it lists one). Before the first call a task spends 50 ms of
client-side retrieval/analysis, and 20 ms between the calls (validation tooling).

The paper sets each task's SLA to the mean latency measured at moderate load; the values above are sized
for the ``fleet-7b`` simulator preset at speed 1 (scale them with ``--slo-scale``). For a TTFT task the
task latency runs from the task's start to the first token of its last call; for an E2E task, to the end
of its last call. Each call's own SLO is its share of the task SLA, split in proportion to the call's
nominal time (CATO's slack allotment). Every call carries ``x-berth-task-id``, ``x-berth-task-sla-ms``
and its task type as ``x-berth-slo-class`` (the target policy must define those classes:
``policies/coding-assistant.toml`` does); the report class of a call is its task type.

**Repository context** (``--sessions N [--context-tokens LO:HI]``; off by default): N developer
sessions, each keeping one repository context of U[LO, HI] tokens (default 2,000-8,000) for the whole
run (CATO's setting: the assistant resends the repository it works in). A task belongs to a session
drawn uniformly; every one of its calls sends the session's context as the system message, then the
task's own text (its prompt tokens as above) as the user message. The second call of a two-call task
resends the first call's messages and answer (the engine simulator's answer text, see `chat`), then
a user message of 64 tokens (generation) or 16 (translation): with the context, a task's second call
shares the first call's whole prompt. The calls' prompt tokens are then the rendered prompt's (context,
task text and the chat template), their SLO shares allotted from those; the task SLAs stay as above
(scale them with ``--slo-scale``). Without ``--sessions`` every call's text is its own, as before.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from loadgen.workloads.base import CallSpec as _Call
from loadgen.workloads.base import Slo, TaskMix, TaskSpec, allot, pick
from loadgen.workloads.lengths import nominal_e2e_s, nominal_ttft_s, uniform
from loadgen.workloads.options import WorkloadOptions
from loadgen.workloads.prompt import Message, Prompt, Span, answer

MIXES: dict[str, dict[str, float]] = {
    "pattern1": {"completion": 0.40, "generation": 0.40, "translation": 0.10, "summarization": 0.10},
    "pattern2": {"completion": 0.25, "generation": 0.25, "translation": 0.25, "summarization": 0.25},
    "ttft-heavy": {"completion": 0.45, "generation": 0.45, "translation": 0.05, "summarization": 0.05},
}
TASK_SLA_MS: dict[str, float] = {
    "completion": 1200.0,
    "generation": 15000.0,
    "summarization": 4000.0,
    "translation": 25000.0,
}
RETRIEVAL_S = 0.05
VALIDATION_GAP_S = 0.02
CONTEXT_TOKENS: Final = (2000, 8000)
#: The user message of a two-call task's second call, by task type.
FOLLOW_UP_TOKENS: Final = {"generation": 64, "translation": 16}


@dataclass(frozen=True, slots=True)
class _Session:
    """A task's developer session: its repository context, and the space of the task's own text."""

    context: Message
    space: str


class CodingWorkload(TaskMix):
    def __init__(self, mix: str = "pattern1", options: WorkloadOptions | None = None) -> None:
        if mix not in MIXES:
            raise ValueError(f"unknown coding mix {mix!r}; known: {', '.join(MIXES)}")
        opts = options or WorkloadOptions()
        if opts.context_tokens is not None and opts.sessions is None:
            raise ValueError("coding: --context-tokens needs --sessions")
        self.mix = mix
        self.sessions = opts.sessions or 0
        self.context_tokens = opts.context_tokens or CONTEXT_TOKENS
        self.name = f"coding:{mix}"

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        if not self.sessions:
            return super().schedule(rate, duration_s, arrivals, rng)
        space = f"coding{rng.getrandbits(32)}"
        sessions = [
            _Session(Message("system", (Span(space + "/repo", s, rng.randint(*self.context_tokens)),)), space)
            for s in range(self.sessions)
        ]
        return [
            self._make_in_session(rng, i, at, rng.choice(sessions))
            for i, at in enumerate(arrivals(rate, duration_s))
        ]

    def make(self, rng: random.Random, index: int, at_s: float) -> TaskSpec:
        """A task of the mix, each call's text its own."""
        kind = pick(rng, MIXES[self.mix])
        sla = TASK_SLA_MS[kind]
        call = functools.partial(_Call, slo_class=kind)  # every call names its task type as its class
        if kind == "completion":
            p, o = uniform(rng, 256, 768), uniform(rng, 4, 9)
            calls: tuple[_Call, ...] = (
                call(p, o, model_slot=0, cls=kind, slo=Slo(ttft_ms=sla), gap_before_s=RETRIEVAL_S),
            )
            return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="ttft")
        if kind == "summarization":
            p, o = uniform(rng, 1500, 3000), uniform(rng, 20, 30)
            calls = (call(p, o, model_slot=0, cls=kind, slo=Slo(e2e_ms=sla), gap_before_s=RETRIEVAL_S),)
            return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="e2e")
        if kind == "generation":
            p1, o1 = uniform(rng, 64, 256), uniform(rng, 150, 300)
            p2, o2 = p1 + o1 + 64, uniform(rng, 20, 60)
            b1, b2 = allot(sla, [nominal_e2e_s(p1, o1), nominal_ttft_s(p2)])
            calls = (
                call(p1, o1, model_slot=0, cls=kind, slo=Slo(e2e_ms=b1), gap_before_s=RETRIEVAL_S),
                call(p2, o2, model_slot=1, cls=kind, slo=Slo(ttft_ms=b2), gap_before_s=VALIDATION_GAP_S),
            )
            return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="ttft")
        p1, o1 = uniform(rng, 800, 1500), uniform(rng, 100, 400)
        p2, o2 = p1 + o1, uniform(rng, 20, 40)
        b1, b2 = allot(sla, [nominal_e2e_s(p1, o1), nominal_e2e_s(p2, o2)])
        calls = (
            call(p1, o1, model_slot=0, cls=kind, slo=Slo(e2e_ms=b1), gap_before_s=RETRIEVAL_S),
            call(p2, o2, model_slot=1, cls=kind, slo=Slo(e2e_ms=b2), gap_before_s=VALIDATION_GAP_S),
        )
        return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="e2e")

    def _make_in_session(self, rng: random.Random, index: int, at_s: float, session: _Session) -> TaskSpec:
        """The task `make` draws, its calls' prompts the session's context and the task's own text."""
        plain = self.make(rng, index, at_s)
        first = plain.calls[0]
        own = Span(session.space + "/task", 2 * index, first.prompt_tokens)
        messages = [session.context, Message("user", (own,))]
        prompts = [Prompt(tuple(messages))]
        if len(plain.calls) == 2:
            follow = Span(session.space + "/task", 2 * index + 1, FOLLOW_UP_TOKENS[plain.task_type])
            messages += [Message("assistant", (answer(first.output_tokens),)), Message("user", (follow,))]
            prompts.append(Prompt(tuple(messages)))
        tokens = [p.tokens(first.api) for p in prompts]
        calls = [
            _Call(
                n,
                c.output_tokens,
                model_slot=c.model_slot,
                cls=c.cls,
                slo=c.slo,
                slo_class=c.slo_class,
                gap_before_s=c.gap_before_s,
                prompt=p,
            )
            for n, c, p in zip(tokens, plain.calls, prompts, strict=True)
        ]
        assert plain.task_sla_ms is not None
        sla = plain.task_sla_ms
        if len(calls) == 2:
            c1, c2 = calls
            if plain.sla_metric == "ttft":  # generation: its second call counts to its first token
                tail = nominal_ttft_s(c2.prompt_tokens)
            else:
                tail = nominal_e2e_s(c2.prompt_tokens, c2.output_tokens)
            b1, b2 = allot(sla, [nominal_e2e_s(c1.prompt_tokens, c1.output_tokens), tail])
            calls = [_with_budget(c1, b1, "e2e"), _with_budget(c2, b2, plain.sla_metric)]
        return TaskSpec(
            index, at_s, plain.task_type, tuple(calls), task_sla_ms=sla, sla_metric=plain.sla_metric
        )


def _with_budget(call: _Call, budget_ms: float, metric: str) -> _Call:
    slo = Slo(ttft_ms=budget_ms) if metric == "ttft" else Slo(e2e_ms=budget_ms)
    return dataclasses.replace(call, slo=slo)
