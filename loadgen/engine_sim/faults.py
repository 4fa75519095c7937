"""Fault injection for a simulated endpoint: set at start (CLI flags / fleet file / `EndpointSpec`)
and at run time (``POST /sim/faults`` with a JSON object of the fields to change, ``{"reset": true}`` to
clear them all first; ``GET /sim/state`` shows the current ones).

| field                | effect                                                                              |
| -------------------- | ----------------------------------------------------------------------------------- |
| `fail_fraction`      | this fraction of completion requests is answered 500 (OpenAI error shape)           |
| `die_after_tokens`   | after N more generated tokens the endpoint dies: a standalone simulator exits the   |
|                      | process; an in-process fleet endpoint aborts its connections and stops listening    |
| `stall_after_tokens` | streams started while set stop sending after N tokens, keeping the connection open  |
| `stall_fraction`     | the share of new streams that stall (default all)                                   |
| `metrics_delay_s`    | `/metrics` answers only after this many seconds                                     |
| `metrics_garbage`    | `/metrics` answers 200 with text that is not the Prometheus exposition format      |
| `health_503`         | `/health` answers 503                                                               |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Faults:
    fail_fraction: float = 0.0
    die_after_tokens: int | None = None
    stall_after_tokens: int | None = None
    stall_fraction: float = 1.0
    metrics_delay_s: float = 0.0
    metrics_garbage: bool = False
    health_503: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.fail_fraction <= 1.0:
            raise ValueError("fail_fraction must be within [0, 1]")
        if not 0.0 <= self.stall_fraction <= 1.0:
            raise ValueError("stall_fraction must be within [0, 1]")
        if self.die_after_tokens is not None and self.die_after_tokens < 0:
            raise ValueError("die_after_tokens must be >= 0")
        if self.stall_after_tokens is not None and self.stall_after_tokens < 0:
            raise ValueError("stall_after_tokens must be >= 0")
        if self.metrics_delay_s < 0:
            raise ValueError("metrics_delay_s must be >= 0")

    def patched(self, patch: Mapping[str, Any]) -> Faults:
        """A copy with the fields in `patch` changed; unknown keys and wrong types raise ValueError."""
        base = Faults() if patch.get("reset") else self
        changes: dict[str, Any] = {}
        for key, value in patch.items():
            if key == "reset":
                continue
            if key not in _TYPES:
                raise ValueError(f"unknown fault {key!r}; known: {', '.join(sorted(_TYPES))}")
            changes[key] = _coerce(key, value)
        return dataclasses.replace(base, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def any(self) -> bool:
        return self != Faults()


_TYPES: dict[str, str] = {
    "fail_fraction": "float",
    "die_after_tokens": "int?",
    "stall_after_tokens": "int?",
    "stall_fraction": "float",
    "metrics_delay_s": "float",
    "metrics_garbage": "bool",
    "health_503": "bool",
}


def _coerce(key: str, value: Any) -> Any:
    kind = _TYPES[key]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"fault {key!r} must be true or false")
        return value
    if kind == "int?":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"fault {key!r} must be an integer or null")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"fault {key!r} must be a number")
    return float(value)
