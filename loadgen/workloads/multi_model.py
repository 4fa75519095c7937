"""``multi-model``: CACE's many-models workload (papers/ALGORITHMS.md §3).

Sixteen models: a small *completion* model and a large *reasoning* model for each of eight languages.
Model slots 0-7 are the completion models and 8-15 the reasoning models, in the language order
python, java, cpp, javascript, go, rust, c, csharp (so list the target's 16 models in that order, or
map them with ``--models``; with fewer models the slots wrap around).

| kind       | prompt / output tokens | SLO                        | header                         |
| ---------- | ---------------------- | -------------------------- | ------------------------------ |
| completion | U[200, 600] / U[8, 16] | TTFT 1 000 ms              | ``x-berth-slo-class: interactive`` |
| reasoning  | U[300, 1000] / U[150, 400] | TTFT 5 s, E2E 30 s     | none (the policy's default)    |

Patterns (``multi-model:NAME``): ``uniform`` (default; 50/50 completion/reasoning, languages uniform),
``ide-heavy`` (70/30, languages uniform), ``popularity-skewed`` (70/30; Java, Python, C++ and JavaScript
20 % each, Go, Rust, C and C# share the remaining 20 %). Each request is a one-call task whose type is
its kind; the report class is also its kind.
"""

from __future__ import annotations

import random

from loadgen.workloads.base import CallSpec, Slo, TaskMix, TaskSpec, pick
from loadgen.workloads.lengths import uniform

LANGUAGES: tuple[str, ...] = ("python", "java", "cpp", "javascript", "go", "rust", "c", "csharp")
_UNIFORM_LANG = dict.fromkeys(LANGUAGES, 1.0)
_SKEWED_LANG = {
    "java": 0.2,
    "python": 0.2,
    "cpp": 0.2,
    "javascript": 0.2,
    "go": 0.05,
    "rust": 0.05,
    "c": 0.05,
    "csharp": 0.05,
}
PATTERNS: dict[str, tuple[float, dict[str, float]]] = {
    "uniform": (0.5, _UNIFORM_LANG),
    "ide-heavy": (0.7, _UNIFORM_LANG),
    "popularity-skewed": (0.7, _SKEWED_LANG),
}
COMPLETION_SLO = Slo(ttft_ms=1000.0)
REASONING_SLO = Slo(ttft_ms=5000.0, e2e_ms=30000.0)


class MultiModelWorkload(TaskMix):
    def __init__(self, pattern: str = "uniform") -> None:
        if pattern not in PATTERNS:
            raise ValueError(f"unknown multi-model pattern {pattern!r}; known: {', '.join(PATTERNS)}")
        self.pattern = pattern
        self.name = f"multi-model:{pattern}"

    def make(self, rng: random.Random, index: int, at_s: float) -> TaskSpec:
        p_completion, lang_weights = PATTERNS[self.pattern]
        lang = LANGUAGES.index(pick(rng, lang_weights))
        if rng.random() < p_completion:
            call = CallSpec(
                uniform(rng, 200, 600),
                uniform(rng, 8, 16),
                model_slot=lang,
                cls="completion",
                slo=COMPLETION_SLO,
                slo_class="interactive",
            )
            return TaskSpec(index, at_s, "completion", (call,))
        call = CallSpec(
            uniform(rng, 300, 1000),
            uniform(rng, 150, 400),
            model_slot=8 + lang,
            cls="reasoning",
            slo=REASONING_SLO,
        )
        return TaskSpec(index, at_s, "reasoning", (call,))
