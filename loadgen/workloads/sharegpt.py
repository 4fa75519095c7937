"""``sharegpt-like``: synthetic chat traffic shaped like ShareGPT conversations.

Lengths follow the ShareGPT statistics reported in the vLLM paper (mean prompt 161 tokens, mean output
338 tokens, long right tails): prompt ~ log-normal(mean 161, sigma 1.0) clipped to [4, 2048], output ~
log-normal(mean 338, sigma 0.9) clipped to [4, 1024]. One chat call per request, model slot 0, report
class ``default``, SLO TTFT 2 s and ATGT 100 ms.
"""

from __future__ import annotations

import random

from loadgen.workloads.base import CallSpec, Slo, TaskMix, TaskSpec
from loadgen.workloads.lengths import lognormal

PROMPT_MEAN, PROMPT_SIGMA, PROMPT_RANGE = 161.0, 1.0, (4, 2048)
OUTPUT_MEAN, OUTPUT_SIGMA, OUTPUT_RANGE = 338.0, 0.9, (4, 1024)
SLO = Slo(ttft_ms=2000.0, atgt_ms=100.0)


def sharegpt_prompt(rng: random.Random) -> int:
    return lognormal(rng, PROMPT_MEAN, PROMPT_SIGMA, *PROMPT_RANGE)


def sharegpt_output(rng: random.Random) -> int:
    return lognormal(rng, OUTPUT_MEAN, OUTPUT_SIGMA, *OUTPUT_RANGE)


class ShareGptWorkload(TaskMix):
    name = "sharegpt-like"

    def make(self, rng: random.Random, index: int, at_s: float) -> TaskSpec:
        call = CallSpec(sharegpt_prompt(rng), sharegpt_output(rng), cls="default", slo=SLO)
        return TaskSpec(index, at_s, "chat", (call,))
