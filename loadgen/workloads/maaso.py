"""``maaso[:T_SLOT_MS]``: MaaSO's mixed SLO tightness (papers/ALGORITHMS.md §4).

One completion call per arrival: a prompt of 100-400 tokens, a decode length of 300-1000 tokens
(uniform; the engine produces exactly that many), and an end-to-end deadline of ``factor × decode
length × t_slot`` with the deadline factor uniform in [0.8, 1.5]; `t_slot` (ms, default 91.1: the
simulator's `a100-llama2-7b` profile at a quarter of its speed, a full batch of 32 at 575 tokens of
context) is MaaSO's time slot, the single-token decode time of a plain one-device instance serving.
Tight factors need smaller batches than that; relaxed ones leave room for queueing or larger batches.
The report classes are `tight` (factor < 1.1) and `relaxed`.
Gamma arrivals with a rising coefficient of variation are the burstiness of MaaSO's traces
(`--arrival gamma --cv X`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from loadgen.workloads.base import CallSpec, Slo, TaskSpec

DEFAULT_T_SLOT_MS: Final = 91.1
FACTORS: Final = (0.8, 1.5)
DECODE: Final = (300, 1000)
PROMPT: Final = (100, 400)
TIGHT_BELOW: Final = 1.1


class MaasoWorkload:
    def __init__(self, t_slot_ms: str | None = None) -> None:
        try:
            t = DEFAULT_T_SLOT_MS if t_slot_ms is None else float(t_slot_ms)
        except ValueError:
            raise ValueError(f"maaso: the variant is t_slot in ms, got {t_slot_ms!r}") from None
        if not t > 0:
            raise ValueError("maaso: t_slot must be > 0 ms")
        self.t_slot_ms = t
        self.name = f"maaso:{t:g}"

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        tasks = []
        for i, at in enumerate(arrivals(rate, duration_s)):
            factor = rng.uniform(*FACTORS)
            decode = rng.randint(*DECODE)
            call = CallSpec(
                prompt_tokens=rng.randint(*PROMPT),
                output_tokens=decode,
                api="completion",
                cls="tight" if factor < TIGHT_BELOW else "relaxed",
                slo=Slo(e2e_ms=factor * decode * self.t_slot_ms),
            )
            tasks.append(TaskSpec(i, at, "maaso", (call,)))
        return tasks
