"""The vocabulary of workloads: an SLO, one LLM call (`CallSpec`), one task of sequential calls
(`TaskSpec`), and the `Workload` protocol that turns an arrival process into a schedule of tasks.

A call names its model by *slot*: the runner maps slot ``k`` to the ``k``-th model the target lists at
``/v1/models`` (wrapping around when it lists fewer), or to ``--models a,b,...`` when given; a trace may
instead name a model literally.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from loadgen.workloads.prompt import ApiName, Prompt, plain_prompt

SlaMetric = Literal["ttft", "e2e"]


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request targets in ms (None: no target). ``atgt_ms`` bounds the average token generation
    time, i.e. (last token − first token) / (tokens − 1)."""

    ttft_ms: float | None = None
    atgt_ms: float | None = None
    e2e_ms: float | None = None

    def met(self, ttft_ms: float | None, atgt_ms: float | None, e2e_ms: float | None) -> bool:
        if self.ttft_ms is not None and (ttft_ms is None or ttft_ms > self.ttft_ms):
            return False
        if self.atgt_ms is not None and atgt_ms is not None and atgt_ms > self.atgt_ms:
            return False
        return not (self.e2e_ms is not None and (e2e_ms is None or e2e_ms > self.e2e_ms))

    def scaled(self, factor: float) -> Slo:
        if factor == 1.0:
            return self
        return Slo(
            None if self.ttft_ms is None else self.ttft_ms * factor,
            None if self.atgt_ms is None else self.atgt_ms * factor,
            None if self.e2e_ms is None else self.e2e_ms * factor,
        )

    def to_dict(self) -> dict[str, float | None]:
        return {"ttft_ms": self.ttft_ms, "atgt_ms": self.atgt_ms, "e2e_ms": self.e2e_ms}


@dataclass(frozen=True, slots=True)
class CallSpec:
    prompt_tokens: int
    output_tokens: int
    model_slot: int = 0
    model: str | None = None  # a literal model name (trace replay) wins over the slot
    api: ApiName = "chat"
    cls: str = "default"  # the report class of this request
    slo: Slo = field(default_factory=Slo)
    slo_class: str | None = None  # sent as x-berth-slo-class
    priority: int | None = None
    gap_before_s: float = 0.0  # client-side work before the call (retrieval, analysis, validation)
    # What the prompt says (spans that other calls may share); None: text of its own (`plain_prompt`).
    # Its `tokens(api)` is `prompt_tokens`.
    prompt: Prompt | None = None
    slo_headers: bool = False  # send the SLO as x-berth-ttft-ms / -itl-ms / -deadline-ms in any case


def call_prompt(call: CallSpec, salt: int) -> Prompt:
    """What the call sends: its workload's prompt, or text of its own named by `salt` (`call_salt`)."""
    return call.prompt if call.prompt is not None else plain_prompt(call.prompt_tokens, call.api, salt)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    index: int
    at_s: float  # arrival offset from the start of the run
    task_type: str
    calls: tuple[CallSpec, ...]
    task_sla_ms: float | None = None
    sla_metric: SlaMetric = "e2e"  # ttft: time to the first token of the last call; e2e: to its end
    task_id: str | None = None  # sent as x-berth-task-id when the task has an SLA or several calls

    @property
    def multi_step(self) -> bool:
        return len(self.calls) > 1


class Workload(Protocol):
    name: str

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        """The tasks of a run, sorted by ``at_s``. `arrivals(rate, duration_s)` draws arrival offsets."""
        ...


class TaskMix:
    """A workload drawn task by task: `make` builds one task for an arrival (subclasses define it)."""

    name = "mix"

    def make(self, rng: random.Random, index: int, at_s: float) -> TaskSpec:
        raise NotImplementedError

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        return [self.make(rng, i, at) for i, at in enumerate(arrivals(rate, duration_s))]


def pick(rng: random.Random, weights: dict[str, float]) -> str:
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def allot(sla_ms: float, nominal_s: list[float]) -> list[float]:
    """CATO's slack rule: each node gets a share of the task SLA proportional to its nominal time
    (nodes of 5 s, 15 s, 5 s under a 50 s SLA get 10 s, 30 s, 10 s)."""
    total = sum(nominal_s)
    if total <= 0:
        return [sla_ms / len(nominal_s)] * len(nominal_s)
    return [sla_ms * t / total for t in nominal_s]
