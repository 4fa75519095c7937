"""``chat-batch``: Chiron's interactive chat plus a batch queue (papers/ALGORITHMS.md §5).

Both classes use ShareGPT-like lengths (see `sharegpt`) and send ``x-berth-slo-class``:

| class       | share of the rate | SLO (Chiron)               |
| ----------- | ----------------- | -------------------------- |
| interactive | 70 %              | TTFT 10 s, ATGT 200 ms     |
| batch       | 30 %              | TTFT 3 600 s, ATGT 2 s     |

Patterns (``chat-batch:NAME``): ``mixed`` (default; both classes arrive by the arrival process at 70 %
and 30 % of the rate) and ``queue`` (the batch requests of the whole run, rate × duration × 30 %, are
all submitted at t = 0, as a queued batch job; interactive traffic arrives as in ``mixed``).

``chat-backlog[:N]`` is Chiron's evaluation setting: interactive chat arrives by the arrival process at
the whole rate, and a backlog of N batch requests (default 2000) is queued at t = 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.sharegpt import sharegpt_output, sharegpt_prompt

INTERACTIVE_SHARE = 0.7
INTERACTIVE_SLO = Slo(ttft_ms=10_000.0, atgt_ms=200.0)
BATCH_SLO = Slo(ttft_ms=3_600_000.0, atgt_ms=2_000.0)
PATTERNS = ("mixed", "queue")


class ChatBatchWorkload:
    def __init__(self, pattern: str = "mixed") -> None:
        if pattern not in PATTERNS:
            raise ValueError(f"unknown chat-batch pattern {pattern!r}; known: {', '.join(PATTERNS)}")
        self.pattern = pattern
        self.name = f"chat-batch:{pattern}"

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        inter = arrivals(rate * INTERACTIVE_SHARE, duration_s)
        if self.pattern == "queue":
            batch = [0.0] * round(rate * duration_s * (1 - INTERACTIVE_SHARE))
        else:
            batch = arrivals(rate * (1 - INTERACTIVE_SHARE), duration_s)
        tagged = sorted([(t, "interactive") for t in inter] + [(t, "batch") for t in batch])
        return _tasks(tagged, rng)


DEFAULT_BACKLOG = 2000


class ChatBacklogWorkload:
    """Interactive chat at the whole rate plus `backlog` batch requests queued at t = 0 (Chiron)."""

    def __init__(self, backlog: str | None = None) -> None:
        try:
            n = DEFAULT_BACKLOG if backlog is None else int(backlog)
        except ValueError:
            raise ValueError(f"chat-backlog: the variant is the backlog size, got {backlog!r}") from None
        if n < 0:
            raise ValueError("chat-backlog: the backlog size must be >= 0")
        self.backlog = n
        self.name = f"chat-backlog:{n}"

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        tagged = [(0.0, "batch")] * self.backlog + [(t, "interactive") for t in arrivals(rate, duration_s)]
        tagged.sort(key=lambda x: x[0])
        return _tasks(tagged, rng)


def _tasks(tagged: list[tuple[float, str]], rng: random.Random) -> list[TaskSpec]:
    """One chat call per (arrival, class), in order, with its class's SLO and ShareGPT-like lengths."""
    tasks: list[TaskSpec] = []
    for i, (at, cls) in enumerate(tagged):
        slo = INTERACTIVE_SLO if cls == "interactive" else BATCH_SLO
        call = CallSpec(sharegpt_prompt(rng), sharegpt_output(rng), cls=cls, slo=slo, slo_class=cls)
        tasks.append(TaskSpec(i, at, cls, (call,)))
    return tasks
