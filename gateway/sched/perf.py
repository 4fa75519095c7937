"""An endpoint's performance model as plain coefficients, and the prior used until one is fitted.

The models (Aladdin, MaaSO), in seconds and tokens:

| dimension  | model                                                  | coefficients |
| ---------- | ------------------------------------------------------ | ------------ |
| prefill    | ``t_pre = k1 · Σ prompt tokens of the iteration + c1`` | k1, c1       |
| decode     | ``t_dec = (k2 · avg_context + c2) · batch + c3``       | k2, c2, c3   |
| KV cache   | ``kv tokens of a request = h · context tokens + j``    | h, j         |
| throughput | ``per-request decode tokens/s = thr1 − α·ln(1 + β·n)`` | thr1, α, β   |

The scheduler core predicts from these (`gateway.sched.predict`); telemetry fits them online
(`gateway.telemetry.perfmodel`) and hands them in through `EndpointEstimates`. They live here, beside
their consumers, so that the core depends on nothing but `gateway.core`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PerfCoefficients:
    k1: float  # prefill seconds per prompt token (summed over the prefill batch)
    c1: float  # prefill seconds per iteration
    k2: float  # decode seconds per (context token x running request)
    c2: float  # decode seconds per running request
    c3: float  # decode seconds per iteration
    h: float  # KV tokens per context token
    j: float  # KV tokens per request on top of its context
    thr1: float  # MaaSO: per-request decode tokens/s as concurrency -> 0
    alpha: float
    beta: float
    prefill_mape: float | None = None
    decode_mape: float | None = None
    kv_mape: float | None = None
    n_prefill: int = 0
    n_decode: int = 0
    n_kv: int = 0
    n_throughput: int = 0  # observations the throughput curve was fitted on (0: the prior's curve)

    def prefill_s(self, prompt_tokens: float) -> float:
        """Seconds of one prefill iteration over `prompt_tokens` prompt tokens in total."""
        return self.k1 * prompt_tokens + self.c1

    def decode_iter_s(self, batch: float, avg_context: float) -> float:
        """Seconds of one decode iteration of `batch` requests whose mean context is `avg_context`."""
        return (self.k2 * avg_context + self.c2) * batch + self.c3

    def kv_tokens(self, context_tokens: float) -> float:
        """KV-cache tokens one request holds at `context_tokens` (prompt + generated)."""
        return self.h * context_tokens + self.j

    def per_request_tps(self, concurrency: float) -> float:
        """Decode tokens/s one request gets when `concurrency` requests run (never negative)."""
        return max(0.0, self.thr1 - self.alpha * math.log1p(self.beta * max(0.0, concurrency)))


def default_prior() -> PerfCoefficients:
    """A generic prior: Llama-2 7B on one A100-80GB (Aladdin's SLOs of 400 ms prefill / 15 ms decode;
    the same figures as the simulator's ``a100-llama2-7b`` preset).

    - prefill 0.10 ms per prompt token + 15 ms per iteration (a 4k-token prompt in ~425 ms);
    - decode (0.38 us x context + 0.15 ms) per request + 11 ms per iteration (11 ms alone, ~22 ms for
      32 requests at 500 tokens of context);
    - KV: one slot per context token plus half a 16-token paged block of rounding per request;
    - throughput: the decode model's per-request rate 1 / t_dec(n, 500) fitted by the MaaSO curve for
      n = 1..64 (88 tokens/s alone, 46 at 32; 0.7 % error).
    """
    return PerfCoefficients(
        k1=1.0e-4,
        c1=0.015,
        k2=3.8e-7,
        c2=1.5e-4,
        c3=0.011,
        h=1.0,
        j=8.0,
        thr1=95.1,
        alpha=25.75,
        beta=0.179,
    )
