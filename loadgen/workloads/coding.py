"""``coding``: CATO's coding-assistant tasks (papers/ALGORITHMS.md §1).

| task          | calls (model slot)                  | prompt / output tokens per call    | SLA         |
| ------------- | ----------------------------------- | ---------------------------------- | ----------- |
| completion    | complete (0)                        | U[256, 768] / U[4, 9]              | TTFT 1.2 s  |
| generation    | generate (0), then validate (1)     | U[64, 256] / U[150, 300];          | TTFT 15 s   |
|               |                                     | p1 + o1 + 64 / U[20, 60]           |             |
| summarization | summarize (0)                       | U[1500, 3000] / U[20, 30]          | E2E 4 s     |
| translation   | translate (0), then validate (1)    | U[800, 1500] / U[100, 400];        | E2E 25 s    |
|               |                                     | p1 + o1 / U[20, 40]                |             |

Mixes (select with ``coding:NAME``): ``pattern1`` (default; 40 % completion, 40 % generation, 10 %
translation, 10 % summarization), ``pattern2`` (25 % each), ``ttft-heavy`` (90 % TTFT tasks / 10 % E2E
tasks: 45/45/5/5).

A two-call task's first call goes to model slot 0 and its second to slot 1 (the first and second model
the target lists; the same model when it lists one). Before the first call a task spends 50 ms of
client-side retrieval/analysis, and 20 ms between the calls (validation tooling).

The paper sets each task's SLA to the mean latency measured at moderate load; the values above are sized
for the ``fleet-7b`` simulator preset at speed 1 (scale them with ``--slo-scale``). For a TTFT task the
task latency runs from the task's start to the first token of its last call; for an E2E task, to the end
of its last call. Each call's own SLO is its share of the task SLA, split in proportion to the call's
nominal time (CATO's slack allotment). Every call carries ``x-berth-task-id``, ``x-berth-task-sla-ms``
and its task type as ``x-berth-slo-class`` (the target policy must define those classes:
``policies/coding-assistant.toml`` does); the report class of a call is its task type.
"""

from __future__ import annotations

import functools
import random

from loadgen.workloads.base import CallSpec as _Call
from loadgen.workloads.base import Slo, TaskMix, TaskSpec, allot, pick
from loadgen.workloads.lengths import nominal_e2e_s, nominal_ttft_s, uniform

MIXES: dict[str, dict[str, float]] = {
    "pattern1": {"completion": 0.40, "generation": 0.40, "translation": 0.10, "summarization": 0.10},
    "pattern2": {"completion": 0.25, "generation": 0.25, "translation": 0.25, "summarization": 0.25},
    "ttft-heavy": {"completion": 0.45, "generation": 0.45, "translation": 0.05, "summarization": 0.05},
}
TASK_SLA_MS: dict[str, float] = {
    "completion": 1200.0,
    "generation": 15000.0,
    "summarization": 4000.0,
    "translation": 25000.0,
}
RETRIEVAL_S = 0.05
VALIDATION_GAP_S = 0.02


class CodingWorkload(TaskMix):
    def __init__(self, mix: str = "pattern1") -> None:
        if mix not in MIXES:
            raise ValueError(f"unknown coding mix {mix!r}; known: {', '.join(MIXES)}")
        self.mix = mix
        self.name = f"coding:{mix}"

    def make(self, rng: random.Random, index: int, at_s: float) -> TaskSpec:
        kind = pick(rng, MIXES[self.mix])
        sla = TASK_SLA_MS[kind]
        call = functools.partial(_Call, slo_class=kind)  # every call names its task type as its class
        if kind == "completion":
            p, o = uniform(rng, 256, 768), uniform(rng, 4, 9)
            calls: tuple[_Call, ...] = (
                call(p, o, model_slot=0, cls=kind, slo=Slo(ttft_ms=sla), gap_before_s=RETRIEVAL_S),
            )
            return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="ttft")
        if kind == "summarization":
            p, o = uniform(rng, 1500, 3000), uniform(rng, 20, 30)
            calls = (call(p, o, model_slot=0, cls=kind, slo=Slo(e2e_ms=sla), gap_before_s=RETRIEVAL_S),)
            return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="e2e")
        if kind == "generation":
            p1, o1 = uniform(rng, 64, 256), uniform(rng, 150, 300)
            p2, o2 = p1 + o1 + 64, uniform(rng, 20, 60)
            b1, b2 = allot(sla, [nominal_e2e_s(p1, o1), nominal_ttft_s(p2)])
            calls = (
                call(p1, o1, model_slot=0, cls=kind, slo=Slo(e2e_ms=b1), gap_before_s=RETRIEVAL_S),
                call(p2, o2, model_slot=1, cls=kind, slo=Slo(ttft_ms=b2), gap_before_s=VALIDATION_GAP_S),
            )
            return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="ttft")
        p1, o1 = uniform(rng, 800, 1500), uniform(rng, 100, 400)
        p2, o2 = p1 + o1, uniform(rng, 20, 40)
        b1, b2 = allot(sla, [nominal_e2e_s(p1, o1), nominal_e2e_s(p2, o2)])
        calls = (
            call(p1, o1, model_slot=0, cls=kind, slo=Slo(e2e_ms=b1), gap_before_s=RETRIEVAL_S),
            call(p2, o2, model_slot=1, cls=kind, slo=Slo(e2e_ms=b2), gap_before_s=VALIDATION_GAP_S),
        )
        return TaskSpec(index, at_s, kind, calls, task_sla_ms=sla, sla_metric="e2e")
