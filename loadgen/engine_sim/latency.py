"""The iteration-time model of a simulated engine (Aladdin's performance models).

- prefill iteration: ``t_pre = k1 · Σ l_in + c1`` over the prompts admitted in that iteration
  (batch size itself does not matter);
- decode iteration: ``t_dec = (k2 · l_avg + c2) · b + c3`` for a batch of ``b`` running requests whose
  mean context length (prompt + generated so far) is ``l_avg``.

All coefficients are in seconds (k1, k2 per token). ``scaled(speed)`` divides every term by the speed
factor: ``--speed 10`` runs an engine that is ten times faster in every respect, so the metrics it exports
are the latencies clients observe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatencyModel:
    k1: float  # prefill seconds per prompt token
    c1: float  # prefill fixed seconds per iteration
    k2: float  # decode seconds per (context token x running request)
    c2: float  # decode seconds per running request
    c3: float  # decode fixed seconds per iteration

    def __post_init__(self) -> None:
        for name in ("k1", "c1", "k2", "c2", "c3"):
            if getattr(self, name) < 0:
                raise ValueError(f"latency coefficient {name} must be >= 0")

    def prefill_s(self, total_prompt_tokens: int) -> float:
        return self.k1 * total_prompt_tokens + self.c1

    def decode_s(self, batch: int, avg_context: float) -> float:
        return (self.k2 * avg_context + self.c2) * batch + self.c3

    def prior_toml(self, comment: str = "") -> list[str]:
        """The `[telemetry.prior]` table (lines) that gives berth this model as its performance prior (an
        operator's profiling step, as the simulator benchmarks take it)."""
        head = "[telemetry.prior]" + (f"  # {comment}" if comment else "")
        return [head, *(f"{name} = {getattr(self, name):.6g}" for name in ("k1", "c1", "k2", "c2", "c3"))]

    def scaled(self, speed: float) -> LatencyModel:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        return LatencyModel(
            k1=self.k1 / speed, c1=self.c1 / speed, k2=self.k2 / speed, c2=self.c2 / speed, c3=self.c3 / speed
        )
