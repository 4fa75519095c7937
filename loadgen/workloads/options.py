"""The options a workload takes besides its ``NAME[:VARIANT]`` (``berth-loadgen run|sim|workload-stats``).

Every field is None when not given: the workload then does what it did without the option. A workload
states which options it takes; an option given to a workload that does not take it is an error, so a
mistyped run does not quietly measure something else.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    time_scale: float | None = None  # traces: arrival offsets are multiplied by this (2: half the rate)
    slo_ttft_ms: float | None = None  # every request's TTFT target, sent as x-berth-ttft-ms
    slo_itl_ms: float | None = None  # every request's ATGT target, sent as x-berth-itl-ms
    sessions: int | None = None  # coding: developer sessions (repository contexts); chat: conversations
    context_tokens: tuple[int, int] | None = None  # coding: a session's repository context, uniform
    turns: tuple[int, int] | None = None  # chat: turns per conversation, uniform
    think_time_s: float | None = None  # chat: mean think time between an answer and the next turn
    apps: int | None = None  # chat: applications, each with its own system prompt
    system_tokens: tuple[int, int] | None = None  # chat: an application's system prompt, uniform

    def given(self) -> frozenset[str]:
        """The names of the options that were given."""
        return frozenset(f.name for f in fields(self) if getattr(self, f.name) is not None)

    def to_dict(self) -> dict[str, object]:
        """The options given, by name (for a report)."""
        return {name: getattr(self, name) for name in sorted(self.given())}

    def check(self) -> None:
        """Raise ValueError naming the flag of the first option out of range."""
        for name in ("time_scale", "slo_ttft_ms", "slo_itl_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{FLAGS[name]} must be > 0, got {value}")
        for name in ("sessions", "apps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{FLAGS[name]} must be >= 1, got {value}")
        if self.think_time_s is not None and self.think_time_s < 0:
            raise ValueError(f"--think-time must be >= 0, got {self.think_time_s}")
        for name in ("context_tokens", "turns", "system_tokens"):
            span = getattr(self, name)
            if span is not None and not 1 <= span[0] <= span[1]:
                raise ValueError(f"{FLAGS[name]} must be LO[:HI] with 1 <= LO <= HI, got {span}")


#: The command-line flag of each option.
FLAGS: Final[dict[str, str]] = {
    "time_scale": "--time-scale",
    "slo_ttft_ms": "--slo-ttft-ms",
    "slo_itl_ms": "--slo-itl-ms",
    "sessions": "--sessions",
    "context_tokens": "--context-tokens",
    "turns": "--turns",
    "think_time_s": "--think-time",
    "apps": "--apps",
    "system_tokens": "--system-tokens",
}


def parse_range(text: str) -> tuple[int, int]:
    """``LO:HI`` or ``N`` (``N:N``) as two integers."""
    lo, sep, hi = text.partition(":")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise ValueError(f"expected LO:HI or N (integers), got {text!r}") from None
    return a, b
