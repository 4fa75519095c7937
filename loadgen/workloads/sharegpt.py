"""``sharegpt-like``: synthetic chat traffic shaped like ShareGPT conversations.

Lengths follow the ShareGPT statistics reported in the vLLM paper (mean prompt 161 tokens, mean output
338 tokens, long right tails): prompt ~ log-normal(mean 161, sigma 1.0) clipped to [4, 2048], output ~
log-normal(mean 338, sigma 0.9) clipped to [4, 1024]. One chat call per request, model slot 0, report
class ``default``, SLO TTFT 2 s and ATGT 100 ms.

Variants keep the lengths and set the per-request SLOs of Aladdin's evaluation on A100s (papers/
ALGORITHMS.md §2), which pair with the engine simulator's ``a100-llama2-*`` profiles:

| variant      | TTFT    | ATGT  | profile          |
| ------------ | ------- | ----- | ---------------- |
| aladdin-7b   |  400 ms | 15 ms | a100-llama2-7b   |
| aladdin-13b  |  600 ms | 30 ms | a100-llama2-13b  |
| aladdin-70b  | 1600 ms | 75 ms | a100-llama2-70b  |

A client sends them to berth with ``--slo-headers`` (``x-berth-ttft-ms`` / ``x-berth-itl-ms``).
"""

from __future__ import annotations

import random
from typing import Final

from loadgen.workloads.base import CallSpec, Slo, TaskMix, TaskSpec
from loadgen.workloads.lengths import lognormal

PROMPT_MEAN, PROMPT_SIGMA, PROMPT_RANGE = 161.0, 1.0, (4, 2048)
OUTPUT_MEAN, OUTPUT_SIGMA, OUTPUT_RANGE = 338.0, 0.9, (4, 1024)
SLO = Slo(ttft_ms=2000.0, atgt_ms=100.0)
#: Aladdin's per-request SLOs on A100s, by variant.
ALADDIN_SLOS: Final[dict[str, Slo]] = {
    "aladdin-7b": Slo(ttft_ms=400.0, atgt_ms=15.0),
    "aladdin-13b": Slo(ttft_ms=600.0, atgt_ms=30.0),
    "aladdin-70b": Slo(ttft_ms=1600.0, atgt_ms=75.0),
}


def sharegpt_prompt(rng: random.Random) -> int:
    return lognormal(rng, PROMPT_MEAN, PROMPT_SIGMA, *PROMPT_RANGE)


def sharegpt_output(rng: random.Random) -> int:
    return lognormal(rng, OUTPUT_MEAN, OUTPUT_SIGMA, *OUTPUT_RANGE)


class ShareGptWorkload(TaskMix):
    def __init__(self, variant: str | None = None) -> None:
        if variant is None:
            self.slo = SLO
            self.name = "sharegpt-like"
        elif variant in ALADDIN_SLOS:
            self.slo = ALADDIN_SLOS[variant]
            self.name = f"sharegpt-like:{variant}"
        else:
            known = ", ".join(ALADDIN_SLOS)
            raise ValueError(f"unknown sharegpt-like variant {variant!r}; known: {known}")

    def make(self, rng: random.Random, index: int, at_s: float) -> TaskSpec:
        call = CallSpec(sharegpt_prompt(rng), sharegpt_output(rng), cls="default", slo=self.slo)
        return TaskSpec(index, at_s, "chat", (call,))
