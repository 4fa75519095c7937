"""Token-length samplers shared by the built-in workloads."""

from __future__ import annotations

import math
import random


def uniform(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def lognormal(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    """Log-normal with the given mean (of the distribution itself), clipped to [lo, hi]."""
    mu = math.log(mean) - sigma * sigma / 2.0
    return min(hi, max(lo, round(rng.lognormvariate(mu, sigma))))


# Reference engine used to turn token counts into nominal times when splitting a task SLA over its
# calls (CATO's profiling step). Sized like the `fleet-7b` simulator preset at moderate load.
REF_PREFILL_S_PER_TOKEN = 2.0e-4
REF_PREFILL_FIXED_S = 0.02
REF_DECODE_S_PER_TOKEN = 0.045


def nominal_ttft_s(prompt_tokens: int) -> float:
    return REF_PREFILL_S_PER_TOKEN * prompt_tokens + REF_PREFILL_FIXED_S


def nominal_e2e_s(prompt_tokens: int, output_tokens: int) -> float:
    return nominal_ttft_s(prompt_tokens) + REF_DECODE_S_PER_TOKEN * max(0, output_tokens - 1)
